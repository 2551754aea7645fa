"""The leader's cluster view from raw pod dicts: plain data in, plain data out."""

from __future__ import annotations

from controller.core.model import build_snapshot
from controller.share.cluster_view import (
    REASON_SHADOW_UNSCHEDULABLE,
    blocked_elsewhere,
    merge_pods,
    plan_waiting_events,
    unschedulable_message,
    unschedulable_shadows,
)
from tests.unit.controller.loop_pods import CFG, UNSCHED, pod, shadow


def test_merge_pods_keeps_the_newest_copy_of_each_pod() -> None:
    old, new = pod("a", rv="5"), pod("a", rv="7", node="n1")
    merged = merge_pods([old, pod("b")], [new])
    assert {p["metadata"]["name"]: p["metadata"]["resourceVersion"] for p in merged} == {"a": "7", "b": "1"}
    assert merge_pods([new], [old]) == [new]


def test_merge_pods_reads_an_unreadable_resource_version_as_oldest() -> None:
    odd, good = pod("a", rv="not-a-number"), pod("a", rv="2", node="n1")
    assert merge_pods([odd], [good]) == [good]
    assert merge_pods([good], [odd]) == [good]


def test_unschedulable_message_only_for_pending_pods_the_scheduler_refused() -> None:
    assert "Insufficient" in unschedulable_message(pod("s", conditions=UNSCHED))
    assert unschedulable_message(pod("s")) == ""
    assert unschedulable_message(pod("s", phase="Running", conditions=UNSCHED)) == ""


def test_blocked_elsewhere_names_pods_no_node_refused_for_share_slots() -> None:
    def said(message: str) -> list[dict[str, object]]:
        return [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}]

    pods = [
        pod(
            "selector",
            conditions=said(
                "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector. "
                "preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling."
            ),
        ),
        pod(
            "cpu",
            conditions=said(
                "0/1 nodes are available: 1 Insufficient cpu. preemption: 0/1 nodes are available: "
                "1 No preemption victims found for incoming pod."
            ),
        ),
        pod(
            "slots",
            conditions=said(
                "0/3 nodes are available: 1 Insufficient gpushare/share-gpu-4, 2 node(s) had "
                "untolerated taint {gpu: x}. preemption: 0/3 nodes are available: 3 Insufficient gpushare/share-gpu-4."
            ),
        ),
        pod("dev", conditions=said("0/1 nodes are available: 1 Insufficient gpushare/share-dev-gpu-2.")),
        pod("later"),  # not answered yet
        # Its one node is short of CPU as well as slots: a shadow would not place it.
        pod(
            "both",
            conditions=said(
                "0/1 nodes are available: 1 Insufficient cpu, 1 Insufficient "
                "gpushare/share-gpu-4. preemption: 0/1 nodes are available: 1 No preemption victims found."
            ),
        ),
        # Two nodes short of slots, one of CPU: at least one lacks only slots.
        pod(
            "some",
            conditions=said(
                "0/2 nodes are available: 1 Insufficient example.com/cpu-ish, 2 Insufficient gpushare/share-gpu-4."
            ),
        ),
        # Only the preemption part names the slots: no node refused it for them.
        pod(
            "taint",
            conditions=said(
                "0/1 nodes are available: 1 node(s) had untolerated taint {x: y}. "
                "preemption: 0/1 nodes are available: 1 Insufficient gpushare/share-gpu-4."
            ),
        ),
    ]
    assert blocked_elsewhere(pods) == {"default/selector", "default/cpu", "default/taint", "default/both"}


def test_unschedulable_shadows_names_only_shadows_the_scheduler_refused() -> None:
    pods = [shadow("stuck", conditions=UNSCHED), shadow("placed"), pod("sharer", conditions=UNSCHED)]
    assert unschedulable_shadows(pods) == {"gpushare-system/stuck": UNSCHED[0]["message"]}


def test_a_pending_sharer_learns_why_its_shadow_cannot_be_placed() -> None:
    snap = build_snapshot(
        [shadow("shadow-x", conditions=UNSCHED), pod("web", limits={"gpushare/share-gpu-4": "1"})], CFG
    )
    (event,) = plan_waiting_events(snap, {"gpushare-system/shadow-x": UNSCHED[0]["message"]})
    assert event.reason == REASON_SHADOW_UNSCHEDULABLE and event.type == "Warning"
    assert event.ref.key == "default/web"
    assert "gpushare-system/shadow-x" in event.message and "Insufficient example.com/gpu" in event.message


def test_no_event_when_the_shadow_is_placeable_or_the_sharer_is_bound() -> None:
    snap = build_snapshot(
        [
            shadow("shadow-x"),
            pod("web", limits={"gpushare/share-gpu-4": "1"}),
            pod("bound", node="n1", phase="Running", limits={"gpushare/share-gpu-4": "1"}),
        ],
        CFG,
    )
    assert plan_waiting_events(snap, {}) == []
    # A different share spec is another key: its sharer is not told about this shadow.
    other = build_snapshot([shadow("shadow-x"), pod("web", limits={"gpushare/share-gpu-2": "1"})], CFG)
    assert plan_waiting_events(other, {"gpushare-system/shadow-x": "full"}) == []


def test_a_stuck_shadow_is_found_by_its_whole_key_whatever_its_name_holds() -> None:
    # The pass looks only at shadows whose name some stuck key could end in; a name holding a
    # slash, or one that ends another's key, is still matched by the whole "ns/name" only.
    sharer = pod("web", limits={"gpushare/share-gpu-4": "1"})
    for name in ("a/b", "b"):
        snap = build_snapshot([shadow(name), sharer], CFG)
        events = plan_waiting_events(snap, {"gpushare-system/a/b": "no GPU"})
        assert [e.ref.key for e in events] == (["default/web"] if name == "a/b" else [])
    snap = build_snapshot([shadow("b"), sharer], CFG)
    assert plan_waiting_events(snap, {"other/b": "no GPU"}) == []


def test_merge_pods_keeps_one_copy_of_a_pod_two_caches_share() -> None:
    shared = pod("a", node="n1")
    assert merge_pods([shared], [shared, pod("b")]) == [shared, pod("b")]
