"""The controller's only door to the Kubernetes API (the one module importing ``kubernetes``).

It speaks plain JSON dicts (the API's own camelCase), which ``controller.core.pod_facts``
reads as is, so nothing is deserialized into client model classes on the hot path. Every
call has a timeout; every watch has ``timeoutSeconds`` and a read timeout a little longer,
so a silent stream ends instead of hanging.

Errors are translated here, once:

    HTTP 410                      -> ResourceExpired   (list again)
    HTTP 429, 5xx, timeouts,
    connection and TLS failures   -> ApiUnavailable    (a KubeError and a RetryLater)
    any other non-2xx             -> KubeError naming the call, the status and the API's message

    KubeClient     list/watch/create/delete/patch pods; list/watch namespaces; this node; Events, Leases
    WatchEvent     one parsed line of a watch stream

The pod cache built on the watch is ``controller.io.pod_cache``; the Lease elector is
``controller.io.lease``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal
from urllib.parse import quote

import kubernetes
import urllib3

from controller.core.pod_facts import PodRef
from controller.errors import ApiUnavailable, KubeError, ResourceExpired
from controller.io import node_status

COMPONENT = "gpushare"
# Pods per LIST page. At the largest object the API server stores (~1.5 MB) a page is ~40 MB of
# JSON, and the page and its parse are what a LIST holds at once, well under the agent's memory
# limit; at a typical pod's few kB, 10,000 pending pods are 400 round trips of a few ms.
LIST_PAGE = 25
_STREAM_CHUNK = 64 * 1024


def _format_time(t: datetime) -> str:
    """Kubernetes Time (an Event's timestamps): RFC 3339 in whole seconds, UTC."""
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class WatchEvent:
    type: Literal["ADDED", "MODIFIED", "DELETED", "BOOKMARK"]
    obj: Mapping[str, Any]


def _api_message(body: bytes) -> str:
    try:
        doc = json.loads(body)
    except ValueError:
        return body[:200].decode("utf-8", "replace")
    if isinstance(doc, dict) and isinstance(doc.get("message"), str):
        return str(doc["message"])
    return body[:200].decode("utf-8", "replace")


class KubeClient:
    """Plain-JSON calls with explicit timeouts. Thread-safe: the underlying pool is."""

    def __init__(self, api_client: Any, *, timeout_s: float = 10.0, watch_timeout_s: int = 60) -> None:
        self._api = api_client
        self.timeout_s = timeout_s
        self.watch_timeout_s = watch_timeout_s
        self.host = str(api_client.configuration.host)

    @classmethod
    def from_kubeconfig(cls, path: str | None = None, *, context: str | None = None, **kw: Any) -> KubeClient:
        """``path`` None: the in-cluster service account (the DaemonSet); ``context``: as kubectl's --context."""
        try:
            if path is None:
                kubernetes.config.load_incluster_config()  # type: ignore[no-untyped-call]
                api = kubernetes.client.ApiClient()
            else:
                api = kubernetes.config.new_client_from_config(  # type: ignore[no-untyped-call]
                    config_file=path, context=context
                )
        except (kubernetes.config.ConfigException, OSError, ValueError) as exc:
            where = path or "the in-cluster service account"
            raise KubeError(f"gpushare: cannot load Kubernetes credentials from {where} ({exc})") from exc
        return cls(api, **kw)

    def close(self) -> None:
        self._api.close()

    def __enter__(self) -> KubeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the one raw call -----------------------------------------------------------------------------------

    def _call(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | tuple[float, float] | None = None,
        ok: tuple[int, ...] = (),
    ) -> tuple[int, Any]:
        """Send one request; return (status, parsed body) for 2xx or a status listed in ``ok``."""
        what = f"{method} {path}"
        headers = {"Accept": "application/json", "Content-Type": content_type}
        try:
            request = self._api.param_serialize(
                method=method,
                resource_path=path,
                query_params=[(k, v) for k, v in (query or {}).items() if v is not None],
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
            )
            response = self._api.call_api(*request, _request_timeout=timeout or self.timeout_s)
            data = response.read()
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ApiUnavailable(
                f"gpushare: the API server at {self.host} did not answer {what} ({exc}); retrying"
            ) from exc
        status = int(response.status)
        if not (200 <= status < 300 or status in ok):
            raise _translate(status, what, data, response.getheader("Retry-After"))
        try:
            return status, json.loads(data) if data else None
        except ValueError as exc:  # a proxy's HTML page, a truncated body
            raise ApiUnavailable(f"gpushare: {what} answered {status} with a body that is not JSON ({exc})") from exc

    # -- pods -------------------------------------------------------------------------------------------------

    @staticmethod
    def _pods_path(namespace: str | None) -> str:
        return f"/api/v1/namespaces/{quote(namespace, safe='')}/pods" if namespace else "/api/v1/pods"

    def list_pods(
        self,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        each: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> tuple[list[dict[str, Any]], str]:
        """All matching pods and the list's resourceVersion (to start a watch from).

        Read ``LIST_PAGE`` pods at a time, each passed through ``each`` (a cache's trim) as its
        page arrives: a list of pods as large as tenants can make them never sits in memory whole.
        """
        query: dict[str, Any] = {"labelSelector": label_selector, "fieldSelector": field_selector, "limit": LIST_PAGE}
        items: list[dict[str, Any]] = []
        while True:
            _, doc = self._call("GET", self._pods_path(namespace), query=query)
            page = doc.get("items") or []
            items.extend(page if each is None else map(each, page))
            meta = doc.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                return items, str(meta.get("resourceVersion", ""))
            # Every page is served from the first page's snapshot; its token expires after a few minutes.
            query = {**query, "continue": token}

    def watch_pods(
        self,
        resource_version: str,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_s: int | None = None,
    ) -> Iterator[WatchEvent]:
        """One watch call: ends after ``timeoutSeconds`` at the latest, or raises."""
        selectors = {"labelSelector": label_selector, "fieldSelector": field_selector}
        return self._watch(self._pods_path(namespace), resource_version, selectors, timeout_s)

    def _watch(
        self, path: str, resource_version: str, selectors: Mapping[str, str | None], timeout_s: int | None
    ) -> Iterator[WatchEvent]:
        """One watch of the collection at ``path``.

        The read timeout is the watch timeout plus a margin, so a connection that goes silent
        (no event, no bookmark, no close) raises ``ApiUnavailable`` instead of hanging.
        """
        server_s = timeout_s or self.watch_timeout_s
        query = {
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": server_s,
            **selectors,
        }
        what = f"WATCH {path}"
        try:
            request = self._api.param_serialize(
                method="GET",
                resource_path=path,
                query_params=[(k, v) for k, v in query.items() if v is not None],
                header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"],
            )
            response = self._api.call_api(*request, _request_timeout=(self.timeout_s, server_s + 15.0))
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ApiUnavailable(f"gpushare: {what} at {self.host} failed to start ({exc})") from exc
        raw = response.response
        try:
            if not 200 <= int(response.status) < 300:
                raise _translate(int(response.status), what, response.read(), response.getheader("Retry-After"))
            yield from self._events(raw, what)
        finally:
            # Closed, not returned to the pool: an abandoned watch still has unread bytes.
            raw.close()
            raw.release_conn()

    def _events(self, raw: Any, what: str) -> Iterator[WatchEvent]:
        buffer = b""
        try:
            for chunk in raw.stream(_STREAM_CHUNK, decode_content=True):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        yield _watch_event(line, what)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ApiUnavailable(f"gpushare: {what} at {self.host} broke off ({exc}); listing again") from exc
        if buffer.strip():
            yield _watch_event(buffer, what)

    def create_pod(self, manifest: Mapping[str, Any]) -> dict[str, Any] | None:
        """Create: the pod as the API server stored it, or None when a pod of that name already
        exists (a repeated create is not an error)."""
        ns = manifest["metadata"]["namespace"]
        status, doc = self._call("POST", self._pods_path(ns), body=dict(manifest), ok=(409,))
        if status == 409:
            return None
        return doc if isinstance(doc, dict) else {}

    def delete_pod(self, ref: PodRef, *, grace_period_s: int | None = None) -> bool:
        """Delete exactly this pod (uid precondition); False if it is gone or the name has a new uid."""
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": ref.uid}}
        if grace_period_s is not None:
            body["gracePeriodSeconds"] = grace_period_s
        path = f"{self._pods_path(ref.namespace)}/{quote(ref.name, safe='')}"
        status, _ = self._call("DELETE", path, body=body, ok=(404, 409))
        return status not in (404, 409)

    def patch_pod_annotations(self, ref: PodRef, annotations: Mapping[str, str | None]) -> bool:
        """Merge-patch annotations (None removes one); uid-checked; False if the pod is gone."""
        body = {"metadata": {"uid": ref.uid, "annotations": dict(annotations)}}
        path = f"{self._pods_path(ref.namespace)}/{quote(ref.name, safe='')}"
        ctype = "application/merge-patch+json"
        status, doc = self._call("PATCH", path, body=body, content_type=ctype, ok=(404, 409, 422))
        if status == 422:
            # A uid in the patch that differs from the pod's is refused as "metadata.uid ... immutable":
            # the name now belongs to another pod. Any other 422 is a real refusal.
            message = str((doc or {}).get("message", ""))
            if "metadata.uid" not in message:
                raise KubeError(f"gpushare: PATCH {path} was refused with 422: {message}")
        return status == 200

    def list_namespaces(self, *, label_selector: str | None = None) -> tuple[list[dict[str, Any]], str]:
        """All matching namespaces and the list's resourceVersion (to start a watch from)."""
        _, doc = self._call("GET", "/api/v1/namespaces", query={"labelSelector": label_selector})
        return list(doc.get("items") or []), str(doc["metadata"].get("resourceVersion", ""))

    def watch_namespaces(
        self, resource_version: str, *, label_selector: str | None = None, timeout_s: int | None = None
    ) -> Iterator[WatchEvent]:
        """One watch of namespaces; one that stops matching ``label_selector`` arrives as DELETED."""
        return self._watch("/api/v1/namespaces", resource_version, {"labelSelector": label_selector}, timeout_s)

    def record_event(
        self,
        ref: PodRef,
        reason: str,
        message: str,
        *,
        type_: Literal["Normal", "Warning"] = "Normal",
        host: str = "",
        now: datetime | None = None,
    ) -> None:
        """A core/v1 Event on the pod, shown by ``kubectl describe pod``."""
        stamp = _format_time(now or datetime.now(UTC))
        involved = {"apiVersion": "v1", "kind": "Pod", "namespace": ref.namespace, "name": ref.name, "uid": ref.uid}
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{ref.name}.", "namespace": ref.namespace},
            "involvedObject": involved,
            "reason": reason,
            "message": message[:1024],
            "type": type_,
            "source": {"component": COMPONENT, "host": host},
            "reportingComponent": COMPONENT,
            "reportingInstance": host,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        self._call("POST", f"/api/v1/namespaces/{quote(ref.namespace, safe='')}/events", body=body)

    def record_node_event(
        self,
        node: str,
        reason: str,
        message: str,
        *,
        type_: Literal["Normal", "Warning"] = "Normal",
        now: datetime | None = None,
    ) -> None:
        """A core/v1 Event on the Node, shown by ``kubectl describe node``.

        Written as kubelet writes node events: in namespace ``default``, with the node's name as
        the involved object's uid (``kubectl describe node`` looks for events under that uid too).
        """
        stamp = _format_time(now or datetime.now(UTC))
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{node}.", "namespace": "default"},
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node},
            "reason": reason,
            "message": message[:1024],
            "type": type_,
            "source": {"component": COMPONENT, "host": node},
            "reportingComponent": COMPONENT,
            "reportingInstance": node,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        self._call("POST", "/api/v1/namespaces/default/events", body=body)

    def list_events(
        self, namespace: str, *, involved_uid: str | None = None, involved_name: str | None = None
    ) -> list[dict[str, Any]]:
        """Events about one object, by uid, or by name (which also finds a deleted namesake's)."""
        selector = f"involvedObject.uid={involved_uid}" if involved_uid else f"involvedObject.name={involved_name}"
        query = {"fieldSelector": selector}
        _, doc = self._call("GET", f"/api/v1/namespaces/{quote(namespace, safe='')}/events", query=query)
        return list(doc.get("items") or [])

    # -- nodes ------------------------------------------------------------------------------------------------

    def list_nodes(self) -> list[dict[str, Any]]:
        """Every node object (`gpushare status` without an agent reads their allocatable counts)."""
        _, doc = self._call("GET", "/api/v1/nodes")
        return list(doc.get("items") or [])

    def list_node(self, name: str) -> tuple[list[dict[str, Any]], str]:
        """The node called ``name`` (or nothing) and the list's resourceVersion, to watch it from."""
        _, doc = self._call("GET", "/api/v1/nodes", query={"fieldSelector": f"metadata.name={name}"})
        return list(doc.get("items") or []), str(doc["metadata"].get("resourceVersion", ""))

    def watch_node(self, name: str, resource_version: str, *, timeout_s: int | None = None) -> Iterator[WatchEvent]:
        return self._watch("/api/v1/nodes", resource_version, {"fieldSelector": f"metadata.name={name}"}, timeout_s)

    def patch_node_status(self, node: str, status: Mapping[str, Any]) -> None:
        node_status.patch_status(self._call, node, status)

    # -- leases -----------------------------------------------------------------------------------------------

    @staticmethod
    def _lease_path(namespace: str, name: str = "") -> str:
        base = f"/apis/coordination.k8s.io/v1/namespaces/{quote(namespace, safe='')}/leases"
        return f"{base}/{quote(name, safe='')}" if name else base

    def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        status, doc = self._call("GET", self._lease_path(namespace, name), ok=(404,))
        return None if status == 404 else dict(doc)

    def write_lease(self, namespace: str, name: str, spec: Mapping[str, Any], resource_version: str | None) -> bool:
        """Create (no resource version) or replace (optimistic, by resourceVersion); False if someone was first."""
        meta: dict[str, Any] = {"name": name, "namespace": namespace}
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": dict(spec)}
        if resource_version is None:
            status, _ = self._call("POST", self._lease_path(namespace), body=body, ok=(409,))
        else:
            meta["resourceVersion"] = resource_version
            status, _ = self._call("PUT", self._lease_path(namespace, name), body=body, ok=(409,))
        return status != 409

    def get_namespace_annotations(self, name: str) -> dict[str, str]:
        """The namespace's annotations ({} when it has none)."""
        _, doc = self._call("GET", f"/api/v1/namespaces/{quote(name, safe='')}")
        return dict(((doc or {}).get("metadata") or {}).get("annotations") or {})

    def delete_lease(self, namespace: str, name: str) -> bool:
        """Delete a Lease; False if it was not there."""
        status, _ = self._call("DELETE", self._lease_path(namespace, name), ok=(404,))
        return status != 404

    # -- uninstall (`gpushare uninstall`, docs/install.md) ------------------------------------------------------

    def evict_pod(self, ref: PodRef) -> bool | None:
        """Ask the Eviction API to remove exactly this pod (uid precondition), as `kubectl drain` does.

        True: accepted. False: the pod is gone or has a new uid. None: a PodDisruptionBudget does not
        allow it now (429), so the caller asks again later.
        """
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": ref.name, "namespace": ref.namespace},
            "deleteOptions": {"preconditions": {"uid": ref.uid}},
        }
        path = f"{self._pods_path(ref.namespace)}/{quote(ref.name, safe='')}/eviction"
        status, _ = self._call("POST", path, body=body, ok=(404, 409, 429))
        if status == 429:
            return None
        return status not in (404, 409)

    def delete_admission_policy(self, name: str) -> bool:
        """Delete a ValidatingAdmissionPolicy and its binding of the same name; False if neither was there."""
        found = False
        for kind in ("validatingadmissionpolicybindings", "validatingadmissionpolicies"):
            path = f"/apis/admissionregistration.k8s.io/v1/{kind}/{quote(name, safe='')}"
            status, _ = self._call("DELETE", path, ok=(404,))
            found = found or status != 404
        return found

    def list_resource_claims(self) -> list[dict[str, Any]]:
        """Every ResourceClaim in the cluster; [] where the API server serves no resource.k8s.io/v1."""
        return self._list_dra("resourceclaims", None)

    def list_resource_slices(self, driver: str) -> list[dict[str, Any]]:
        """The ResourceSlices ``driver`` published; [] where the API server serves no resource.k8s.io/v1."""
        return self._list_dra("resourceslices", f"spec.driver={driver}")

    def _list_dra(self, resource: str, field_selector: str | None) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        query: dict[str, Any] = {"limit": LIST_PAGE, "fieldSelector": field_selector}
        while True:
            status, doc = self._call("GET", f"/apis/resource.k8s.io/v1/{resource}", query=query, ok=(404,))
            if status == 404:
                return []
            items.extend(doc.get("items") or [])
            token = (doc.get("metadata") or {}).get("continue")
            if not token:
                return items
            query = {**query, "continue": token}

    def list_daemonsets(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        """The DaemonSets in ``namespace`` matching ``label_selector`` (`gpushare install-check`)."""
        path = f"/apis/apps/v1/namespaces/{quote(namespace, safe='')}/daemonsets"
        _, doc = self._call("GET", path, query={"labelSelector": label_selector})
        return list(doc.get("items") or [])


def _translate(status: int, what: str, body: bytes, retry_after: str | None) -> KubeError:
    message = _api_message(body)
    if status == 410:
        return ResourceExpired(f"gpushare: {what}: resource version expired ({message}); listing again")
    if status == 429 or status >= 500:
        delay = float(retry_after) if retry_after and retry_after.isdigit() else 1.0
        return ApiUnavailable(f"gpushare: {what} answered {status} ({message}); retrying in {delay:g}s")
    # RBAC denials read 'User "x" cannot <verb> resource ...'; other 403s come from admission.
    is_rbac = status == 401 or (status == 403 and " cannot " in message)
    hint = " (check the agent's RBAC in manifests/20-rbac.yaml)" if is_rbac else ""
    return KubeError(f"gpushare: {what} was refused with {status}: {message}{hint}")


def _watch_event(line: bytes, what: str) -> WatchEvent:
    try:
        doc = json.loads(line)
        etype, obj = doc["type"], doc["object"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ApiUnavailable(f"gpushare: {what} sent an unreadable event ({exc}); listing again") from exc
    if etype == "ERROR":
        code = obj.get("code") if isinstance(obj, dict) else None
        text = json.dumps(obj).encode()
        if code == 410:
            raise ResourceExpired(f"gpushare: {what}: resource version expired ({_api_message(text)}); listing again")
        raise ApiUnavailable(f"gpushare: {what} ended with an error event: {_api_message(text)}")
    if etype not in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK") or not isinstance(obj, dict):
        raise ApiUnavailable(f"gpushare: {what} sent an event of unknown type {etype!r}")
    return WatchEvent(etype, obj)


__all__ = ["KubeClient", "WatchEvent"]
