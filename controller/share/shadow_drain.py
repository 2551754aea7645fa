"""Taking an idle shadow out of service so that no sharer is bound on capacity that is leaving.

The scheduler places a sharer by the node's allocatable ``gpushare/share-<kind>-<N>``; kubelet
admits it by the device list our share plugin sends on ListAndWatch. Kubelet publishes a new
allocatable only with its next node status (every ``nodeStatusUpdateFrequency``), so when a
shadow's virtual devices leave the list the scheduler keeps offering them for up to that long,
and a sharer bound in that window fails admission (``UnexpectedAdmissionError``). Deleting the
shadow is what withdrew them, so a sharer created right after a shadow went lost the race.

The removal therefore runs in this order (docs/scale.md, "Shadow removal order"):

1. the leader marks the idle shadow draining (a token in ``ANNOTATION_SHADOW_DRAINING``) and
   stops counting its slots;
2. the node agent publishes the lower count in the node's allocatable itself, notes when
   (``ANNOTATION_SHADOW_DRAINED`` = ``<token> published <its clock>``) and keeps the devices
   listed for ``DRAIN_SETTLE_S`` from then, so a sharer the scheduler placed on the old count
   is still admitted; it withdraws them only when that has passed, in the gap after kubelet
   last wrote the full count back (``in_write_back_gap``), and while no sharer bound to the
   node waits for admission, publishes the count again and answers with the bare token;
3. the leader deletes the shadow (confirmed from fresh LISTs like every deletion).

Before the node withdraws, a fresh LIST of its pods confirms that no sharer bound to it still
waits for admission on that resource (``sharers_waiting``, ``hold_withdrawals``): the watch the
pass read may not show a sharer the scheduler bound a moment ago.

A sharer that lands on a draining shadow anyway makes it busy: the leader takes the mark off,
and so it does when new demand can use a draining shadow instead of creating one.

**A sharer on its way.** The settle time assumes that a sharer the scheduler placed on the
old count is bound within it. Not so while the scheduler's own client is backlogged: the
binding waits for the client's QPS (17 s on average while 8,000 sharers were placed on 1,000
simulated nodes), the fresh LIST cannot show it, and the devices went. So while any sharer
of a key is pending, the leader starts no drain of that key's shadows and takes every
draining one back into service (``plan_draining(hold=True)``): the scheduler may have placed
that sharer on any of them. A pending sharer the scheduler has said it cannot place
(``PodScheduled`` False) holds nothing up, so one that never fits keeps no idle shadow alive;
nor does one left pending for ``DRAIN_HOLD_MAX_S`` with no answer at all (a tenant's sharer
naming a scheduler that does not exist is never answered, and would hold its key's drains,
and so their GPUs, for ever).
Pure module: stdlib and controller.core only.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TypeGuard

from controller.core.actions import (
    REASON_SHADOW_IDLE,
    Action,
    AnnotatePod,
    DeleteShadow,
    PublishCapacity,
    SetDevices,
)
from controller.core.model import ShadowPod, SharePod
from controller.share.placing import Seen
from gpushare import keys
from gpushare.ids import virtual_ids_of

# How long the node keeps a draining shadow's devices listed after it published the lower
# count: a sharer the scheduler placed on the old count before the lower one reached its cache
# is bound, and seen on the node's watch, within this even on a machine under heavy load, but
# not while the scheduler's own client is backlogged, hence no drain while a sharer of the key
# is pending ("A sharer on its way" above).
DRAIN_SETTLE_S = 5.0
# A pending sharer holds its key's drains this long at most after the leader first saw it: well
# past the sharers' create-to-bound times (68 s median, 110 s p90) while 8,000 of them were
# placed on 1,000 simulated nodes behind the scheduler's QPS.
DRAIN_HOLD_MAX_S = 300.0
# When a withdrawal may happen, by the last time the agent lowered a count kubelet had written
# back: only from WRITE_BACK_SETTLE_S to WRITE_BACK_SETTLE_S + WITHDRAW_WINDOW_S after it.
# Before: a sharer the scheduler placed in the milliseconds the full count showed is bound,
# and in the fresh LIST, well within 2 s. After: kubelet's next node status (every
# ``nodeStatusUpdateFrequency``, 10 s by default, 4 s in the test clusters) may be computed
# from the device list before the withdrawal reaches it and land just after, showing the
# full count with the devices already gone; in the middle of the gap it cannot.
WRITE_BACK_SETTLE_S = 2.0
WITHDRAW_WINDOW_S = 1.0
# Write-backs govern one drain at most this long after its publish, whatever kubelet does
# (a status period under 3 s, or none seen): past it, the fresh LIST alone guards.
WRITE_BACK_HOLD_MAX_S = 30.0
_PUBLISHED = " published "


def drain_token(shadow: ShadowPod) -> str | None:
    """The leader's mark on a shadow it is removing, or None."""
    return shadow.facts.annotations.get(keys.ANNOTATION_SHADOW_DRAINING) or None


