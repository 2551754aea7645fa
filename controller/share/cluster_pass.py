"""The leader's part of a reconcile pass: shadows for the whole cluster.

From the merged caches (this node's pods, unscheduled pods, every shadow) it plans shadows
(``plan_shadows``) and the Warning a sharer waiting on an unplaceable shadow gets. A shadow
is deleted only when a plan over fresh LISTs agrees (``confirm_deletions``): deleting an
in-use shadow evicts its sharers, so this one decision is worth three extra API calls.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from controller.core.actions import Action, DeleteShadow
from controller.core.model import Snapshot, SnapshotMemo, build_snapshot
from controller.core.refusals import plan_pending_refusals
from controller.share.cluster_view import (
    blocked_elsewhere,
    merge_pods,
    plan_waiting_events,
    unschedulable_pods,
    unschedulable_shadows,
)
from controller.share.placing import Placing, Seen
from controller.share.solver import KeyDemand, ShadowPlan, plan_shadows
from gpushare import installation, rules
from gpushare.config import Config
from gpushare.errors import GpushareError
from gpushare.log import kv

log = logging.getLogger(__name__)


class PodLister(Protocol):
    """The reads ``confirm_deletions`` makes through ``KubeClient``."""

    def list_pods(
        self, *, namespace: str | None = None, label_selector: str | None = None, field_selector: str | None = None
    ) -> tuple[list[dict[str, Any]], str]: ...


@dataclass(frozen=True)
class ClusterPass:
    """What the pass decided cluster-wide; only the leader with synced caches decides anything."""

    is_leader: bool
    snapshot: Snapshot  # cluster-wide when decided, else the node's (what the report describes)
    unschedulable: Mapping[str, str] = field(default_factory=dict)  # shadow ns/name -> the scheduler's message
    actions: tuple[Action, ...] = ()
    demand: tuple[KeyDemand, ...] = ()
    empty_since: Mapping[str, float] = field(default_factory=dict)  # timers to store (plan_shadows)
    placing: Mapping[str, Seen] = field(default_factory=dict)  # pass back next time (controller/share/placing.py)
    # Pending sharers ("ns/name") that ask for no shadow: the scheduler cannot place them for
    # reasons a shadow cannot cure (cluster_view.blocked_elsewhere).
    blocked: tuple[str, ...] = ()


def plan_cluster(
    cfg: Config,
    client: PodLister,
    cached: tuple[Sequence[Mapping[str, Any]], Sequence[Mapping[str, Any]], Sequence[Mapping[str, Any]]],
    timers: Mapping[str, float],
    now: float,
    *,
    memo: SnapshotMemo | None = None,
    placing: Placing | None = None,
) -> ClusterPass:
    """``cached``: the node's, the pending and the shadow caches' pods; ``timers``: shadow empty-since.

    ``memo``: kept by the caller from pass to pass, so only pods that changed are read again;
    ``placing``: the previous pass's ``ClusterPass.placing``.
    """
    node_pods, pending_pods, shadow_pods = cached
    raw = merge_pods(node_pods, pending_pods, shadow_pods)
    unschedulable = unschedulable_shadows(shadow_pods)
    cluster = build_snapshot(raw, cfg, memo=memo)
    plan = plan_shadows(
        cluster,
        cfg,
        now,
        timers,
        placing,
        unplaceable=unschedulable_pods(pending_pods),
        blocked=(blocked := blocked_elsewhere(pending_pods)),
    )
    if any(isinstance(a, DeleteShadow) for a in plan.actions):
        plan = confirm_deletions(cfg, client, plan, cluster=cluster, cached=raw, now=now, timers=timers)
    actions = (*plan.actions, *plan_waiting_events(cluster, unschedulable), *plan_pending_refusals(cluster))
    held_back = tuple(sorted({s.facts.ref.key for s in cluster.sharers if s.is_pending and s.facts.ref.key in blocked}))
    return ClusterPass(True, cluster, unschedulable, actions, plan.demand, plan.empty_since, plan.placing, held_back)


def confirm_deletions(
    cfg: Config,
    client: PodLister,
    plan: ShadowPlan,
    *,
    cluster: Snapshot,
    cached: list[Mapping[str, Any]],
    now: float,
    timers: Mapping[str, float],
) -> ShadowPlan:
    """Plan again from fresh LISTs before deleting a shadow; keep only deletions both plans agree on.

    The caches lag differently: a sharer that was just bound leaves the pending watch before
    it shows up in any node's, and until the node agent records it on the shadow the leader
    cannot see it at all. In that window an in-use shadow looks idle. Deletions are rare (one
    per idle timeout), so the price of three targeted LISTs is small; a pod still in a stale
    cache only makes the answer more conservative.
    """
    deleting = {a.ref for a in plan.actions if isinstance(a, DeleteShadow)}
    nodes = sorted({s.node_name for s in cluster.shadows if s.ref in deleting and s.node_name})
    try:
        fresh = [
            client.list_pods(field_selector=rules.PENDING_UNBOUND_SELECTOR)[0],
            client.list_pods(namespace=installation.namespace(), label_selector=rules.SHADOW_SELECTOR)[0],
            *(client.list_pods(field_selector=rules.on_node_selector(n))[0] for n in nodes),
        ]
    except GpushareError as exc:
        log.warning("cannot confirm idle shadows; not deleting this pass", extra=kv(reason=str(exc)))
        return dataclasses.replace(plan, actions=tuple(a for a in plan.actions if not isinstance(a, DeleteShadow)))
    again = plan_shadows(
        build_snapshot(merge_pods(cached, *fresh), cfg),
        cfg,
        now,
        timers,
        plan.placing,
        unplaceable=unschedulable_pods(fresh[0]),
        blocked=blocked_elsewhere(fresh[0]),
    )
    confirmed = {a for a in again.actions if isinstance(a, DeleteShadow)}
    for a in plan.actions:
        if isinstance(a, DeleteShadow) and a not in confirmed:
            log.info("idle shadow is in use after all; kept", extra=kv(shadow=a.ref.key))
    return dataclasses.replace(
        plan,
        actions=tuple(a for a in plan.actions if not isinstance(a, DeleteShadow) or a in confirmed),
        empty_since=again.empty_since,
    )


__all__ = ["ClusterPass", "PodLister", "confirm_deletions", "plan_cluster"]
