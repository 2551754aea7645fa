"""Straightforward references for the leader's decision code, to check the indexed versions against.

Each function here is the plain reading of a rule in docs/controller.md: scan every pod
for every question, no index, no shortcut. The product code answers the same questions
from indexes built once per pass (docs/scale.md); the properties in
tests/property/test_controller_model.py hold the two to exactly the same answers.
Not a test module itself.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from controller.core.actions import (
    REASON_SHADOW_DEMAND,
    REASON_SHADOW_IDLE,
    REASON_WARM_POOL,
    Action,
    AnnotatePod,
    CreateShadow,
    DeleteShadow,
    RecordEvent,
)
from controller.core.model import Pool, ShadowPod, ShareKey, SharePod, Snapshot
from controller.core.pod_facts import ContainerFacts, PodFacts, PodRef, is_vendor_resource
from controller.errors import InvalidObject
from controller.share.cluster_view import REASON_SHADOW_UNSCHEDULABLE
from controller.share.served import REASON_UNKNOWN_POOL, REASON_UNKNOWN_SPEC
from controller.share.solver import (
    KeyDemand,
    ShadowPlan,
    build_shadow_manifest,
    shadow_name,
)
from gpushare import keys
from gpushare.config import Config

# --- reading a pod -----------------------------------------------------------------------------------------


def _get(d: Mapping[str, Any], snake: str, camel: str | None = None) -> Any:
    value = d.get(snake)
    return d.get(camel) if value is None and camel is not None else value


def _obj(d: Mapping[str, Any], where: str, pod: str, snake: str, camel: str | None = None) -> Mapping[str, Any]:
    value = _get(d, snake, camel)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidObject(f"gpushare: pod {pod}: {where} must be an object, got {value!r:.80}")
    return value


def _objs(d: Mapping[str, Any], where: str, pod: str, snake: str, camel: str) -> list[Mapping[str, Any]]:
    value = _get(d, snake, camel)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
        raise InvalidObject(f"gpushare: pod {pod}: {where} must be a list of objects, got {value!r:.80}")
    return value


def _str_map(value: object, where: str, pod: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise InvalidObject(f"gpushare: pod {pod}: {where} must map strings to strings, got {value!r:.120}")
    return dict(value)


def _quantity(value: object, resource: str, pod: str) -> int:
    top = 2**63 - 1  # the API's int64
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= top:
        return value
    text = value.strip() if isinstance(value, str) else ""
    if text.isascii() and text.isdecimal() and len(text) <= len(str(top)):
        if int(text) > top:
            raise InvalidObject(f"gpushare: pod {pod}: {resource} quantity {value!r:.40} is more than {top}")
        return int(text)
    raise InvalidObject(f"gpushare: pod {pod}: {resource} quantity {value!r:.40} is not a whole number from 0 to {top}")


def _containers(spec: Mapping[str, Any], status: Mapping[str, Any], pod: str) -> tuple[ContainerFacts, ...]:
    ids: dict[str, str] = {}
    running: set[str] = set()
    statuses = (("container_statuses", "containerStatuses"), ("init_container_statuses", "initContainerStatuses"))
    for snake, camel in statuses:
        for st in _objs(status, f"status.{camel}", pod, snake, camel):
            cid = _get(st, "container_id", "containerID") or ""
            name = _get(st, "name")
            if isinstance(name, str) and isinstance(cid, str):
                ids[name] = cid.split("://", 1)[-1]
            state = _get(st, "state")
            if isinstance(name, str) and isinstance(state, Mapping) and state.get("running") is not None:
                running.add(name)
    out: list[ContainerFacts] = []
    for snake, camel in (("containers", "containers"), ("init_containers", "initContainers")):
        for c in _objs(spec, f"spec.{camel}", pod, snake, camel):
            name = _get(c, "name")
            if not isinstance(name, str) or not name:
                raise InvalidObject(f"gpushare: pod {pod}: a container has no name")
            res = _obj(c, f"container {name} resources", pod, "resources")
            requests = _obj(res, f"container {name} resources.requests", pod, "requests")
            limits = _obj(res, f"container {name} resources.limits", pod, "limits")
            merged = {**limits, **requests}
            if not all(isinstance(r, str) for r in merged):
                raise InvalidObject(f"gpushare: pod {pod}: container {name} names a resource that is not a string")
            wanted = tuple(
                sorted(
                    (r, _quantity(q, r, pod))
                    for r, q in merged.items()
                    if r.startswith(keys.RESOURCE_PREFIX) or is_vendor_resource(r)
                )
            )
            kind = "app"
            if snake == "init_containers":
                kind = "sidecar" if (c.get("restart_policy") or c.get("restartPolicy")) == "Always" else "init"
            out.append(ContainerFacts(name, wanted, ids.get(name, ""), name in running, kind))
    return tuple(out)


def parse_pod(pod: Any) -> PodFacts:
    """The pod's facts, or ``InvalidObject`` naming the first field that cannot be read."""
    if not isinstance(pod, Mapping):
        raise InvalidObject(f"gpushare: expected a pod object, got {type(pod).__name__}")
    meta = _obj(pod, "metadata", "?", "metadata")
    namespace, name, uid = _get(meta, "namespace"), _get(meta, "name"), _get(meta, "uid")
    if not all(isinstance(v, str) and v for v in (namespace, name, uid)):
        raise InvalidObject(f"gpushare: a pod lacks metadata.namespace, name or uid: {dict(meta)!r:.160}")
    ref = PodRef(namespace, name, uid)
    spec = _obj(pod, "spec", ref.key, "spec")
    status = _obj(pod, "status", ref.key, "status")
    node_name = _get(spec, "node_name", "nodeName") or ""
    phase = _get(status, "phase") or "Pending"
    if not isinstance(node_name, str) or not isinstance(phase, str):
        raise InvalidObject(f"gpushare: pod {ref}: spec.nodeName and status.phase must be strings")
    selector = _str_map(_get(spec, "node_selector", "nodeSelector"), "spec.nodeSelector", ref.key)
    return PodFacts(
        ref=ref,
        node_name=node_name,
        phase=phase,
        labels=_str_map(_get(meta, "labels"), "metadata.labels", ref.key),
        annotations=_str_map(_get(meta, "annotations"), "metadata.annotations", ref.key),
        node_selector=tuple(sorted(selector.items())),
        containers=_containers(spec, status, ref.key),
        is_terminating=_get(meta, "deletion_timestamp", "deletionTimestamp") is not None,
        is_gated=bool(_get(spec, "scheduling_gates", "schedulingGates")),
    )