def is_draining(shadow: ShadowPod) -> bool:
    return drain_token(shadow) is not None


def is_drained(shadow: ShadowPod) -> bool:
    """The node agent answered this very mark: the devices are withdrawn, the lower count published."""
    token = drain_token(shadow)
    return token is not None and shadow.facts.annotations.get(keys.ANNOTATION_SHADOW_DRAINED) == token


def start_drain(shadow: ShadowPod, now: float) -> AnnotatePod:
    return AnnotatePod(shadow.ref, keys.ANNOTATION_SHADOW_DRAINING, f"{now:.3f}")


def undrain(shadow: ShadowPod) -> list[Action]:
    """Both marks off: the node offers the devices again, and an old answer cannot pass for a new one."""
    out: list[Action] = [AnnotatePod(shadow.ref, keys.ANNOTATION_SHADOW_DRAINING, None)]
    if keys.ANNOTATION_SHADOW_DRAINED in shadow.facts.annotations:
        out.append(AnnotatePod(shadow.ref, keys.ANNOTATION_SHADOW_DRAINED, None))
    return out


@dataclass(frozen=True)
class DrainPlan:
    actions: tuple[Action, ...]
    create: int  # shadows still to create after reusing draining ones
    back: tuple[ShadowPod, ...]  # draining shadows taken back into service (they offer slots again)


def holds_drains(
    pending: Iterable[SharePod], unplaceable: Collection[str], placed: Mapping[str, Seen], now: float
) -> bool:
    """Leader: a pending sharer of the key may be on its way to one of its shadows ("A sharer on its way")."""
    for p in pending:
        seen = placed.get(p.facts.ref.key)
        if p.facts.ref.key not in unplaceable and (seen is None or now - seen.since < DRAIN_HOLD_MAX_S):
            return True
    return False


def plan_draining(
    draining: Sequence[ShadowPod], used: Mapping[str, int], *, create: int, hold: bool = False
) -> DrainPlan:
    """Leader: what becomes of the shadows of one key that are draining.

    ``create``: the shadows the key is short of, counting only the shadows in service. A busy
    draining shadow goes back into service; so do idle ones while the key is short, the ones
    whose devices are still listed first (no wait for kubelet); a drained idle one is deleted.
    ``hold``: a sharer of the key is pending that the scheduler may already have placed on
    one of them: every one goes back into service, its devices listed again if withdrawn.
    """
    actions: list[Action] = []
    back: list[ShadowPod] = []
    idle = [s for s in draining if used[s.facts.ref.uid] == 0]
    for s in draining:
        if used[s.facts.ref.uid] > 0:
            actions += undrain(s)
            back.append(s)
    reuse = sorted(idle, key=is_drained)[: len(idle) if hold else max(0, create)]
    for s in reuse:
        actions += undrain(s)
        back.append(s)
    actions += [DeleteShadow(s.ref, REASON_SHADOW_IDLE) for s in idle if s not in reuse and is_drained(s)]
    return DrainPlan(tuple(actions), max(0, create - len(reuse)), tuple(back))


def plan_node_offer(
    resource: str,
    shadows: Iterable[tuple[ShadowPod, Sequence[str]]],
    *,
    held: frozenset[str],
    waiting_for_admission: bool,
    now: float | None,
    unhealthy: Collection[str] = frozenset(),
) -> list[Action]:
    """Node: one share resource's device list, then, while a shadow drains, the count to publish and the answer.

    ``unhealthy``: shadows (``ns/name``) whose GPU its vendor plugin lists Unhealthy: their slots
    stay listed, Unhealthy, so kubelet admits no new sharer on them and keeps the ones running.
    ``shadows``: this node's running shadows of ``resource`` with their virtual IDs;
    ``held``: shadows (``ns/name``) some admitted sharer holds a device of (PodResources);
    ``waiting_for_admission``: a sharer of this resource is bound here but holds nothing yet;
    ``now``: this node's clock, for the settle time (None: no settle time).
    """
    shadows = list(shadows)
    ids: list[str] = []
    settling = 0
    answers: list[Action] = []
    draining_here = False
    for shadow, vids in shadows:
        token = drain_token(shadow)
        if token is None or shadow.ref.key in held:
            ids += vids  # a busy draining shadow stays offered: the leader takes the mark off
            continue
        draining_here = True
        if is_drained(shadow):
            continue  # withdrawn
        published = _published_at(shadow, token)
        if now is not None and published is None:  # first sight of the mark: publish, note when
            ids += vids
            settling += len(vids)
            answers.append(AnnotatePod(shadow.ref, keys.ANNOTATION_SHADOW_DRAINED, f"{token}{_PUBLISHED}{now:.3f}"))
        elif waiting_for_admission or (now is not None and published is not None and now - published < DRAIN_SETTLE_S):
            ids += vids
            settling += len(vids)
        else:
            answers.append(AnnotatePod(shadow.ref, keys.ANNOTATION_SHADOW_DRAINED, token))
    # Withdraw, then publish the lower count, then tell the leader: the order the removal needs.
    sick = {vid for shadow, vids in shadows if shadow.ref.key in unhealthy for vid in vids}
    out: list[Action] = [SetDevices(resource, tuple(sorted(ids)), tuple(sorted(sick.intersection(ids))))]
    if draining_here:
        out.append(PublishCapacity(resource, len(ids) - settling))
    return [*out, *answers]


