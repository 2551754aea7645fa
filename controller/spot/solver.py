"""Spot: lend an idle owner's GPU, and take it back the moment the owner returns (design §6).

``plan_spot`` is a plain function: the snapshot and mapping (who holds which real GPU,
who borrows it), the idle tracker's verdicts, this pass's kernel notices and what the
kernel module is doing now go in; per-GPU states and ordered actions come out.

States per real GPU of a lendable owner, one move per pass::

    busy --(idle for idleWindow, a return signal exists)--> away --(spot pod admitted)--> stolen
      ^                                                      |                              |
      +------------------------ back <-----------------------+------------------------------+
              (kernel notice from the owner's pid namespace, or utilization by a pod
               that is not a borrower)

``_step_owner`` picks each owner's move: ``_away``, ``_stolen`` and ``_busy`` (stay or
enter that state), ``_back`` (reclaim), and ``_withdrawn``, which sends any state to busy
when the owner stops lending or running and reclaims its borrowers. ``_step_unowned``
does the same for a GPU no lendable owner holds. Each move returns an ``_Outcome``, and
``plan_spot`` merges them into one ordered action list:

- back: ``spot-<id>`` Unhealthy, SIGKILL every task of every borrower pod, delete the
  borrower pods with the reason, then ``release`` the owner's held ioctl and ``undetect``;
- then Unhealthy for every device that must not take new spot pods,
- then the kernel module's watch list (``add``/``detect`` before a device turns Healthy,
  ``undetect``/``delete`` after it turned Unhealthy),
- then Healthy for the devices of away owners,
- and while lending is blocked (no pod cgroups to kill through) a Warning on the Node.

Besides the actions, the plan carries the *return table* (``SpotPlan.returns``): for every
owner the kernel module watches, the borrowers a notice from it must kill. The spot runtime
acts on a notice from that table at once, so the owner waits only for the kill; the pass that
the notice also wakes then runs the whole sequence above (the kill again finds nothing, the
release is a no-op) and does the API work.

Decisions the design leaves open (docs/controller.md): an owner container is away only
when *every* real GPU it holds is idle (the kernel signal is per pid namespace, not per
GPU); an owner is lent out only if its return can be seen (the kernel module watches its
pid namespace, or the metrics attribute GPU use to pods); unknown metrics never make an
owner away and never evict a borrower by themselves.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum

from controller.core.actions import (
    REASON_NOT_LENDABLE,
    REASON_OWNER_BACK,
    REASON_OWNER_LEFT,
    REASON_SPOT_BLOCKED,
    Action,
    Evict,
    KillPods,
    KmodCommand,
    PodToKill,
    RecordNodeEvent,
    SetSpotHealth,
)
from controller.core.detectors import IdleVerdict
from controller.core.mapping import MappingCache
from controller.core.model import Owner, Snapshot, SpotPod
from controller.core.pod_facts import PodFacts, PodRef
from gpushare.ids import format_spot_id
from gpushare.rules import ReturnSignal, return_signal

# What plan_spot takes and returns.


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
        return format_spot_id(self.real_id)


@dataclass(frozen=True)
class ReturnTarget:
    """A watched owner (its pid namespace armed in the kernel module) and what its return costs.

    The spot runtime keeps the latest pass's table of these, so a kernel notice starts the kill at
    once and releases the owner as soon as ``kill``'s pods have no task left, without a pass.
    ``kill`` is None when nothing is lent (the owner is only away): the owner is released at once.
    """

    pidns: int
    owner: str  # "ns/pod/container"
    real_ids: tuple[str, ...]
    kill: KillPods | None


@dataclass(frozen=True)
class SpotPlan:
    actions: tuple[Action, ...]
    gpus: tuple[GpuSpot, ...]
    # Real ID -> when its owner last came back; store it (state.py) and pass it back.
    back_at: Mapping[str, float]
    # Pid namespace -> what its notice must do now (ReturnTarget); hand it to the spot runtime.
    returns: Mapping[int, ReturnTarget] = field(default_factory=dict)
    # Wall-clock time at which an idle owner completes its window (the next pass is due then), if any.
    next_change_at: float | None = None

    @property
    def lent_real_ids(self) -> tuple[str, ...]:
        """GPUs lent out now (``PluginManager.set_spot_lent``: prefer idle devices over lent ones)."""
        return tuple(g.real_id for g in self.gpus if g.state == SpotState.STOLEN)


# The rules.


@dataclass(frozen=True)
class _Inputs:
    """What every transition reads: this pass's inputs, unchanged."""

    mapping: MappingCache
    spot_by_key: Mapping[str, SpotPod]
    verdicts: Mapping[str, IdleVerdict]
    notices: frozenset[int]
    kmod: KmodView
    back_at: Mapping[str, float]
    now: float
    idle_window_s: float
    blocked: str  # why spot may lend nothing on this node ("" when it may)
    pods: Mapping[str, PodFacts]  # every pod of the snapshot by "<ns>/<name>"

    def borrowers_of(self, rids: Iterable[str]) -> list[SpotPod]:
        """The pods holding ``spot-<id>`` of these GPUs and not finished, in pod order.

        kubelet's word makes a borrower, not the pod's role: a pod whose mix of requests the node
        refuses (``RefusedPod``) is reclaimed with the rest while it is being evicted.
        """
        found: dict[PodRef, SpotPod] = {}
        for rid in rids:
            for b in self.mapping.borrowers_of(rid):
                pod = self.spot_by_key.get(b.borrower.key)
                if pod is None and (facts := self.pods.get(b.borrower.key)) is not None:
                    pod = SpotPod(facts)
                if pod is not None and not pod.facts.is_terminal:
                    found[pod.ref] = pod
        return [found[r] for r in sorted(found)]


