"""Shadow demand, shadow idling, cascade eviction and the share plugins' device lists (design §3).

Two entry points, both plain functions of a ``Snapshot``:

- ``plan_shadows`` — cluster-wide, run only by the Lease holder: per pool x kind x N,
  ``shortage = pending sharers + warm pool - free slots``, create ``ceil(shortage / N)``;
  delete shadows empty for ``shadowIdleTimeout`` while the rest still cover demand and
  the warm pool.
- ``plan_node_shares`` — every agent, for its own node: the device list of each share
  plugin, cascade eviction of sharers whose shadow is really gone, and the mapping records.

Every rule and the definitions the design leaves open are in docs/controller.md.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from controller.core.actions import (
    REASON_GPU_UNHEALTHY,
    REASON_SHADOW_DEMAND,
    REASON_SHADOW_GONE,
    REASON_WARM_POOL,
    Action,
    CreateShadow,
    DeleteShadow,
    Evict,
    KillPods,
    PodToKill,
    RecordEvent,
)
from controller.core.mapping import MappingCache
from controller.core.model import Pool, ShadowPod, ShareKey, SharePod, Snapshot
from controller.share.holdings import BindingKey, ShadowsByKey, bind_holdings, plan_cascade, shadow_is_gone
from controller.share.placing import Placing, Seen, placing_slots, track_placing
from controller.share.served import configured_specs, is_served, refuse_unserved, refuse_unserved_bound
from controller.share.shadow_drain import holds_drains, is_draining, plan_draining, plan_node_offer, start_drain
from gpushare import installation, keys
from gpushare.config import Config
from gpushare.ids import virtual_ids_of
from nri_plugin.device_rules import rule_for


@dataclass(frozen=True)
class KeyDemand:
    """The numbers behind one pool x kind x N decision (also shown by ``gpushare status``)."""

    key: ShareKey
    shadows: int  # alive shadows (not being deleted)
    free_slots: int
    pending: int  # slots asked for by pending sharers
    create: int
    delete: int


@dataclass(frozen=True)
class ShadowPlan:
    actions: tuple[Action, ...]
    # Shadow uid -> when it was first seen without sharers; store it (state.py) and pass it back.
    empty_since: Mapping[str, float]
    demand: tuple[KeyDemand, ...] = field(default=())
    # Sharers pending or on their way to a slot (controller/share/placing.py); pass it back.
    placing: Mapping[str, Seen] = field(default_factory=dict)


def shadow_name(key: ShareKey, ordinal: int) -> str:
    """Deterministic but unique: a create repeated on a stale cache meets AlreadyExists, never a twin.

    ``shadow-<kind>-<N>-<8 hex of the pool>-<ordinal>``; the pool hash keeps the name short
    and DNS-safe whatever the resource and selector are.
    """
    # surrogatepass: a selector value is the tenant's text, and a lone surrogate must not raise.
    digest = hashlib.sha256(str(key.pool).encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"shadow-{key.kind}-{key.spec}-{digest}-{ordinal}"


def build_shadow_manifest(key: ShareKey, name: str, cfg: Config) -> dict[str, Any]:
    """The shadow pod (API JSON): labels of design §3, one sleeping ``main`` asking for one real GPU."""
    one_gpu = {key.pool.resource: "1"}
    spec: dict[str, Any] = {
        "priorityClassName": cfg.shadow_priority_class,
        # Stated, not inherited: a PriorityClass that preempts while the config says it must not
        # gets the shadow refused at admission instead of evicting someone else's pod.
        "preemptionPolicy": "PreemptLowerPriority" if cfg.shadow_preemption else "Never",
        "restartPolicy": "Always",
        # The holder does nothing but exist: no token, no links, quick to stop.
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 5,
        # GPU nodes are commonly tainted with the vendor resource name (what the
        # ExtendedResourceToleration admission plugin would add for us).
        "tolerations": [{"key": key.pool.resource, "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [
            {
                "name": keys.SHADOW_CONTAINER,
                "image": cfg.shadow_image,
                "resources": {"requests": dict(one_gpu), "limits": dict(one_gpu)},
                "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True},
            }
        ],
    }
    if key.pool.node_selector:
        spec["nodeSelector"] = dict(key.pool.node_selector)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": installation.namespace(),
            "labels": {
                keys.LABEL_ROLE: keys.ROLE_SHADOW,
                keys.LABEL_SHARE_SPEC: str(key.spec),
                keys.LABEL_SHARE_KIND: key.kind,
            },
        },
        "spec": spec,
    }


# A shadow's ``PodRef`` order as a plain tuple, read in C (the order of ``Snapshot.shadows``).
_ref_order = attrgetter("facts.ref.namespace", "facts.ref.name", "facts.ref.uid")


@dataclass
class _Demand:
    """What ``plan_shadows`` reads from the snapshot, gathered in one pass over its shadows and sharers."""

    used: dict[str, int]  # alive shadow uid -> slots used
    alive: dict[ShareKey, list[ShadowPod]]  # alive shadows per key, in snapshot order
    pending: dict[ShareKey, list[SharePod]]  # pending sharers per key, in snapshot order
    snapshot: Snapshot
    draining: set[str]  # uids of the alive shadows being taken out of service (shadow_drain.is_draining)
    recorded: set[str]  # "<ns>/<pod>" of every user named in a shadow's users record
    _ordinals: dict[str, set[int]] | None = None

    @classmethod
    def of(cls, snapshot: Snapshot, blocked: Collection[str] = frozenset()) -> _Demand:
        """Slots used per alive shadow uid: its users record, plus bound sharers not yet recorded.

        A sharer bound to a node but absent from every shadow's users record has just been
        allocated (the node agent has not written the record yet); it is counted against the
        shadows of its kind and N on its node, filling them in name order, so a shadow is never
        seen empty (and deleted) in the moment a sharer takes it.
        """
        used: dict[str, int] = {}
        alive: dict[ShareKey, list[ShadowPod]] = {}
        draining: set[str] = set()
        recorded: set[str] = set()
        by_node: dict[tuple[str, str, int], list[ShadowPod]] = {}
        for s in snapshot.shadows:
            users = s.users
            if users:
                for user in users:
                    recorded.add(user.rsplit("/", 1)[0])
            facts = s.facts
            if not facts.is_alive:
                continue
            uid = facts.ref.uid
            used[uid] = s.used_slots if users else 0
            if is_draining(s):
                draining.add(uid)
            key = s.key
            same_key = alive.get(key)
            if same_key is None:
                alive[key] = [s]
            else:
                same_key.append(s)
            if facts.node_name:
                by_node.setdefault((facts.node_name, key.kind, key.spec), []).append(s)
        if draining:  # a just-bound sharer is counted on a shadow in service first
            for on_node in by_node.values():
                on_node.sort(key=lambda s: s.facts.ref.uid in draining)
        pending: dict[ShareKey, list[SharePod]] = {}
        for sharer in snapshot.sharers:
            if sharer.is_pending:
                # Named in a users record, it is bound and admitted, and its slot is counted there:
                # the pending watch has not caught up with the shadows' (two watches keep no
                # order between them). Counted as asked too, it would make one shadow too many.
                if sharer.facts.ref.key not in recorded and sharer.facts.ref.key not in blocked:
                    pending.setdefault(sharer.key, []).append(sharer)
            elif sharer.holds_slots and sharer.facts.ref.key not in recorded:
                _count_unrecorded(sharer, by_node.get((sharer.node_name, sharer.key.kind, sharer.key.spec), ()), used)
        return cls(used, alive, pending, snapshot, draining, recorded)

    def taken_ordinals(self, key: ShareKey) -> set[int]:
        """Ordinals in use by any shadow of this key, or still named by a sharer's owner record."""
        if self._ordinals is None:
            names = {s.ref.name for s in self.snapshot.shadows}
            names |= {k.split("/", 1)[-1] for sharer in self.snapshot.sharers for k in sharer.owner_shadows}
            self._ordinals = {}
            for name in names:
                head, dash, tail = name.rpartition("-")
                # isdecimal, not isdigit: "²" is a digit that int() refuses, and owner records are
                # annotations a tenant can write.
                if dash and tail.isdecimal():
                    self._ordinals.setdefault(head + dash, set()).add(int(tail))
        return set(self._ordinals.get(shadow_name(key, 0)[:-1], ()))