# --- the leader's shadow plan ------------------------------------------------------------------------------


def _used_slots(snapshot: Snapshot) -> dict[str, int]:
    used = {s.ref.uid: s.used_slots for s in snapshot.shadows if s.facts.is_alive}
    recorded = {user.rsplit("/", 1)[0] for s in snapshot.shadows for user in s.users}
    for sharer in snapshot.sharers:
        if not sharer.holds_slots or sharer.ref.key in recorded:
            continue
        remaining = sharer.quantity
        for s in sorted(snapshot.shadows, key=_draining):  # every shadow, in service first, for every sharer
            same = (s.node_name, s.key.kind, s.key.spec) == (sharer.node_name, sharer.key.kind, sharer.key.spec)
            if not (same and s.facts.is_alive and s.node_name) or remaining == 0:
                continue
            take = min(remaining, max(0, s.key.spec - used[s.ref.uid]))
            used[s.ref.uid] += take
            remaining -= take
    return used


def _draining(s: ShadowPod) -> bool:
    return bool(s.facts.annotations.get(keys.ANNOTATION_SHADOW_DRAINING))


def _drained(s: ShadowPod) -> bool:
    marks = s.facts.annotations
    return _draining(s) and marks.get(keys.ANNOTATION_SHADOW_DRAINED) == marks[keys.ANNOTATION_SHADOW_DRAINING]


def _undrain(s: ShadowPod) -> list[Action]:
    out: list[Action] = [AnnotatePod(s.ref, keys.ANNOTATION_SHADOW_DRAINING, None)]
    if keys.ANNOTATION_SHADOW_DRAINED in s.facts.annotations:
        out.append(AnnotatePod(s.ref, keys.ANNOTATION_SHADOW_DRAINED, None))
    return out


def _taken_ordinals(snapshot: Snapshot, key: ShareKey) -> set[int]:
    prefix = shadow_name(key, 0)[:-1]
    names = {s.ref.name for s in snapshot.shadows}
    names |= {k.split("/", 1)[-1] for sharer in snapshot.sharers for k in sharer.owner_shadows}
    return {int(n[len(prefix) :]) for n in names if n.startswith(prefix) and n[len(prefix) :].isdecimal()}


def _refusals(key: ShareKey, cfg: Config, pending: list[SharePod]) -> list[Action]:
    if key.pool.resource not in cfg.real_resources:
        reason = REASON_UNKNOWN_POOL
        why = (
            f"gpushare: pool resource {key.pool.resource!r} (annotation {keys.ANNOTATION_POOL_RESOURCE}) is not one "
            f"of realResources {list(cfg.real_resources)}; no shadow will be created for it"
        )
    else:
        reason = REASON_UNKNOWN_SPEC
        why = (
            f"gpushare: {key.resource} is not served here (shareSpecs {list(cfg.share_specs)}, devShareSpecs "
            f"{list(cfg.dev_share_specs)}); no shadow will be created for it"
        )
    return [RecordEvent(p.ref, reason, why, "Warning") for p in pending]


