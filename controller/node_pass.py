"""The node's part of a reconcile pass: spot's plan, then the share plugins' lists, cascade and records,
then the pods the node will not run (``controller.core.refusals``).

Every agent runs it for its own node. The parts of a pass fail on their own (``PassParts``):
an exception in the leader's cluster plan costs no node action, one in spot's plan costs
no share action, and the other way round; the next pass tries the failed part again. Spot
fails closed: without a plan, every spot device turns Unhealthy, so no borrower is admitted
on a decision that was never made.

A share plan that withdraws a draining shadow's devices is checked against a fresh LIST of the
node's pods first (``confirm_withdrawals``): the watch the pass read can lag behind a sharer the
scheduler has just bound on the count that is leaving, and such a sharer needs those devices.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from controller.core.actions import Action, SetSpotHealth
from controller.core.mapping import MappingCache
from controller.core.model import Snapshot, build_snapshot
from controller.core.refusals import plan_node_refusals
from controller.io.state import TIMER_SHARER_SHADOW, TIMER_SPOT_BACK
from controller.share.holdings import bind_holdings, decode_bindings, encode_bindings
from controller.share.shadow_drain import (
    hold_withdrawals,
    in_write_back_gap,
    sharers_waiting,
    withdrawn_now,
    write_backs_may_hold,
)
from controller.share.solver import plan_node_shares
from controller.spot.hooks import SpotHooks
from controller.spot.solver import GpuSpot, SpotPlan, plan_spot
from gpushare.config import Config
from gpushare.errors import GpushareError
from gpushare.log import kv

log = logging.getLogger(__name__)

_T = TypeVar("_T")

# Timers by kind (controller/io/state.py): the loop's store, or memory without one.
LoadTimers = Callable[[str], dict[str, float]]
SaveTimers = Callable[[str, Mapping[str, float]], None]
# A fresh LIST of this node's pods (spec.nodeName=<node>), not the watch's copy.
ListNodePods = Callable[[], Sequence[Mapping[str, Any]]]


class PassParts:
    """Runs the parts of one pass so that each fails alone; ``failures`` says which did (report.error)."""

    def __init__(self) -> None:
        self.failures: list[str] = []

    def run(self, part: str, plan: Callable[[], _T], fallback: _T) -> _T:
        """``plan()``, or ``fallback`` when it raises: whatever a part raises costs that part's actions only."""
        try:
            return plan()
        except Exception as exc:
            log.exception("part of the reconcile pass failed; the other parts still apply", extra=kv(part=part))
            self.failures.append(f"{part} failed: {type(exc).__name__}: {exc!s:.200}")
            return fallback


@dataclass(frozen=True)
class NodePass:
    """What the pass decided for this node: spot first, then the share plugins' device lists."""

    actions: tuple[Action, ...] = ()
    spot: tuple[GpuSpot, ...] = ()
    spot_plan: SpotPlan | None = None  # for the loop to hand on (return table, next deadline, lent GPUs)


