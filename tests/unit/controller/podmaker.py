"""Pod dicts shaped like the kubernetes client's ``V1Pod.to_dict()`` (or the API's camelCase JSON).

Shared by the controller's decision-code tests; not a test module itself.
"""

from __future__ import annotations

from typing import Any

from controller.core.model import PodResourcesEntry, Snapshot, build_snapshot, encode_users_annotation
from gpushare import keys
from gpushare.config import Config

NODE = "node-a"


def pod(
    name: str,
    ns: str = "default",
    *,
    uid: str | None = None,
    node: str = "",
    phase: str = "Pending",
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    requests: dict[str, Any] | None = None,
    containers: list[str] | None = None,
    deleting: bool = False,
    selector: dict[str, str] | None = None,
    container_ids: dict[str, str] | None = None,
    gated: bool = False,
    camel: bool = False,
    running: bool = False,
) -> dict[str, Any]:
    """One pod; ``requests`` go on the first container (as requests and limits)."""
    names = containers or ["app"]
    spec_containers = []
    for i, c in enumerate(names):
        res = {k: str(v) for k, v in (requests or {}).items()} if i == 0 else {}
        spec_containers.append({"name": c, "image": "busybox", "resources": {"requests": res, "limits": dict(res)}})
    # ``running``: every container with an ID is reported running (status.state.running).
    state = {"running": {k_("startedAt", "started_at", camel): "2026-12-02T15:00:00Z"}} if running else {}
    statuses = [
        {"name": c, ("containerID" if camel else "container_id"): f"containerd://{cid}", "state": state}
        for c, cid in (container_ids or {}).items()
    ]

    def k(camel_name: str, snake: str) -> str:
        return camel_name if camel else snake

    return {
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": uid or f"uid-{ns}-{name}",
            "labels": labels,
            "annotations": annotations,
            k("deletionTimestamp", "deletion_timestamp"): "2026-12-02T16:00:00Z" if deleting else None,
        },
        "spec": {
            k("nodeName", "node_name"): node or None,
            "containers": spec_containers,
            k("nodeSelector", "node_selector"): selector,
            k("schedulingGates", "scheduling_gates"): [{"name": "wait"}] if gated else None,
        },
        "status": {"phase": phase, k("containerStatuses", "container_statuses"): statuses or None},
    }


def k_(camel_name: str, snake: str, camel: bool) -> str:
    return camel_name if camel else snake


def sharer(name: str, spec: int = 4, *, kind: str = keys.KIND_SHARE, qty: int = 1, **kw: Any) -> dict[str, Any]:
    return pod(name, requests={keys.share_resource(kind, spec): qty}, **kw)


def shadow(
    name: str,
    spec: int = 4,
    *,
    kind: str = keys.KIND_SHARE,
    node: str = NODE,
    phase: str = "Running",
    resource: str = "nvidia.com/gpu",
    users: dict[str, list[str]] | None = None,
    **kw: Any,
) -> dict[str, Any]:
    annotations = dict(kw.pop("annotations", None) or {})
    if users is not None:
        annotations[keys.ANNOTATION_SHADOW_USERS] = encode_users_annotation(users)
    return pod(
        name,
        keys.DEFAULT_NAMESPACE,
        node=node,
        phase=phase,
        labels={keys.LABEL_ROLE: keys.ROLE_SHADOW, keys.LABEL_SHARE_SPEC: str(spec), keys.LABEL_SHARE_KIND: kind},
        annotations=annotations or None,
        requests={resource: 1},
        containers=[keys.SHADOW_CONTAINER],
        **kw,
    )


def row(pod_key: str, container: str, resource: str, *ids: str) -> PodResourcesEntry:
    ns, name = pod_key.split("/")
    return PodResourcesEntry(ns, name, container, resource, tuple(ids))


def snap(pods: list[dict[str, Any]], cfg: Config | None = None, **kw: Any) -> Snapshot:
    return build_snapshot(pods, cfg or Config(node_name=NODE), **kw)