@dataclass(frozen=True)
class _Outcome:
    """What one owner (or one GPU without a lendable owner) adds to the plan."""

    gpus: tuple[GpuSpot, ...]
    # The return sequence, applied first: Unhealthy, kill, evict, then release/undetect.
    urgent: tuple[Action, ...] = ()
    healthy: frozenset[str] = frozenset()  # real IDs whose spot device turns Healthy
    detect: frozenset[int] = frozenset()  # pid namespaces the kernel module must watch
    undetected: frozenset[int] = frozenset()  # pid namespaces released and undetected in ``urgent``
    returned: tuple[str, ...] = ()  # real IDs whose owner came back in this pass
    armed: tuple[ReturnTarget, ...] = ()  # watched owners: what their kernel notice does at once
    due: float | None = None  # when this owner's idle window completes, if it is counting


def _gpus(
    owner: str, rids: Iterable[str], state: SpotState, why: str, pods: Iterable[SpotPod] = ()
) -> tuple[GpuSpot, ...]:
    borrowers = tuple(p.ref.key for p in pods)
    return tuple(GpuSpot(rid, state, owner, borrowers, why) for rid in rids)


def _reclaim(
    owner: str, rids: tuple[str, ...], pods: list[SpotPod], reason: str, message: str, *, state: SpotState
) -> _Outcome:
    """Take the GPUs back from their borrowers, in the order that keeps the owner safe.

    Unhealthy first (no new borrower), then kill through the pods' cgroups (not waiting on the
    API), then delete the pods with the reason; still-terminating pods are killed again (kubelet
    may restart a container until the delete reaches it).
    """
    urgent: list[Action] = [SetSpotHealth(rid, False, reason) for rid in rids]
    urgent += [_kill(pods, reason)] if pods else []
    urgent += [Evict(p.ref, reason, message) for p in pods if not p.facts.is_terminating]
    return _Outcome(_gpus(owner, rids, state, message, pods), tuple(urgent))


def _kill(pods: Iterable[SpotPod], reason: str) -> KillPods:
    return KillPods(tuple(PodToKill(p.ref, sum(c.is_running for c in p.facts.containers)) for p in pods), reason)


def _armed(owner: Owner, pods: list[SpotPod], inputs: _Inputs) -> tuple[ReturnTarget, ...]:
    """The owner's entry in the return table, while the kernel module watches it."""
    if not (inputs.kmod.available and owner.pidns is not None):
        return ()
    kill = _kill(pods, REASON_OWNER_BACK) if pods else None
    return (ReturnTarget(owner.pidns, owner.container_key, owner.real_ids, kill),)


