"""The leader's cluster-wide view, from raw pod dicts: one copy of each pod across the caches,
which shadows the scheduler cannot place, and the Warning a sharer waiting on them gets.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from controller.core.actions import RecordEvent
from controller.core.model import ShareKey, Snapshot
from gpushare import installation, keys

REASON_SHADOW_UNSCHEDULABLE = "ShadowUnschedulable"


def _resource_version(pod: Mapping[str, Any]) -> int:
    meta = pod.get("metadata") or {}
    rv = meta.get("resourceVersion") or meta.get("resource_version")
    try:
        return int(str(rv))
    except (TypeError, ValueError):
        return 0


def merge_pods(*views: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """One pod per ns/name across caches; the newest resourceVersion wins (caches lag differently)."""
    best: dict[tuple[str, str], Mapping[str, Any]] = {}
    for view in views:
        for pod in view:
            # type() first: the ABC checks cost more than the rest of the loop.
            meta = pod.get("metadata") if type(pod) is dict or isinstance(pod, Mapping) else None
            if type(meta) is not dict and not isinstance(meta, Mapping):
                # Kept, under a key of its own: build_snapshot reports what is wrong with it.
                best[("", f"#{id(pod)}")] = pod
                continue
            key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
            seen = best.setdefault(key, pod)  # one dict operation for a pod seen once, as most are
            if seen is not pod and _resource_version(pod) > _resource_version(seen):
                best[key] = pod
    return list(best.values())


def unschedulable_message(pod: Mapping[str, Any]) -> str:
    """The scheduler's message when a pod is Pending because it cannot be placed, else ""."""
    status = pod.get("status") or {}
    if status.get("phase", "Pending") != "Pending":
        return ""
    for cond in status.get("conditions") or ():
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return str(cond.get("message") or cond.get("reason") or "unschedulable")
    return ""


def unschedulable_pods(pods: Iterable[Mapping[str, Any]]) -> frozenset[str]:
    """``ns/name`` of each pending pod the scheduler has answered it cannot place."""
    out: set[str] = set()
    for pod in pods:
        if unschedulable_message(pod):
            meta = pod.get("metadata") or {}
            out.add(f"{meta.get('namespace')}/{meta.get('name')}")
    return frozenset(out)


# One reason of the scheduler's verdict that counts nodes short of a resource: "2 Insufficient cpu".
_INSUFFICIENT = re.compile(r"(\d+) Insufficient ([^\s,]+)")
_SHARE_PREFIXES = (keys.RESOURCE_SHARE_GPU_PREFIX, keys.RESOURCE_SHARE_DEV_GPU_PREFIX)


def blocked_elsewhere(pods: Iterable[Mapping[str, Any]]) -> frozenset[str]:
    """``ns/name`` of each pending pod the scheduler cannot place for reasons a shadow cannot cure.

    The scheduler's message counts, per reason, the nodes that refused the pod: ``0/3 nodes are
    available: 1 Insufficient cpu, 2 Insufficient gpushare/share-gpu-4, 1 node(s) didn't match
    Pod's node affinity/selector. preemption: ...``. A node fails at its first failing filter, and
    only the resource-fit filter names several reasons for one node, so at least ``(nodes short of
    share slots) - (nodes short of anything else)`` nodes lack nothing but slots. When that is not
    above zero, no node is one a new shadow would open: the pod (too much CPU, a nodeSelector or a
    taint nothing matches) would keep whole GPUs in shadows it never uses.
    """
    out: set[str] = set()
    for pod in pods:
        message = unschedulable_message(pod)
        if not message:
            continue  # not answered yet: it may be placed as soon as a slot exists
        verdict = message.split(" preemption:", 1)[0]
        share = other = 0
        for count, resource in _INSUFFICIENT.findall(verdict):
            if resource.rstrip(".").startswith(_SHARE_PREFIXES):
                share += int(count)
            else:
                other += int(count)
        if share > other:
            continue
        meta = pod.get("metadata") or {}
        out.add(f"{meta.get('namespace')}/{meta.get('name')}")
    return frozenset(out)


def unschedulable_shadows(pods: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Shadow ``ns/name`` -> the scheduler's message, for each shadow it cannot place."""
    out: dict[str, str] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        if meta.get("namespace") != installation.namespace() or (pod.get("status") or {}).get("phase") == "Running":
            continue  # most shadows hold their GPU: no need to look for the scheduler's word
        if message := unschedulable_message(pod):
            out[f"{meta.get('namespace')}/{meta.get('name')}"] = message
    return out


def plan_waiting_events(snapshot: Snapshot, unschedulable: Mapping[str, str]) -> list[RecordEvent]:
    """A pending sharer whose every shadow with free slots cannot be placed learns why, on itself.

    The scheduler's own Event on the sharer only says the share resource is insufficient; the
    real reason (no GPU left for a new shadow) is on the shadow, which users rarely look at.
    ``unschedulable``: shadow ``ns/name`` -> the scheduler's message.
    """
    stuck: dict[ShareKey, list[tuple[str, str]]] = {}
    if not unschedulable:
        return []
    # Few shadows are stuck: a shadow no key can end in "/<its name>" for is passed over
    # without building its key (every part of a key after a slash, should a name hold one).
    names = {"/".join(parts[i:]) for parts in (k.split("/") for k in unschedulable) for i in range(1, len(parts))}
    for s in snapshot.shadows:
        ref = s.facts.ref
        if ref.name not in names:
            continue
        msg = unschedulable.get(f"{ref.namespace}/{ref.name}", "")  # ref.key, without a call
        if msg and s.facts.is_alive:
            stuck.setdefault(s.key, []).append((s.ref.key, msg))
    # One message per key: every sharer waiting on it gets the same text.
    messages = {key: _waiting_message(key, sorted(shadows)) for key, shadows in stuck.items()}
    return [
        RecordEvent(sharer.ref, REASON_SHADOW_UNSCHEDULABLE, messages[sharer.key], "Warning")
        for sharer in snapshot.sharers
        if sharer.is_pending and sharer.key in messages
    ]


def _waiting_message(key: ShareKey, shadows: list[tuple[str, str]]) -> str:
    """``shadows``: (ns/name, the scheduler's message) of each stuck shadow of ``key``, sorted."""
    names = ", ".join(n for n, _ in shadows)
    why = shadows[0][1]
    return (
        f"gpushare: no free slot of {key.resource}; the shadow pod {names} that would hold a "
        f"{key.pool.resource} GPU for it cannot be scheduled: {why}"
    )


__all__ = [
    "REASON_SHADOW_UNSCHEDULABLE",
    "merge_pods",
    "plan_waiting_events",
    "unschedulable_message",
    "unschedulable_pods",
    "unschedulable_shadows",
]