def plan_node(
    cfg: Config,
    snap: Snapshot,
    mapping: MappingCache,
    now: float,
    *,
    parts: PassParts,
    spot: SpotHooks | None,
    load: LoadTimers,
    save: SaveTimers,
    list_node_pods: ListNodePods | None = None,
    write_backs: Callable[[], Mapping[str, float]] | None = None,
) -> NodePass:
    """Spot's plan (when spot is wired in), then the share plugins'; each part fails on its own.

    ``list_node_pods``: confirms withdrawals (``confirm_withdrawals``); None trusts the snapshot.
    ``write_backs``: share resource -> when the agent last lowered its count on the Node (kubelet
    wrote it back); a withdrawal waits for the gap after one (``in_write_back_gap``), for at most
    ``WRITE_BACK_HOLD_MAX_S`` after each drain's publish (``write_backs_may_hold``).
    """
    nothing: tuple[Action, ...] = ()

    def shares_plan() -> tuple[Action, ...]:
        actions = plan_shares(cfg, snap, mapping, now, load=load, save=save)
        if withdrawn_now(actions) and write_backs is not None:
            lowered = write_backs()
            holdable = [s for s in snap.shadows_on(snap.node_name) if write_backs_may_hold(s, now)]
            outside = frozenset(
                s.key.resource for s in holdable if not in_write_back_gap(lowered.get(s.key.resource), now)
            )
            if outside:
                actions = tuple(hold_withdrawals(actions, holdable, outside))
        if list_node_pods is None or not withdrawn_now(actions):
            return actions
        return confirm_withdrawals(cfg, snap, mapping, actions, list_node_pods)

    shares = parts.run("shares", shares_plan, nothing)
    shares += parts.run("refusals", lambda: tuple(plan_node_refusals(snap)), nothing)
    if spot is None:
        return NodePass(shares)
    spot_plan = parts.run("spot", lambda: _plan_spot(cfg, spot, snap, mapping, now=now, load=load), None)
    if spot_plan is None:
        real_ids = sorted({rid for ids in snap.allocatable.values() for rid in ids})
        return NodePass((*(SetSpotHealth(rid, False, "the spot plan failed") for rid in real_ids), *shares))
    save(TIMER_SPOT_BACK, spot_plan.back_at)
    return NodePass((*spot_plan.actions, *shares), spot_plan.gpus, spot_plan)


def plan_shares(
    cfg: Config, snap: Snapshot, mapping: MappingCache, now: float, *, load: LoadTimers, save: SaveTimers
) -> tuple[Action, ...]:
    """The share plugins' lists, cascade and records, with holdings bound to shadow uids in the state file."""
    stored = load(TIMER_SHARER_SHADOW)
    bindings = bind_holdings(snap, mapping, decode_bindings(stored))
    actions = plan_node_shares(snap, mapping, cfg, now=now, bindings=bindings)
    if (timers := encode_bindings(bindings, stored, now)) != stored:
        save(TIMER_SHARER_SHADOW, timers)
    return tuple(actions)


def confirm_withdrawals(
    cfg: Config, snap: Snapshot, mapping: MappingCache, actions: Sequence[Action], list_node_pods: ListNodePods
) -> tuple[Action, ...]:
    """The share plan with each withdrawal kept only if a fresh LIST shows no sharer waiting on its resource.

    Mirrors the leader's confirmation of idle deletions. PodResources (this pass's ``mapping``)
    says who holds a device; a sharer the LIST shows that the mapping does not know counts as
    waiting, which only keeps devices listed one pass longer. A LIST that fails keeps them all.
    """
    try:
        fresh = build_snapshot(list_node_pods(), cfg)
    except GpushareError as exc:
        log.warning("cannot confirm that no sharer waits; devices kept listed this pass", extra=kv(reason=str(exc)))
        return tuple(hold_withdrawals(actions, snap.shadows_on(snap.node_name), None))
    holding = frozenset(h.sharer.key for h in mapping.holdings)
    waiting = sharers_waiting(fresh.sharers_on(snap.node_name), holding)
    kept = hold_withdrawals(actions, snap.shadows_on(snap.node_name), waiting)
    if len(kept) != len(actions):
        log.info("a sharer waits for admission; draining devices kept listed", extra=kv(resources=sorted(waiting)))
    return tuple(kept)


def _plan_spot(
    cfg: Config, spot: SpotHooks, snap: Snapshot, mapping: MappingCache, *, now: float, load: LoadTimers
) -> SpotPlan:
    return plan_spot(
        snap,
        mapping,
        real_resources=cfg.real_resources,
        verdicts=spot.verdicts(now),
        notices=spot.notices(),
        kmod=spot.kmod_view(),
        back_at=load(TIMER_SPOT_BACK),
        now=now,
        idle_window_s=cfg.idle_window_s,
        lending_blocked=spot.blocked(),
    )


__all__ = [
    "ListNodePods",
    "LoadTimers",
    "NodePass",
    "PassParts",
    "SaveTimers",
    "confirm_withdrawals",
    "plan_node",
    "plan_shares",
]