def _back_signal(owner: Owner, pods: list[SpotPod], inputs: _Inputs) -> str:
    """Why the owner is back, or "" if it is not (design §6: kernel notice or non-borrower use)."""
    if owner.pidns is not None and owner.pidns in inputs.notices:
        return f"kernel notice: a GPU ioctl from {owner.container_key}"
    borrower_keys = frozenset(p.ref.key for p in pods)
    for rid in owner.real_ids:
        v = inputs.verdicts.get(rid)
        if v is not None and v.state == "active" and v.users is not None:
            strangers = sorted(v.users - borrower_keys)
            if strangers:
                return f"utilization on {rid} by {', '.join(strangers)}, not a borrower"
    return ""


def _is_watched(owner: Owner, inputs: _Inputs) -> bool:
    """The kernel module watches the owner, or holds a call of it right now (its notice came)."""
    return owner.pidns is not None and (owner.pidns in inputs.kmod.detecting or owner.pidns in inputs.notices)


def _window_ends(owner: Owner, inputs: _Inputs) -> float | None:
    """When every GPU of the owner has been idle for the whole window, counted from its last return
    if later; None while any GPU is not idle."""
    ends = []
    for rid in owner.real_ids:
        v = inputs.verdicts.get(rid)
        if v is None or v.state != "idle" or v.idle_since is None:
            return None
        # A return resets the clock even if the tracker's streak began before it: the owner's
        # held ioctl may not show up as utilization at all.
        ends.append(max(v.idle_since, inputs.back_at.get(rid, v.idle_since)) + inputs.idle_window_s)
    return max(ends, default=None)


def _can_see_return(owner: Owner, inputs: _Inputs) -> bool:
    """The kernel module can watch the owner, or the metrics attribute GPU use to pods."""
    named = all((v := inputs.verdicts.get(rid)) is not None and v.users is not None for rid in owner.real_ids)
    kmod_watches = inputs.kmod.available and owner.pidns is not None
    return return_signal(kmod_watches=kmod_watches, metrics_name_users=named) is not ReturnSignal.NONE


# -- transitions of a lendable owner's GPUs (module docstring) --------------------------------------------------


def _withdrawn(owner: Owner, pods: list[SpotPod]) -> _Outcome:
    """Any state -> busy: the owner stopped lending (label removed) or stopped running."""
    if pods:
        reason = REASON_NOT_LENDABLE if owner.is_running else REASON_OWNER_LEFT
        message = _left_message(owner.container_key, reason)
        return _reclaim(owner.container_key, owner.real_ids, pods, reason, message, state=SpotState.BUSY)
    why = "owner is not lendable" if not owner.is_lendable else "owner is not running"
    return _Outcome(_gpus(owner.container_key, owner.real_ids, SpotState.BUSY, why))


def _back(owner: Owner, pods: list[SpotPod], signal: str, inputs: _Inputs) -> _Outcome:
    """Away or stolen -> back: reclaim, then let the owner's held ioctl go and stop watching."""
    message = f"gpushare: the GPU's owner {owner.container_key} is back ({signal}); its GPU is no longer lent"
    out = _reclaim(owner.container_key, owner.real_ids, pods, REASON_OWNER_BACK, message, state=SpotState.BACK)
    if not (inputs.kmod.available and owner.pidns is not None):
        return replace(out, returned=owner.real_ids)
    # Only after every borrower process is dead may the owner's ioctl proceed.
    kmod = (KmodCommand("release", owner.pidns), KmodCommand("undetect", owner.pidns))
    return replace(out, urgent=out.urgent + kmod, undetected=frozenset({owner.pidns}), returned=owner.real_ids)


def _reclaiming(owner: Owner, pods: list[SpotPod]) -> _Outcome:
    """Back stays back while a borrower is still being deleted: kubelet may restart a killed
    container until the delete reaches it, so the device stays Unhealthy and every pass kills again;
    lending again now would hand the owner's GPU to the restarted container."""
    message = f"gpushare: the GPU of {owner.container_key} is being taken back from its borrowers"
    return _reclaim(owner.container_key, owner.real_ids, pods, REASON_OWNER_BACK, message, state=SpotState.BACK)


