"""Spot: lend an idle owner's GPU, and take it back the moment the owner returns (design §6).

``plan_spot`` is a plain function: the snapshot and mapping (who holds which real GPU,
who borrows it), the idle tracker's verdicts, this pass's kernel notices and what the
kernel module is doing now go in; per-GPU states and ordered actions come out.

States per real GPU of a lendable owner::

    busy --(idle for idleWindow, a return signal exists)--> away --(spot pod admitted)--> stolen
      ^                                                      |                              |
      +------------------------ back <-----------------------+------------------------------+
              (kernel notice from the owner's pid namespace, or utilization by a pod
               that is not a borrower)

Action order matters and the loop applies the list in order:

- back: ``spot-<id>`` Unhealthy, SIGKILL every borrower container, delete the borrower
  pods with the reason, then ``release`` the owner's held ioctl and ``undetect``;
- then Unhealthy for every device that must not take new spot pods,
- then the kernel module's watch list (``add``/``detect`` before a device turns Healthy,
  ``undetect``/``delete`` after it turned Unhealthy),
- then Healthy for the devices of away owners.

Decisions the design leaves open (docs/controller.md): an owner container is away only
when *every* real GPU it holds is idle (the kernel signal is per pid namespace, not per
GPU); an owner is lent out only if its return can be seen (the kernel module watches its
pid namespace, or the metrics attribute GPU use to pods); unknown metrics never make an
owner away and never evict a borrower by themselves.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from controller.core.actions import (
    REASON_NOT_LENDABLE,
    REASON_OWNER_BACK,
    REASON_OWNER_LEFT,
    Action,
    Evict,
    KillContainers,
    KmodCommand,
    SetSpotHealth,
)
from controller.core.detectors import IdleState, IdleStatus
from controller.core.mapping import Borrowing, MappingCache
from controller.core.model import PHASE_RUNNING, Owner, PodRef, Snapshot, SpotPod, is_shadow
from gpushare import keys

VerdictState = Literal["idle", "active", "unknown"]


@dataclass(frozen=True)
class IdleVerdict:
    """The idle tracker's view of one real GPU, as plain data.

    ``idle``: utilization at or below the threshold in every sample since ``idle_since``
    (samples cover that span). ``active``: above the threshold now. ``unknown``: metrics
    missing or invalid — never idle (gpu-metrics.md §4).

    ``users`` are the pods (``ns/name``) whose *processes* use the GPU now, when the source
    can attribute at process level; ``None`` when it cannot. An exporter that labels a
    device with the pod it is *allocated* to must give ``None``: a borrower's work would
    otherwise look like the owner's.
    """

    real_id: str
    state: VerdictState
    idle_since: float | None = None
    users: frozenset[str] | None = None


def verdict_from_status(real_id: str, status: IdleStatus, *, is_process_level: bool) -> IdleVerdict:
    """The ``IdleDetector``'s status of a device as the verdict ``plan_spot`` takes.

    ``is_process_level``: the source's workloads name the pods whose processes use the
    device (NVML process lists, a test's fake exporter); False for exporters that label the
    pod the device is allocated to (dcgm-exporter and most vendor exporters).
    """
    users = frozenset(f"{w.namespace}/{w.pod}" for w in status.workloads) if is_process_level else None
    if status.state in (IdleState.IDLE, IdleState.IDLING) and status.idle_since is not None:
        return IdleVerdict(real_id, "idle", status.idle_since, users)
    if status.state is IdleState.BUSY:
        return IdleVerdict(real_id, "active", None, users)
    return IdleVerdict(real_id, "unknown", None, None)


@dataclass(frozen=True)
class KmodView:
    """What the kernel module does now, as the loop last applied it (empty after a restart)."""

    available: bool
    added: frozenset[int] = frozenset()
    detecting: frozenset[int] = frozenset()


class SpotState(StrEnum):
    BUSY = "busy"
    AWAY = "away"
    STOLEN = "stolen"
    BACK = "back"


@dataclass(frozen=True)
class GpuSpot:
    """The outcome for one real GPU, for logs and ``gpushare status``."""

    real_id: str
    state: SpotState
    owner: str  # "ns/pod/container", or "" when no lendable owner holds it
    borrowers: tuple[str, ...]
    reason: str

    @property
    def device_id(self) -> str:
        return keys.SPOT_DEVICE_PREFIX + self.real_id


@dataclass(frozen=True)
class SpotPlan:
    actions: tuple[Action, ...]
    gpus: tuple[GpuSpot, ...]
    # Real ID -> when its owner last came back; store it (state.py) and pass it back.
    back_at: Mapping[str, float]

    @property
    def lent_real_ids(self) -> tuple[str, ...]:
        """GPUs lent out now (``PluginManager.set_spot_lent``: prefer idle devices over lent ones)."""
        return tuple(g.real_id for g in self.gpus if g.state == SpotState.STOLEN)


def owners_from(snapshot: Snapshot, mapping: MappingCache, real_resources: Iterable[str]) -> tuple[Owner, ...]:
    """Every non-shadow container holding real GPUs on this node, with its lendable flag and pidns."""
    wanted = frozenset(real_resources)
    out: list[Owner] = []
    for h in mapping.real:
        facts = snapshot.pods.get(h.pod.key)
        if facts is None or h.resource not in wanted or is_shadow(facts):
            continue
        container = next((c for c in facts.containers if c.name == h.container), None)
        cid = container.container_id if container else ""
        lendable = (
            facts.labels.get(keys.LABEL_LENDABLE) == "true" or facts.ref.namespace in snapshot.lendable_namespaces
        )
        out.append(
            Owner(
                ref=facts.ref,
                container=h.container,
                resource=h.resource,
                real_ids=h.real_ids,
                is_lendable=lendable,
                is_running=facts.phase == PHASE_RUNNING and facts.is_alive,
                pidns=snapshot.pidns_by_container.get(cid) if cid else None,
            )
        )
    return tuple(out)


def _back_signal(
    owner: Owner, verdicts: Mapping[str, IdleVerdict], borrower_keys: frozenset[str], notices: frozenset[int]
) -> str:
    """Why the owner is back, or "" if it is not (design §6: kernel notice or non-borrower use)."""
    if owner.pidns is not None and owner.pidns in notices:
        return f"kernel notice: a GPU ioctl from {owner.container_key}"
    for rid in owner.real_ids:
        v = verdicts.get(rid)
        if v is not None and v.state == "active" and v.users is not None:
            strangers = sorted(v.users - borrower_keys)
            if strangers:
                return f"utilization on {rid} by {', '.join(strangers)}, not a borrower"
    return ""


def _is_idle_for_window(
    owner: Owner, verdicts: Mapping[str, IdleVerdict], back_at: Mapping[str, float], now: float, window_s: float
) -> bool:
    for rid in owner.real_ids:
        v = verdicts.get(rid)
        if v is None or v.state != "idle" or v.idle_since is None:
            return False
        # A return resets the clock even if the tracker's streak began before it: the owner's
        # held ioctl may not show up as utilization at all.
        start = max(v.idle_since, back_at.get(rid, v.idle_since))
        if now - start < window_s:
            return False
    return True


def _can_see_return(owner: Owner, verdicts: Mapping[str, IdleVerdict], kmod: KmodView) -> bool:
    if kmod.available and owner.pidns is not None:
        return True
    return all((v := verdicts.get(rid)) is not None and v.users is not None for rid in owner.real_ids)


def plan_spot(
    snapshot: Snapshot,
    mapping: MappingCache,
    *,
    real_resources: Iterable[str],
    verdicts: Mapping[str, IdleVerdict],
    notices: Iterable[int],
    kmod: KmodView,
    back_at: Mapping[str, float],
    now: float,
    idle_window_s: float,
) -> SpotPlan:
    """Decide every spot device's health, the kernel module's watch list and any reclaim."""
    real_resources = tuple(real_resources)
    notice_set = frozenset(notices)
    spot_by_key = {p.ref.key: p for p in snapshot.spot_pods}
    owners = owners_from(snapshot, mapping, real_resources)
    real_ids = sorted(
        {rid for r in real_resources for rid in snapshot.allocatable.get(r, ())}
        | {rid for o in owners for rid in o.real_ids}
        | {b.real_id for b in mapping.borrowings}
    )

    def borrowers_of(rids: Iterable[str]) -> list[SpotPod]:
        found: dict[PodRef, SpotPod] = {}
        for rid in rids:
            for b in mapping.borrowers_of(rid):
                pod = spot_by_key.get(b.borrower.key)
                if pod is not None and not pod.facts.is_terminal:
                    found[pod.ref] = pod
        return [found[r] for r in sorted(found)]

    # Urgent sequences first: [Unhealthy..., kill..., evict..., release/undetect...] per reclaim.
    urgent: list[Action] = []
    gpus: dict[str, GpuSpot] = {}
    new_back_at = dict(back_at)
    undetected_now: set[int] = set()
    away_pidns: set[int] = set()
    detect_pidns: set[int] = set()
    add_pidns: set[int] = set()
    healthy: set[str] = set()

    def reclaim(
        owner_key: str, rids: tuple[str, ...], pods: list[SpotPod], reason: str, message: str, *, state: SpotState
    ) -> None:
        # Unhealthy first (no new borrower), then kill through cgroups (not waiting on the
        # API), then delete the pods with the reason; still-terminating pods are killed again.
        urgent.extend(SetSpotHealth(rid, False, reason) for rid in rids)
        urgent.extend(KillContainers(p.ref, p.container_ids, reason) for p in pods if p.container_ids)
        urgent.extend(Evict(p.ref, reason, message) for p in pods if not p.facts.is_terminating)
        for rid in rids:
            gpus[rid] = GpuSpot(rid, state, owner_key, tuple(p.ref.key for p in pods), message)

    for owner in sorted(owners, key=lambda o: (o.ref, o.container)):
        rids = owner.real_ids
        pods = borrowers_of(rids)
        borrower_keys = frozenset(p.ref.key for p in pods)
        if owner.is_lendable and owner.is_running and owner.pidns is not None:
            add_pidns.add(owner.pidns)
        if not (owner.is_lendable and owner.is_running):
            if pods:
                reason = REASON_NOT_LENDABLE if owner.is_running else REASON_OWNER_LEFT
                reclaim(
                    owner.container_key,
                    rids,
                    pods,
                    reason,
                    _left_message(owner.container_key, reason),
                    state=SpotState.BUSY,
                )
            else:
                why = "owner is not lendable" if not owner.is_lendable else "owner is not running"
                for rid in rids:
                    gpus[rid] = GpuSpot(rid, SpotState.BUSY, owner.container_key, (), why)
            continue

        signal = _back_signal(owner, verdicts, borrower_keys, notice_set)
        was_watched = owner.pidns is not None and owner.pidns in kmod.detecting
        if signal and (pods or was_watched or (owner.pidns is not None and owner.pidns in notice_set)):
            message = f"gpushare: the GPU's owner {owner.container_key} is back ({signal}); its GPU is no longer lent"
            reclaim(owner.container_key, rids, pods, REASON_OWNER_BACK, message, state=SpotState.BACK)
            if kmod.available and owner.pidns is not None:
                # Only after every borrower process is dead may the owner's ioctl proceed.
                urgent.append(KmodCommand("release", owner.pidns))
                urgent.append(KmodCommand("undetect", owner.pidns))
                undetected_now.add(owner.pidns)
            for rid in rids:
                new_back_at[rid] = now
            continue

        if pods:
            known = all((v := verdicts.get(rid)) is not None and v.state != "unknown" for rid in rids)
            for rid in rids:
                gpus[rid] = GpuSpot(
                    rid,
                    SpotState.STOLEN,
                    owner.container_key,
                    tuple(p.ref.key for p in pods),
                    "lent" if known else "lent; metrics unknown, no new spot pods",
                )
            if known:
                healthy.update(rids)
            if owner.pidns is not None:
                detect_pidns.add(owner.pidns)
            continue

        if not _can_see_return(owner, verdicts, kmod):
            why = "no return signal: kernel module absent and metrics do not attribute GPU use to pods"
            for rid in rids:
                gpus[rid] = GpuSpot(rid, SpotState.BUSY, owner.container_key, (), why)
            continue
        if _is_idle_for_window(owner, verdicts, back_at, now, idle_window_s):
            for rid in rids:
                gpus[rid] = GpuSpot(rid, SpotState.AWAY, owner.container_key, (), f"idle for {idle_window_s:g}s")
            healthy.update(rids)
            if owner.pidns is not None:
                detect_pidns.add(owner.pidns)
                away_pidns.add(owner.pidns)
            continue
        for rid in rids:
            state = verdicts.get(rid)
            why = "metrics unknown" if state is None or state.state == "unknown" else f"owner {state.state}"
            gpus[rid] = GpuSpot(rid, SpotState.BUSY, owner.container_key, (), why)

    # GPUs with no lendable owner: a borrower there lost its owner (pod gone, or a shadow or
    # another tenant holds the GPU now), unless the holder is a pod we cannot see yet.
    for rid in real_ids:
        if rid in gpus:
            continue
        pods = borrowers_of([rid])
        holder = mapping.holder_of(rid)
        if pods and rid not in mapping.unresolved_real:
            reason = REASON_OWNER_LEFT if holder is None else REASON_NOT_LENDABLE
            reclaim("", (rid,), pods, reason, _left_message(f"of {rid}", reason), state=SpotState.BUSY)
        else:
            why = "holder not yet known" if rid in mapping.unresolved_real else "no lendable owner"
            gpus[rid] = GpuSpot(rid, SpotState.BUSY, "", tuple(p.ref.key for p in pods), why)

    actions: list[Action] = list(urgent)
    already_unhealthy = {a.real_id for a in urgent if isinstance(a, SetSpotHealth)}
    for rid in real_ids:
        if rid not in healthy and rid not in already_unhealthy:
            actions.append(SetSpotHealth(rid, False, gpus[rid].reason))
    if kmod.available:
        detecting = kmod.detecting - undetected_now
        released = set(undetected_now)
        # Notices nobody is waiting on (a stale watch, an owner not lent out): release at once.
        for pidns in sorted(notice_set - undetected_now):
            if pidns not in away_pidns and pidns not in detect_pidns:
                actions.append(KmodCommand("release", pidns))
                released.add(pidns)
        for pidns in sorted(detecting - detect_pidns):
            # A caller may be held right now (its notice still in flight): let it go, then stop watching.
            if pidns not in released:
                actions.append(KmodCommand("release", pidns))
            actions.append(KmodCommand("undetect", pidns))
        actions += [KmodCommand("delete", p) for p in sorted(kmod.added - add_pidns)]
        actions += [KmodCommand("add", p) for p in sorted((add_pidns | detect_pidns) - kmod.added)]
        actions += [KmodCommand("detect", p) for p in sorted(detect_pidns - detecting)]
    for rid in sorted(healthy):
        actions.append(SetSpotHealth(rid, True, gpus[rid].reason))
    return SpotPlan(tuple(actions), tuple(gpus[rid] for rid in sorted(gpus)), new_back_at)


def _left_message(owner: str, reason: str) -> str:
    if reason == REASON_NOT_LENDABLE:
        return f"gpushare: the GPU {owner} is no longer lendable (label removed or held by another pod); spot ends"
    return f"gpushare: the owner {owner} released its GPU; a spot pod may not keep a GPU nobody lends"


def borrowing_pods(mapping: MappingCache) -> dict[str, tuple[Borrowing, ...]]:
    """Real ID -> borrowings, for ``gpushare status``."""
    out: dict[str, list[Borrowing]] = {}
    for b in mapping.borrowings:
        out.setdefault(b.real_id, []).append(b)
    return {k: tuple(v) for k, v in out.items()}


__all__ = [
    "GpuSpot",
    "IdleVerdict",
    "KmodView",
    "SpotPlan",
    "SpotState",
    "borrowing_pods",
    "owners_from",
    "plan_spot",
    "verdict_from_status",
]
