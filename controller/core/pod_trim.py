"""The part of a pod the agent reads, for its caches: ``trim_pod(raw) -> raw``.

The leader caches every unscheduled pod of the cluster, and every agent the pods of its node.
A pod's object can be as large as the API server stores (about 1.5 MB: env values, command
lines, volumes, annotations of other tools), and pods no node will ever run stay pending for
good, so caching them whole lets tenants push the agent past its own memory limit. A cache
keeps instead exactly the fields ``parse_pod``, the leader's scheduler reads
(``controller.share.cluster_view``) and the resourceVersion memo look at, in whichever
spelling the API used, and of the labels and annotations only gpushare's own keys: every one
the agent acts on starts with ``gpushare.k8s.io/``. A field of an unexpected type is kept as
it came, so reading the trimmed pod refuses it exactly as reading the whole one would.
Pure module: stdlib and ``gpushare`` only (docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gpushare import keys

_OURS = keys.DOMAIN + "/"
_META = (
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "resource_version",
    "deletionTimestamp",
    "deletion_timestamp",
)
_SPEC = ("nodeName", "node_name", "nodeSelector", "node_selector", "schedulingGates", "scheduling_gates")
_CONTAINER_LISTS = ("containers", "initContainers", "init_containers")
_CONTAINER = ("name", "resources", "restartPolicy", "restart_policy")
_STATUS_LISTS = ("containerStatuses", "container_statuses", "initContainerStatuses", "init_container_statuses")
_CONTAINER_STATUS = ("name", "containerID", "container_id")
_CONDITION = ("type", "status", "reason", "message")


def _pick(obj: dict[str, Any], fields: Iterable[str]) -> dict[str, Any]:
    return {k: obj[k] for k in fields if k in obj}


def _ours(value: Any) -> Any:
    if type(value) is not dict:
        return value
    return {k: v for k, v in value.items() if isinstance(k, str) and k.startswith(_OURS)}


def _each(value: Any, trim: Any) -> Any:
    """A list of objects, each trimmed; anything else as it came."""
    if type(value) is not list:
        return value
    return [trim(item) if type(item) is dict else item for item in value]


def _container(c: dict[str, Any]) -> dict[str, Any]:
    return _pick(c, _CONTAINER)


def _container_status(st: dict[str, Any]) -> dict[str, Any]:
    out = _pick(st, _CONTAINER_STATUS)
    state = st.get("state")
    if type(state) is dict:
        out["state"] = {"running": state["running"]} if state.get("running") is not None else {}
    elif "state" in st:
        out["state"] = state
    return out


def _condition(cond: dict[str, Any]) -> dict[str, Any]:
    return _pick(cond, _CONDITION)


def trim_pod(pod: Any) -> Any:
    """``pod`` with only what the agent reads of it; anything that is not a pod object as it came."""
    if type(pod) is not dict:
        return pod
    out: dict[str, Any] = {}
    meta = pod.get("metadata")
    if type(meta) is dict:
        trimmed = _pick(meta, _META)
        for field in ("labels", "annotations"):
            if field in meta:
                trimmed[field] = _ours(meta[field])
        out["metadata"] = trimmed
    elif "metadata" in pod:
        out["metadata"] = meta
    spec = pod.get("spec")
    if type(spec) is dict:
        trimmed = _pick(spec, _SPEC)
        for field in _CONTAINER_LISTS:
            if field in spec:
                trimmed[field] = _each(spec[field], _container)
        out["spec"] = trimmed
    elif "spec" in pod:
        out["spec"] = spec
    status = pod.get("status")
    if type(status) is dict:
        trimmed = _pick(status, ("phase",))
        for field in _STATUS_LISTS:
            if field in status:
                trimmed[field] = _each(status[field], _container_status)
        conditions = status.get("conditions")
        if type(conditions) is list:
            # The scheduler's word is all the leader reads of them.
            trimmed["conditions"] = [
                _condition(c) for c in conditions if type(c) is dict and c.get("type") == "PodScheduled"
            ]
        elif "conditions" in status:
            trimmed["conditions"] = conditions
        out["status"] = trimmed
    elif "status" in pod:
        out["status"] = status
    return out


__all__ = ["trim_pod"]