def in_write_back_gap(lowered_at: float | None, now: float) -> bool:
    """``now`` is in the window after the agent last lowered a written-back count (``lowered_at``)."""
    return lowered_at is not None and WRITE_BACK_SETTLE_S <= now - lowered_at < WRITE_BACK_SETTLE_S + WITHDRAW_WINDOW_S


def write_backs_may_hold(shadow: ShadowPod, now: float) -> bool:
    """Write-backs of the full count may still govern this draining shadow's withdrawal.

    Only for ``WRITE_BACK_HOLD_MAX_S`` after the node published the lower count for this mark,
    so that a kubelet that writes back too often for the gap (or not at all) cannot keep an
    idle shadow forever.
    """
    token = drain_token(shadow)
    published = None if token is None else _published_at(shadow, token)
    return published is not None and now - published < WRITE_BACK_HOLD_MAX_S


def withdrawn_now(actions: Iterable[Action]) -> list[AnnotatePod]:
    """The answers of a node plan that withdraw a draining shadow's devices in this very pass."""
    return [a for a in actions if _is_withdrawal(a)]


def _is_withdrawal(action: Action) -> TypeGuard[AnnotatePod]:
    # The bare token answers a mark; "<token> published <when>" only notes the publish.
    return (
        isinstance(action, AnnotatePod)
        and action.key == keys.ANNOTATION_SHADOW_DRAINED
        and action.value is not None
        and _PUBLISHED not in action.value
    )


def published_counts(actions: Iterable[Action]) -> dict[str, int]:
    """The counts a node plan publishes while shadows drain: what its Node watch keeps lowered."""
    return {a.resource: a.count for a in actions if isinstance(a, PublishCapacity)}


def sharers_waiting(sharers: Iterable[SharePod], holding: frozenset[str]) -> frozenset[str]:
    """The share resources some sharer bound here waits for admission on.

    ``sharers``: the node's sharers (from a fresh LIST); ``holding``: the sharers (``ns/name``)
    PodResources shows holding a device. One bound and not finished that holds nothing is waiting.
    """
    return frozenset(s.key.resource for s in sharers if s.holds_slots and s.ref.key not in holding)


def hold_withdrawals(
    actions: Sequence[Action], shadows: Iterable[ShadowPod], waiting: frozenset[str] | None
) -> list[Action]:
    """The node plan with the withdrawals on a resource in ``waiting`` taken back (None: all of them).

    A withdrawal taken back keeps its shadow's devices listed and drops the answer, so the next
    pass decides again; the count to publish stays as it was, since a shadow whose devices are
    still listed only for a late sharer counts as settling, not as offered.
    """
    by_ref = {s.ref: s for s in shadows}
    back: dict[str, list[str]] = {}
    dropped: set[int] = set()
    for i, action in enumerate(actions):
        if not _is_withdrawal(action):
            continue
        shadow = by_ref.get(action.ref)
        if shadow is None or (waiting is not None and shadow.key.resource not in waiting):
            continue
        back.setdefault(shadow.key.resource, []).extend(
            virtual_ids_of(shadow.ref.namespace, shadow.ref.name, shadow.key.spec)
        )
        dropped.add(i)
    return [_with_ids(a, back) for i, a in enumerate(actions) if i not in dropped]


def _with_ids(action: Action, back: Mapping[str, Sequence[str]]) -> Action:
    if not isinstance(action, SetDevices) or action.resource not in back:
        return action
    return replace(action, ids=tuple(sorted({*action.ids, *back[action.resource]})))


def _published_at(shadow: ShadowPod, token: str) -> float | None:
    """When this node published the lower count for this very mark, by its own clock; None if not yet."""
    head, sep, when = shadow.facts.annotations.get(keys.ANNOTATION_SHADOW_DRAINED, "").partition(_PUBLISHED)
    if not sep or head != token:
        return None
    try:
        return float(when)
    except ValueError:
        return None


__all__ = [
    "DRAIN_HOLD_MAX_S",
    "DRAIN_SETTLE_S",
    "WITHDRAW_WINDOW_S",
    "WRITE_BACK_HOLD_MAX_S",
    "WRITE_BACK_SETTLE_S",
    "DrainPlan",
    "drain_token",
    "hold_withdrawals",
    "holds_drains",
    "in_write_back_gap",
    "is_drained",
    "is_draining",
    "plan_draining",
    "plan_node_offer",
    "published_counts",
    "sharers_waiting",
    "start_drain",
    "undrain",
    "withdrawn_now",
    "write_backs_may_hold",
]