def plan_shadows(
    snapshot: Snapshot,
    cfg: Config,
    now: float,
    empty_since: Mapping[str, float],
    *,
    unplaceable: Collection[str] = (),
    blocked: Collection[str] = (),
) -> ShadowPlan:
    """The demand rule of docs/controller.md, one key at a time, scanning every pod for each.

    Every pending sharer is first seen now, so each one the scheduler has not called
    unplaceable may be on its way to a shadow of its key: that key drains nothing."""
    configured = {(keys.KIND_SHARE, n) for n in cfg.share_specs}
    configured |= {(keys.KIND_SHARE_DEV, n) for n in cfg.dev_share_specs}
    used = _used_slots(snapshot)
    warm = {ShareKey(Pool(cfg.real_resources[0]), k, n) for k, n in configured} if cfg.warm_shadows else set()
    recorded = {user.rsplit("/", 1)[0] for s in snapshot.shadows for user in s.users or ()}
    waiting = [  # a record: bound; blocked: no shadow would get it placed
        p for p in snapshot.sharers if p.is_pending and p.ref.key not in recorded and p.ref.key not in blocked
    ]
    in_use = {s.key for s in snapshot.shadows if s.facts.is_alive} | {p.key for p in waiting}
    actions: list[Action] = []
    new_empty: dict[str, float] = {}
    demand: list[KeyDemand] = []
    for key in sorted(in_use | warm):
        alive = sorted((s for s in snapshot.shadows if s.facts.is_alive and s.key == key), key=lambda s: s.ref)
        pending = [p for p in waiting if p.key == key]
        is_served = (key.kind, key.spec) in configured and key.pool.resource in cfg.real_resources
        if not is_served:
            actions += _refusals(key, cfg, pending)
            pending = []
            if not alive:
                continue
        n = key.spec
        serving = [s for s in alive if not _draining(s)]
        draining = [s for s in alive if _draining(s)]
        free = sum(max(0, n - used[s.ref.uid]) for s in serving)
        asked = sum(p.quantity for p in pending)
        target = asked + (cfg.warm_shadows * n if is_served else 0)
        short = max(0, -(-(target - free) // n))
        hold = any(p.ref.key not in unplaceable for p in pending)
        # Draining: a busy one comes back; idle ones come back while the key is short (still listed
        # first), or all of them while a sharer may be on its way; an idle one its node has
        # answered for is deleted.
        busy = [s for s in draining if used[s.ref.uid] > 0]
        idle_draining = [s for s in draining if used[s.ref.uid] == 0]
        reuse = [s for s in idle_draining if not _drained(s)] + [s for s in idle_draining if _drained(s)]
        reuse = reuse if hold else reuse[:short]
        for s in busy + reuse:
            actions += _undrain(s)
        deletes: list[Action] = [DeleteShadow(s.ref, REASON_SHADOW_IDLE) for s in idle_draining if _drained(s)]
        deletes = [d for d in deletes if all(d.ref != s.ref for s in reuse)]  # type: ignore[attr-defined]
        actions += deletes
        free += sum(max(0, n - used[s.ref.uid]) for s in busy + reuse)
        create = max(0, short - len(reuse))
        if create:
            taken = _taken_ordinals(snapshot, key)
            free_ordinals = [i for i in range(len(taken) + create) if i not in taken][:create]
            reason = REASON_SHADOW_DEMAND if asked > free else REASON_WARM_POOL
            actions += [
                CreateShadow(key, shadow_name(key, i), build_shadow_manifest(key, shadow_name(key, i), cfg), reason)
                for i in free_ordinals
            ]
        clocks = {s.ref.uid: empty_since.get(s.ref.uid, now) for s in alive if used[s.ref.uid] == 0}
        new_empty.update(clocks)
        timeout = cfg.shadow_idle_timeout_s
        idle = sorted((clocks[s.ref.uid], s.ref) for s in serving if now - clocks.get(s.ref.uid, now + 1) >= timeout)
        spare = -1 if hold else free - target
        for _since, ref in idle:
            if spare < n:
                break
            actions.append(AnnotatePod(ref, keys.ANNOTATION_SHADOW_DRAINING, f"{now:.3f}"))
            spare -= n
        demand.append(KeyDemand(key, len(alive), free, asked, create, len(deletes)))
    return ShadowPlan(tuple(actions), new_empty, tuple(demand))


def plan_waiting_events(snapshot: Snapshot, unschedulable: Mapping[str, str]) -> list[RecordEvent]:
    out: list[RecordEvent] = []
    for sharer in snapshot.sharers:
        stuck = sorted(
            (s.ref.key, unschedulable[s.ref.key])
            for s in snapshot.shadows
            if s.key == sharer.key and s.facts.is_alive and unschedulable.get(s.ref.key)
        )
        if not sharer.is_pending or not stuck:
            continue
        names = ", ".join(n for n, _ in stuck)
        out.append(
            RecordEvent(
                sharer.ref,
                REASON_SHADOW_UNSCHEDULABLE,
                f"gpushare: no free slot of {sharer.key.resource}; the shadow pod {names} that would hold a "
                f"{sharer.key.pool.resource} GPU for it cannot be scheduled: {stuck[0][1]}",
                "Warning",
            )
        )
    return out


def shadow_is_gone(snapshot: Snapshot, shadow_key: str, uid: str | None) -> bool:
    namesakes: list[ShadowPod] = [s for s in snapshot.shadows if s.ref.key == shadow_key]
    ours = [s for s in namesakes if uid is None or s.ref.uid == uid]
    if ours:
        return not ours[0].facts.is_alive
    if any(d.key == shadow_key and (uid is None or d.uid == uid) for d in snapshot.deleted_shadows):
        return True
    return bool(namesakes) or snapshot.shadow_list_fresh
