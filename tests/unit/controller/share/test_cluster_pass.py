"""The leader's part of a pass: shadows planned from the merged caches, deletions confirmed by fresh LISTs."""

from __future__ import annotations

from typing import Any

from controller.core.actions import CreateShadow, DeleteShadow, RecordEvent
from controller.errors import ApiUnavailable
from controller.share.cluster_pass import plan_cluster
from controller.share.cluster_view import REASON_SHADOW_UNSCHEDULABLE
from gpushare import keys
from gpushare.config import load_config
from tests.unit.controller.loop_pods import UNSCHED, pod, shadow

CFG = load_config(text="version: v1\nnodeName: n1\nrealResources: [example.com/gpu]\nshareSpecs: [4]\n")
SHARER = {"gpushare/share-gpu-4": "1"}
IDLE_SINCE = {"uid-s": 0.0}  # empty since t=0; the idle timeout (600 s) has passed at NOW
# Marked for removal by the leader and answered by its node: the devices are withdrawn.
DRAINED = {keys.ANNOTATION_SHADOW_DRAINING: "1.000", keys.ANNOTATION_SHADOW_DRAINED: "1.000"}
NOW = 1000.0


class FreshLists:
    """``list_pods`` answering from what the API has now (not what the caches saw)."""

    def __init__(self, pods: list[dict[str, Any]], *, fail: bool = False) -> None:
        self.pods, self.fail = pods, fail
        self.asked: list[dict[str, Any]] = []

    def list_pods(self, **sel: Any) -> tuple[list[dict[str, Any]], str]:
        self.asked.append(sel)
        if self.fail:
            raise ApiUnavailable("gpushare: the API server did not answer")
        field = sel.get("field_selector") or ""
        out = [p for p in self.pods if not sel.get("namespace") or p["metadata"]["namespace"] == sel["namespace"]]
        if field.startswith("spec.nodeName=,"):
            out = [p for p in out if not p["spec"]["nodeName"]]
        elif field.startswith("spec.nodeName="):
            out = [p for p in out if p["spec"]["nodeName"] == field.removeprefix("spec.nodeName=")]
        return out, "1"


def deletions(actions: tuple[Any, ...]) -> list[str]:
    return [a.ref.key for a in actions if isinstance(a, DeleteShadow)]


def test_an_idle_shadow_is_deleted_when_fresh_lists_agree() -> None:
    idle = shadow("s", node="n1", phase="Running", annotations=DRAINED)
    lists = FreshLists([idle])
    result = plan_cluster(CFG, lists, ((idle,), (), (idle,)), IDLE_SINCE, NOW)
    assert deletions(result.actions) == ["gpushare-system/s"]
    assert result.is_leader and result.empty_since == IDLE_SINCE
    # Pending pods, every shadow, and the node of each shadow about to go.
    pending, shadows, node = (s.get("field_selector") for s in lists.asked)
    assert (pending, shadows, node) == ("spec.nodeName=,status.phase=Pending", None, "spec.nodeName=n1")


def test_a_sharer_the_caches_missed_keeps_its_shadow() -> None:
    idle = shadow("s", node="n1", phase="Running", annotations=DRAINED)
    lists = FreshLists([idle, pod("web", limits=SHARER)])  # pending now, not yet in the pending cache
    result = plan_cluster(CFG, lists, ((idle,), (), (idle,)), IDLE_SINCE, NOW)
    assert deletions(result.actions) == []


def test_no_deletion_when_the_fresh_lists_fail() -> None:
    idle = shadow("s", node="n1", phase="Running", annotations=DRAINED)
    result = plan_cluster(CFG, FreshLists([idle], fail=True), ((idle,), (), (idle,)), IDLE_SINCE, NOW)
    assert deletions(result.actions) == []


def test_no_fresh_lists_without_a_deletion_and_waiting_sharers_learn_why() -> None:
    stuck = shadow("s", conditions=UNSCHED)
    lists = FreshLists([])
    result = plan_cluster(CFG, lists, ((), (pod("web", limits=SHARER),), (stuck,)), {}, NOW)
    assert lists.asked == []
    assert result.unschedulable == {"gpushare-system/s": UNSCHED[0]["message"]}
    events = [a for a in result.actions if isinstance(a, RecordEvent)]
    assert [(e.ref.key, e.reason) for e in events] == [("default/web", REASON_SHADOW_UNSCHEDULABLE)]
    assert not [a for a in result.actions if isinstance(a, CreateShadow)]  # the stuck shadow has a free slot


def test_a_sharer_no_node_would_take_is_reported_and_asks_for_no_shadow() -> None:
    short_of_cpu = [
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": "0/1 nodes are available: 1 Insufficient cpu, 1 Insufficient gpushare/share-gpu-4. "
            "preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling.",
        }
    ]
    greedy = pod("greedy", limits=SHARER, conditions=short_of_cpu)
    waiting = pod("web", limits=SHARER)  # not answered yet: it may be placed once a slot exists
    plain = pod("plain", conditions=short_of_cpu)  # no sharer: not the leader's to report
    result = plan_cluster(CFG, FreshLists([]), ((), (greedy, waiting, plain), ()), {}, NOW)
    assert result.blocked == ("default/greedy",)
    assert [d.pending for d in result.demand] == [1]  # web's slot only
