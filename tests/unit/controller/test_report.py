"""What a pass reports: rows for ``gpushare status``, counts for ``/metrics``, JSON for ``/status``."""

from __future__ import annotations

import json

from controller.core.mapping import MappingCache
from controller.core.model import PodResourcesEntry, Pool, ShareKey, build_snapshot
from controller.report import Eviction, ShadowStatus, TickReport, build_report, count_allocated, describe_node
from controller.share.solver import KeyDemand
from controller.spot.solver import GpuSpot, SpotState
from tests.unit.controller.loop_pods import CFG, pod, shadow


def test_describe_node_shows_each_shadows_gpu_and_users() -> None:
    pods = [
        shadow("s", node="n1", phase="Running"),
        pod("web", node="n1", phase="Running", limits={"gpushare/share-gpu-4": "1"}),
    ]
    rows = [
        PodResourcesEntry("gpushare-system", "s", "main", "example.com/gpu", ("fakegpu1",)),
        PodResourcesEntry("default", "web", "main", "gpushare/share-gpu-4", ("gpushare-system/s-2",)),
    ]
    snap = build_snapshot(pods, CFG, pod_resources=rows)
    mapping = MappingCache.rebuild(rows, snap.pods, CFG.real_resources)
    shadows, sharers = describe_node(snap, mapping, {}, CFG.real_resources)
    assert shadows == (
        ShadowStatus(
            pod="gpushare-system/s",
            uid="uid-s",
            phase="Running",
            node="n1",
            resource="gpushare/share-gpu-4",
            gpu=("fakegpu1",),
            users=("default/web/main",),
            unschedulable="",
        ),
    )
    assert [(p.pod, p.shadows) for p in sharers] == [("default/web", ("gpushare-system/s",))]


def test_describe_node_shows_why_a_shadow_waits() -> None:
    snap = build_snapshot([shadow("s")], CFG)
    (row,), () = describe_node(snap, MappingCache(), {"gpushare-system/s": "no GPU left"}, CFG.real_resources)
    assert row.unschedulable == "no GPU left" and row.gpu == () and row.phase == "Pending"


def test_allocations_count_gpushare_and_real_resources_only() -> None:
    rows = [
        PodResourcesEntry("default", "a", "c", "gpushare/share-gpu-4", ("v0", "v1")),
        PodResourcesEntry("default", "b", "c", "gpushare/share-gpu-4", ("v2",)),
        PodResourcesEntry("default", "b", "c", "example.com/gpu", ("g0",)),
        PodResourcesEntry("default", "b", "c", "example.com/nic", ("n0",)),
    ]
    assert count_allocated(rows, ["example.com/gpu"]) == {"gpushare/share-gpu-4": 3, "example.com/gpu": 1}


def test_build_report_reads_the_plugins_status_and_serialises_to_json() -> None:
    key = ShareKey(Pool("example.com/gpu"), "share", 4)
    report = build_report(
        at=100.0,
        took_ms=1.5,
        passes=3,
        is_leader=True,
        pod_resources_error="",
        plugin_status={"gpushare/share-gpu-4": {"devices": 8, "healthy": 6, "registered": True}},
        allocated={"gpushare/share-gpu-4": 2},
        node=((), ()),
        demand=(KeyDemand(key, shadows=2, free_slots=6, pending=0, create=0, delete=0),),
        spot=(GpuSpot("g0", SpotState.STOLEN, "team/owner/main", ("spot/job/main",), "idle for 600s"),),
        evictions=[Eviction(90.0, "spot/old", "OwnerBack", "the owner is back")],
        evictions_total={"OwnerBack": 1},
        problems=(),
    )
    assert report.synced and report.pod_resources_ok and report.error == ""
    assert (report.advertised, report.healthy, report.registered) == (
        {"gpushare/share-gpu-4": 8},
        {"gpushare/share-gpu-4": 6},
        {"gpushare/share-gpu-4": True},
    )
    doc = json.loads(json.dumps(report.to_json()))
    assert doc["demand"] == [{"key": str(key), "shadows": 2, "free_slots": 6, "pending": 0}]
    assert doc["spot"] == [
        {
            "real_id": "g0",
            "state": "stolen",
            "owner": "team/owner/main",
            "borrowers": ["spot/job/main"],
            "reason": "idle for 600s",
        }
    ]
    assert doc["evictions"] == [{"at": 90.0, "pod": "spot/old", "reason": "OwnerBack", "message": "the owner is back"}]


def test_a_report_without_pod_resources_says_why() -> None:
    report = build_report(
        at=1.0,
        took_ms=0.1,
        passes=1,
        is_leader=False,
        pod_resources_error="kubelet did not answer",
        plugin_status={},
        allocated={},
        node=((), ()),
        demand=(),
        spot=(),
        evictions=(),
        evictions_total={},
        problems=(),
    )
    assert not report.pod_resources_ok and report.error == "kubelet did not answer"
    assert TickReport().to_json()["synced"] is False