def _stolen(owner: Owner, pods: list[SpotPod], inputs: _Inputs) -> _Outcome:
    """Stolen stays stolen; unknown metrics (or lending blocked) close the device to new borrowers
    but keep this one."""
    rids = owner.real_ids
    known = all((v := inputs.verdicts.get(rid)) is not None and v.state != "unknown" for rid in rids)
    why = "lent" if known else "lent; metrics unknown, no new spot pods"
    if inputs.blocked:
        why = f"lent; no new spot pods: {inputs.blocked}"
    return _Outcome(
        _gpus(owner.container_key, rids, SpotState.STOLEN, why, pods),
        healthy=frozenset(rids) if known and not inputs.blocked else frozenset(),
        detect=_pidns_set(owner),
        armed=_armed(owner, pods, inputs),
    )


def _away(owner: Owner, inputs: _Inputs) -> _Outcome:
    """Busy -> away: idle for the whole window; the kernel module watches before the device turns Healthy."""
    why = f"idle for {inputs.idle_window_s:g}s"
    gpus = _gpus(owner.container_key, owner.real_ids, SpotState.AWAY, why)
    armed = _armed(owner, [], inputs)
    return _Outcome(gpus, healthy=frozenset(owner.real_ids), detect=_pidns_set(owner), armed=armed)


def _busy(owner: Owner, inputs: _Inputs, window_ends: float | None) -> _Outcome:
    """Busy stays busy: the owner's return could not be seen, lending is blocked on this node, or
    the metrics' verdict is not idle (yet: ``window_ends`` is when it will be)."""
    if not _can_see_return(owner, inputs):
        why = "no return signal: kernel module absent and metrics do not attribute GPU use to pods"
        return _Outcome(_gpus(owner.container_key, owner.real_ids, SpotState.BUSY, why))
    if inputs.blocked:
        return _Outcome(_gpus(owner.container_key, owner.real_ids, SpotState.BUSY, f"not lent: {inputs.blocked}"))
    gpus = []
    for rid in owner.real_ids:
        verdict = inputs.verdicts.get(rid)
        why = "metrics unknown" if verdict is None or verdict.state == "unknown" else f"owner {verdict.state}"
        gpus.append(GpuSpot(rid, SpotState.BUSY, owner.container_key, (), why))
    return _Outcome(tuple(gpus), due=window_ends)


def _step_owner(owner: Owner, inputs: _Inputs) -> _Outcome:
    """The move this owner's GPUs make in this pass (the state diagram of the module docstring)."""
    pods = inputs.borrowers_of(owner.real_ids)
    if not (owner.is_lendable and owner.is_running):
        return _withdrawn(owner, pods)
    # A return counts while the GPU is lent or the owner watched, not while it is merely busy.
    signal = _back_signal(owner, pods, inputs)
    if signal and (pods or _is_watched(owner, inputs)):
        return _back(owner, pods, signal, inputs)
    if any(p.facts.is_terminating for p in pods):
        return _reclaiming(owner, pods)
    if pods:
        return _stolen(owner, pods, inputs)
    ends = _window_ends(owner, inputs)
    if _can_see_return(owner, inputs) and not inputs.blocked and ends is not None and inputs.now >= ends:
        return _away(owner, inputs)
    return _busy(owner, inputs, ends)


def _step_unowned(rid: str, inputs: _Inputs) -> _Outcome:
    """A GPU with no lendable owner: a borrower there lost its owner, unless the holder is not in the cache yet.

    The owner's pod is gone, or a shadow or another tenant holds the GPU now.
    """
    pods = inputs.borrowers_of([rid])
    if pods and rid not in inputs.mapping.unresolved_real:
        reason = REASON_OWNER_LEFT if inputs.mapping.holder_of(rid) is None else REASON_NOT_LENDABLE
        return _reclaim("", (rid,), pods, reason, _left_message(f"of {rid}", reason), state=SpotState.BUSY)
    why = "holder not yet known" if rid in inputs.mapping.unresolved_real else "no lendable owner"
    return _Outcome(_gpus("", (rid,), SpotState.BUSY, why, pods))


def _pidns_set(owner: Owner) -> frozenset[int]:
    return frozenset() if owner.pidns is None else frozenset({owner.pidns})