def _count_unrecorded(sharer: SharePod, shadows: Iterable[ShadowPod], used: dict[str, int]) -> None:
    remaining = sharer.quantity
    for s in shadows:
        uid = s.facts.ref.uid
        take = min(remaining, max(0, s.key.spec - used[uid]))
        used[uid] += take
        remaining -= take
        if remaining == 0:
            break


def plan_shadows(
    snapshot: Snapshot,
    cfg: Config,
    now: float,
    empty_since: Mapping[str, float],
    placing: Placing | None = None,
    *,
    unplaceable: Collection[str] = frozenset(),
    blocked: Collection[str] = frozenset(),
) -> ShadowPlan:
    """Cluster-wide shadow demand (leader only). ``snapshot`` must hold the cluster's sharers and shadows.

    ``placing``: the previous plan's; a sharer that left the pending view since still takes a slot
    until its node records it (controller/share/placing.py). ``unplaceable``: pending pods the scheduler
    cannot place; any other pending sharer holds its key's drains (controller/share/shadow_drain.py).
    ``blocked``: pending pods the scheduler cannot place for reasons a shadow cannot cure
    (``cluster_view.blocked_elsewhere``): they ask for no shadow."""
    configured = configured_specs(cfg)
    index = _Demand.of(snapshot, blocked)
    used = index.used
    placed = track_placing(placing or {}, snapshot.sharers, index.recorded, now)
    taken_unseen = placing_slots(placed)
    actions: list[Action] = []
    new_empty: dict[str, float] = {}
    demand: list[KeyDemand] = []

    # The warm pool applies to every served spec of the default pool, and to any key in use.
    warm_keys = (
        {ShareKey(Pool(cfg.real_resources[0]), kind, n) for kind, n in configured} if cfg.warm_shadows else set()
    )
    for key in sorted(set(index.alive) | set(index.pending) | warm_keys):
        pending = index.pending.get(key, [])
        alive = sorted(index.alive.get(key, []), key=_ref_order)
        served = is_served(key, configured, cfg)
        if not served:
            # No new shadow; the ones left from an earlier config still idle out.
            actions += refuse_unserved(key, pending, cfg)
            pending = []
            if not alive:
                continue
        n = key.spec
        # A draining shadow's slots are on their way out (controller/share/shadow_drain.py).
        in_service = [s for s in alive if s.facts.ref.uid not in index.draining]
        free = max(0, sum(max(0, n - used[s.facts.ref.uid]) for s in in_service) - taken_unseen.get(key, 0))
        asked = sum(p.quantity for p in pending)
        target = asked + (cfg.warm_shadows * n if served else 0)
        leaving = [s for s in alive if s.facts.ref.uid in index.draining]
        in_flight = holds_drains(pending, unplaceable, placed, now)
        drains = plan_draining(leaving, used, create=max(0, -(-(target - free) // n)), hold=in_flight)
        actions += drains.actions
        free += sum(max(0, n - used[s.facts.ref.uid]) for s in drains.back)
        create = drains.create
        if create:
            reason = REASON_SHADOW_DEMAND if asked > free else REASON_WARM_POOL
            actions += _new_shadows(index, cfg, key, create, reason)
        clocks = {s.facts.ref.uid: empty_since.get(s.facts.ref.uid, now) for s in alive if used[s.facts.ref.uid] == 0}
        new_empty.update(clocks)
        if not in_flight:  # a pending sharer may be on its way to any of them: drain none
            idle = _idle_deletes(in_service, clocks, since=now - cfg.shadow_idle_timeout_s, spare=free - target, spec=n)
            actions += [start_drain(s, now) for s in idle]
        deletes = sum(isinstance(a, DeleteShadow) for a in drains.actions)
        demand.append(KeyDemand(key, len(alive), free, asked, create, deletes))
    return ShadowPlan(tuple(actions), new_empty, tuple(demand), placed)


def _new_shadows(index: _Demand, cfg: Config, key: ShareKey, count: int, reason: str) -> list[Action]:
    """Create ``count`` shadows of ``key`` under the lowest ordinals nobody uses or names."""
    taken = index.taken_ordinals(key)
    out: list[Action] = []
    ordinal = 0
    for _ in range(count):
        while ordinal in taken:
            ordinal += 1
        taken.add(ordinal)
        name = shadow_name(key, ordinal)
        out.append(CreateShadow(key, name, build_shadow_manifest(key, name, cfg), reason))
    return out


def _idle_deletes(
    alive: Iterable[ShadowPod], empty_since: Mapping[str, float], *, since: float, spare: int, spec: int
) -> list[ShadowPod]:
    """The shadows to remove: empty since ``since`` or before, the longest-idle first, while the rest cover the target.

    ``empty_since`` has a clock for every empty shadow (one first seen empty, also right
    after a restart, has only just started its clock). ``spare`` is free slots minus target
    and each removal takes ``spec`` slots, so a removal never triggers a create. Removal
    starts with draining (controller/share/shadow_drain.py), never with the delete.
    """
    idle = [(at, s) for s in alive if (at := empty_since.get(s.ref.uid)) is not None and at <= since]
    idle.sort(key=lambda t: (t[0], t[1].ref))
    out: list[ShadowPod] = []
    for _at, shadow in idle:
        if spare < spec:
            break
        out.append(shadow)
        spare -= spec
    return out


def unhealthy_shadows(
    shadows: Iterable[ShadowPod],
    mapping: MappingCache,
    vendor_unhealthy: Mapping[str, str],
    device_nodes: Mapping[str, tuple[str, ...]] | None = None,
) -> dict[str, str]:
    """Shadow (``ns/name``) -> why, for each shadow whose GPU cannot serve a sharer.

    Which GPU a shadow holds is kubelet's word (PodResources, ``mapping.real``). It cannot serve when
    kubelet no longer lists it allocatable (its plugin calls it Unhealthy), or when the shadow's
    running container has no device node of the vendor's GPUs (``device_nodes``): the node's
    container stack gave it none, so no sharer copying it could start CUDA either."""
    keys_here = {s.ref.key for s in shadows}
    seen = device_nodes or {}
    out: dict[str, str] = {}
    for held in mapping.real:
        key = held.pod.key
        if key not in keys_here:
            continue
        why = [
            f"GPU {rid} ({held.resource}) {vendor_unhealthy[rid]}" for rid in held.real_ids if rid in vendor_unhealthy
        ]
        rule = rule_for(held.resource)
        nodes = seen.get(key)
        if rule is not None and nodes is not None and not any(rule.per_gpu.fullmatch(p) for p in nodes):
            why.append(
                f"its container holds {held.resource} {', '.join(held.real_ids)} but has no {rule.vendor} GPU device "
                "node: the node's container stack gave it none (gpushare doctor says why; docs/nvidia.md)"
            )
        if why:
            out[key] = "; ".join(why)
    return out


def plan_node_shares(
    snapshot: Snapshot,
    mapping: MappingCache,
    cfg: Config,
    *,
    now: float | None = None,
    bindings: Mapping[BindingKey, str] | None = None,
) -> list[Action]:
    """This node's share plugins' device lists, cascade evictions (with their kills) and mapping records.

    ``now``: the wall clock, for how long a draining shadow's devices stay listed (None: no wait).
    ``bindings``: ``bind_holdings`` over the agent's stored bindings (controller/share/holdings.py);
    None binds from this snapshot alone, as an agent without a state file would.
    """
    node = snapshot.node_name
    actions: list[Action] = []
    shadows_here = snapshot.shadows_on(node)
    held = frozenset(h.shadow_key for h in mapping.holdings)
    holding = {h.sharer.key for h in mapping.holdings}
    sick = unhealthy_shadows(shadows_here, mapping, snapshot.vendor_unhealthy, snapshot.shadow_device_nodes)
    actions += [
        RecordEvent(
            s.ref, REASON_GPU_UNHEALTHY, f"{sick[s.ref.key]}: its share slots are advertised Unhealthy", "Warning"
        )
        for s in shadows_here
        if s.ref.key in sick
    ]
    for kind, n in sorted(configured_specs(cfg)):
        resource = keys.share_resource(kind, n)
        waiting = any(
            (s.key.kind, s.key.spec) == (kind, n) and s.holds_slots and s.ref.key not in holding
            for s in snapshot.sharers_on(node)
        )
        running = [s for s in shadows_here if _serves(s, snapshot) and (s.key.kind, s.key.spec) == (kind, n)]
        offered = [(s, virtual_ids_of(s.ref.namespace, s.ref.name, n)) for s in running]
        actions += plan_node_offer(resource, offered, held=held, waiting_for_admission=waiting, now=now, unhealthy=sick)

    sharers_here = {s.ref.key: s for s in snapshot.sharers_on(node)}
    if bindings is None:
        bindings = bind_holdings(snapshot, mapping, {})
    evicts = plan_cascade(snapshot, mapping, sharers_here, bindings)
    actions += _shadow_gone_kills(snapshot, mapping, sharers_here, bindings, evicts)
    actions += evicts
    actions += mapping.record_updates(shadows_here, sharers_here.values(), bindings)
    actions += refuse_unserved_bound(sharers_here.values(), cfg)
    return actions


def _serves(shadow: ShadowPod, snapshot: Snapshot) -> bool:
    """The shadow's slots are offered: kubelet reports it Running, or the NRI plugin holds its main
    container (``Snapshot.shadows_created``), whichever comes first.

    Not only once kubelet reports it: that follows the container's start by up to a second (PLEG),
    which the first sharer would wait before it is even placed. Not before its container is
    created either: a sharer's container takes its GPU from it, and the NRI plugin refuses one
    whose source does not exist yet (kubelet then retries only after a back-off).
    """
    if shadow.is_running:
        return True
    return shadow.facts.is_alive and bool(shadow.node_name) and shadow.ref.key in snapshot.shadows_created


def _shadow_gone_kills(
    snapshot: Snapshot,
    mapping: MappingCache,
    sharers_here: Mapping[str, SharePod],
    bindings: Mapping[BindingKey, str],
    evicts: Iterable[Evict],
) -> list[Action]:
    """Kill, through their pod cgroups, the sharers evicted now and those still terminating with a shadow gone.

    The delete alone is not enough: its grace period is the tenant's to set (an hour, say), and
    the GPU is no longer held for the pod. So the kill comes first, in the same pass as the
    eviction, and again every pass while the pod terminates, which also takes containers that
    kubelet restarts and ephemeral ones (the kill is of the whole pod cgroup).
    """
    targets = {e.ref.key: sharers_here[e.ref.key] for e in evicts if e.ref.key in sharers_here}
    by_key = ShadowsByKey(snapshot)
    for h in mapping.holdings:
        sharer = sharers_here.get(h.sharer.key)
        if sharer is None or not sharer.facts.is_terminating or sharer.ref.key in targets:
            continue
        bound = bindings.get((sharer.ref.uid, h.shadow_key))
        recorded = sharer.owner_shadows.get(h.shadow_key)
        # The same test as the cascade's: the agent's binding decides, the tenant's record may only add.
        if by_key.is_gone(h.shadow_key, bound) or (
            bool(recorded) and recorded != bound and by_key.is_gone(h.shadow_key, recorded)
        ):
            targets[sharer.ref.key] = sharer
    if not targets:
        return []
    pods = tuple(PodToKill(s.ref, sum(c.is_running for c in s.facts.containers)) for _, s in sorted(targets.items()))
    return [KillPods(pods, REASON_SHADOW_GONE)]


__all__ = [
    "KeyDemand",
    "ShadowPlan",
    "build_shadow_manifest",
    "plan_node_shares",
    "plan_shadows",
    "shadow_is_gone",
    "shadow_name",
]
