"""The loop's pure helpers and the metrics text: plain data in, plain data out (no threads, sockets, clock)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from controller.core.mapping import MappingCache
from controller.core.model import PodResourcesEntry, build_snapshot
from controller.http_endpoint import LatencyHistogram, is_healthy, render_metrics
from controller.loop import (
    REASON_SHADOW_UNSCHEDULABLE,
    Eviction,
    ShadowInfo,
    TickReport,
    describe_node,
    entries_from_pod_resources,
    merge_pods,
    plan_waiting_events,
    unschedulable_message,
)
from gpushare.config import load_config

CFG = load_config(text="version: v1\nnodeName: n1\nrealResources: [example.com/gpu]\n")


def pod(
    name: str,
    *,
    ns: str = "default",
    rv: str = "1",
    node: str = "",
    phase: str = "Pending",
    limits: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    conditions: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    return {
        "metadata": {"namespace": ns, "name": name, "uid": f"uid-{name}", "resourceVersion": rv}
        | {"labels": labels or {}},
        "spec": {"nodeName": node, "containers": [{"name": "main", "resources": {"limits": limits or {}}}]},
        "status": {"phase": phase, "conditions": conditions or []},
    }


def shadow(name: str, **kw: Any) -> dict[str, Any]:
    labels = {"gpushare.k8s.io/role": "shadow", "gpushare.k8s.io/share-spec": "4"}
    labels["gpushare.k8s.io/share-kind"] = "share"
    return pod(name, ns="gpushare-system", labels=labels, limits={"example.com/gpu": "1"}, **kw)


UNSCHED = [{"type": "PodScheduled", "status": "False", "message": "0/1 nodes: Insufficient example.com/gpu"}]


def test_merge_pods_keeps_the_newest_copy_of_each_pod() -> None:
    old, new = pod("a", rv="5"), pod("a", rv="7", node="n1")
    merged = merge_pods([old, pod("b")], [new])
    assert {p["metadata"]["name"]: p["metadata"]["resourceVersion"] for p in merged} == {"a": "7", "b": "1"}
    assert merge_pods([new], [old]) == [new]


def test_unschedulable_message_only_for_pending_pods_the_scheduler_refused() -> None:
    assert "Insufficient" in unschedulable_message(pod("s", conditions=UNSCHED))
    assert unschedulable_message(pod("s")) == ""
    assert unschedulable_message(pod("s", phase="Running", conditions=UNSCHED)) == ""


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


def test_entries_from_pod_resources_one_row_per_container_and_resource() -> None:
    dev = SimpleNamespace
    answer = [
        dev(
            namespace="default",
            name="p",
            containers=[
                dev(
                    name="c",
                    devices=[
                        dev(resource_name="example.com/gpu", device_ids=["g0"]),
                        dev(resource_name="example.com/gpu", device_ids=["g1"]),
                        dev(resource_name="gpushare/share-gpu-4", device_ids=["gpushare-system/s-0"]),
                    ],
                )
            ],
        )
    ]
    assert entries_from_pod_resources(answer) == [
        PodResourcesEntry("default", "p", "c", "example.com/gpu", ("g0", "g1")),
        PodResourcesEntry("default", "p", "c", "gpushare/share-gpu-4", ("gpushare-system/s-0",)),
    ]


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
        ShadowInfo(
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


def test_metrics_text_names_every_family_with_exact_numbers() -> None:
    hist = LatencyHistogram(buckets=(0.001, 0.01))
    hist.observe("inject", 0.0004)
    hist.observe("refuse", 0.02)
    report = TickReport(
        at=1796230000.25,
        took_ms=2.5,
        is_leader=True,
        advertised={"gpushare/share-gpu-4": 8},
        healthy={"gpushare/share-gpu-4": 8},
        registered={"gpushare/share-gpu-4": True},
        allocated={"gpushare/share-gpu-4": 3},
        evictions=(Eviction(1.0, "default/a", "ShadowGone", "m"),),
        evictions_total={"ShadowGone": 1},
    )
    text = render_metrics(report, nri_connected=True, nri_latency=hist)
    lines = set(text.splitlines())
    assert 'gpushare_devices_advertised{resource="gpushare/share-gpu-4"} 8' in lines
    assert 'gpushare_allocations{resource="gpushare/share-gpu-4"} 3' in lines
    assert 'gpushare_evictions_total{reason="ShadowGone"} 1' in lines
    assert "gpushare_reconcile_last_pass_timestamp_seconds 1796230000.25" in lines
    assert "gpushare_nri_connected 1" in lines and "gpushare_leader 1" in lines
    assert 'gpushare_nri_handler_seconds_bucket{decision="inject",le="0.001"} 1' in lines
    assert 'gpushare_nri_handler_seconds_bucket{decision="refuse",le="0.01"} 0' in lines
    assert 'gpushare_nri_handler_seconds_bucket{decision="refuse",le="+Inf"} 1' in lines
    assert 'gpushare_nri_handler_seconds_count{decision="refuse"} 1' in lines
    assert "# TYPE gpushare_evictions_total counter" in lines


def test_label_values_are_escaped() -> None:
    text = render_metrics(TickReport(evictions_total={'we"ird\\reason': 2}), nri_connected=None, nri_latency=None)
    assert 'gpushare_evictions_total{reason="we\\"ird\\\\reason"} 2' in text.splitlines()
    assert "gpushare_nri_connected" not in text


def test_healthz_needs_a_recent_pass() -> None:
    assert is_healthy(TickReport(), now=100.0, max_age_s=30)[0] is False
    assert is_healthy(TickReport(at=90.0), now=100.0, max_age_s=30) == (True, "ok: last pass 10.0s ago")
    ok, why = is_healthy(TickReport(at=10.0), now=100.0, max_age_s=30)
    assert not ok and "90s ago" in why