def _kmod_commands(kmod: KmodView, notices: frozenset[int], added: set[int], outcomes: list[_Outcome]) -> list[Action]:
    """Bring the kernel module's watch list in step, after the urgent sequences of this pass."""
    undetected = frozenset().union(*(o.undetected for o in outcomes))
    detect = frozenset().union(*(o.detect for o in outcomes))
    detecting = kmod.detecting - undetected
    released = set(undetected)
    out: list[Action] = []
    # Notices nobody is waiting on (a stale watch, an owner not lent out): release at once.
    for pidns in sorted(notices - undetected - detect):
        out.append(KmodCommand("release", pidns))
        released.add(pidns)
    for pidns in sorted(detecting - detect):
        # A caller may be held right now (its notice still in flight): let it go, then stop watching.
        if pidns not in released:
            out.append(KmodCommand("release", pidns))
        out.append(KmodCommand("undetect", pidns))
    out += [KmodCommand("delete", p) for p in sorted(kmod.added - added)]
    out += [KmodCommand("add", p) for p in sorted((added | detect) - kmod.added)]
    out += [KmodCommand("detect", p) for p in sorted(detect - detecting)]
    return out


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
    lending_blocked: str = "",
) -> SpotPlan:
    """Decide every spot device's health, the kernel module's watch list and any reclaim.

    ``lending_blocked``: why nothing may be lent on this node (the spot runtime cannot find pod
    cgroups, so it could not kill a borrower); "" when lending is possible.
    """
    real_resources = tuple(real_resources)
    spot_by_key = {p.ref.key: p for p in snapshot.spot_pods}
    inputs = _Inputs(
        mapping,
        spot_by_key,
        verdicts,
        frozenset(notices),
        kmod,
        back_at,
        now,
        idle_window_s,
        lending_blocked,
        snapshot.pods,
    )
    owners = sorted(mapping.owners(snapshot, real_resources), key=lambda o: (o.ref, o.container))
    outcomes = [_step_owner(o, inputs) for o in owners]
    gpus = {g.real_id: g for o in outcomes for g in o.gpus}
    real_ids = sorted(
        {rid for r in real_resources for rid in snapshot.allocatable.get(r, ())}
        | {rid for o in owners for rid in o.real_ids}
        | {b.real_id for b in mapping.borrowings}
    )
    for rid in real_ids:
        if rid not in gpus:
            outcome = _step_unowned(rid, inputs)
            outcomes.append(outcome)
            gpus.update((g.real_id, g) for g in outcome.gpus)
    added = {o.pidns for o in owners if o.is_lendable and o.is_running and o.pidns is not None}
    actions = _ordered_actions(inputs, real_ids, gpus, outcomes, added)
    dues = [o.due for o in outcomes if o.due is not None and o.due > now]
    return SpotPlan(
        actions=tuple(actions),
        gpus=tuple(gpus[rid] for rid in sorted(gpus)),
        back_at={**back_at, **{rid: now for o in outcomes for rid in o.returned}},
        returns={t.pidns: t for o in outcomes for t in o.armed},
        next_change_at=min(dues, default=None),
    )


def _ordered_actions(
    inputs: _Inputs, real_ids: list[str], gpus: Mapping[str, GpuSpot], outcomes: list[_Outcome], added: set[int]
) -> list[Action]:
    """Reclaims first, then Unhealthy, the kernel module's watch list, Healthy (module docstring)."""
    urgent = [a for o in outcomes for a in o.urgent]
    healthy = set().union(*(o.healthy for o in outcomes))
    already_unhealthy = {a.real_id for a in urgent if isinstance(a, SetSpotHealth)}
    actions = list(urgent)
    actions += [
        SetSpotHealth(rid, False, gpus[rid].reason)
        for rid in real_ids
        if rid not in healthy and rid not in already_unhealthy
    ]
    if inputs.kmod.available:
        actions += _kmod_commands(inputs.kmod, inputs.notices, added, outcomes)
    actions += [SetSpotHealth(rid, True, gpus[rid].reason) for rid in sorted(healthy)]
    if inputs.blocked:
        message = f"gpushare: spot lends no GPU on this node: {inputs.blocked}"
        actions.append(RecordNodeEvent(REASON_SPOT_BLOCKED, message))
    return actions


def _left_message(owner: str, reason: str) -> str:
    if reason == REASON_NOT_LENDABLE:
        return f"gpushare: the GPU {owner} is no longer lendable (label removed or held by another pod); spot ends"
    return f"gpushare: the owner {owner} released its GPU; a spot pod may not keep a GPU nobody lends"


__all__ = [
    "GpuSpot",
    "KmodView",
    "ReturnTarget",
    "SpotPlan",
    "SpotState",
    "plan_spot",
]
