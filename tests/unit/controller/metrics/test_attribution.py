"""Attribution rows (who holds or sees which GPU, in which role) and their /metrics families."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from controller.core.mapping import MappingCache
from controller.core.model import PodResourcesEntry, build_snapshot
from controller.metrics.attribution import (
    JOIN_LABELS,
    Attribution,
    GpuUser,
    ShadowSlots,
    attribute,
    join_label_names,
    join_values,
    vendor_of,
)
from controller.metrics.exposition import AgentMetrics
from controller.report import TickReport
from gpumetrics.model import DeviceMetrics
from tests.unit.controller.loop_pods import CFG, pod, shadow

SHADOW = "gpushare-system/s"


def _with_annotations(p: dict[str, Any], annotations: dict[str, str]) -> dict[str, Any]:
    p["metadata"]["annotations"] = annotations
    return p


def _world() -> Attribution:
    """An owner lending its GPU to a borrower, a shadow with four sharers, a DinD pod sharing its owner's GPU."""
    share = {"gpushare/share-gpu-4": "1"}
    pods = [
        shadow("s", node="n1", phase="Running"),
        *(pod(f"web-{i}", node="n1", phase="Running", limits=share) for i in range(4)),
        pod("owner", ns="team", node="n1", phase="Running", limits={"example.com/gpu": "1"}),
        pod("job", ns="spot", node="n1", phase="Running", limits={"gpushare/spot-gpu": "1"}),
        _with_annotations(
            pod("ci", node="n1", phase="Running", limits={"example.com/gpu": "1"}),
            {"gpushare.k8s.io/container-devices-from.dind": "main"},
        ),
        pod("done", node="n1", phase="Succeeded", limits=share),
    ]
    rows = [
        PodResourcesEntry("gpushare-system", "s", "main", "example.com/gpu", ("fakegpu1",)),
        *(
            PodResourcesEntry("default", f"web-{i}", "main", "gpushare/share-gpu-4", (f"{SHADOW}-{i}",))
            for i in range(4)
        ),
        PodResourcesEntry("team", "owner", "main", "example.com/gpu", ("fakegpu0",)),
        PodResourcesEntry("spot", "job", "main", "gpushare/spot-gpu", ("spot-fakegpu0",)),
        PodResourcesEntry("default", "ci", "main", "example.com/gpu", ("fakegpu2",)),
        PodResourcesEntry("default", "done", "main", "gpushare/share-gpu-4", (f"{SHADOW}-3",)),
    ]
    snap = build_snapshot(pods, CFG, pod_resources=rows)
    return attribute(snap, MappingCache.rebuild(rows, snap.pods, CFG.real_resources))


def test_every_role_is_attributed_to_its_real_gpu() -> None:
    users = set(_world().users)
    sharers = {u for u in users if u.role == "sharer"}
    assert sharers == {
        GpuUser("fakegpu1", "sharer", "default", f"web-{i}", "main", "gpushare/share-gpu-4", SHADOW) for i in range(4)
    }, "a finished pod's stale row is no sharer"
    assert GpuUser("fakegpu1", "shadow", "gpushare-system", "s", "main", "example.com/gpu") in users
    assert GpuUser("fakegpu0", "owner", "team", "owner", "main", "example.com/gpu") in users
    assert GpuUser("fakegpu0", "borrower", "spot", "job", "main", "gpushare/spot-gpu", "team/owner/main") in users
    assert GpuUser("fakegpu2", "dind", "default", "ci", "dind", "example.com/gpu", "default/ci/main") in users
    assert GpuUser("fakegpu2", "owner", "default", "ci", "main", "example.com/gpu") in users
    assert len(users) == 9


def test_shadow_slots_count_the_sharers_holding_them() -> None:
    assert _world().shadows == (ShadowSlots(SHADOW, "fakegpu1", "gpushare/share-gpu-4", 4, 4, 4),)


def test_a_shadow_without_a_gpu_on_this_node_is_left_to_its_own_nodes_agent() -> None:
    snap = build_snapshot([shadow("s")], CFG)
    assert attribute(snap, MappingCache()) == Attribution()


def test_a_malformed_dind_annotation_attributes_nothing_to_its_target() -> None:
    p = _with_annotations(
        pod("ci", node="n1", phase="Running", limits={"example.com/gpu": "1"}),
        {"gpushare.k8s.io/container-devices-from.dind": "other-ns/other-pod/main"},
    )
    rows = [PodResourcesEntry("default", "ci", "main", "example.com/gpu", ("g0",))]
    snap = build_snapshot([p], CFG, pod_resources=rows)
    found = attribute(snap, MappingCache.rebuild(rows, snap.pods, CFG.real_resources))
    assert [u.role for u in found.users] == ["owner"]


NVIDIA = (
    DeviceMetrics("nvidia", "GPU-aaaa", index=0, uuid="GPU-aaaa"),
    DeviceMetrics("nvidia", "GPU-bbbb", index=1, uuid="GPU-bbbb"),
)


def test_join_labels_take_the_exporters_names_and_the_scraped_index() -> None:
    assert join_label_names("nvidia") == ("UUID", "gpu")
    assert join_values("nvidia", "GPU-bbbb", NVIDIA) == ("GPU-bbbb", "1")
    # Not in the scrape (or no scrape): the real ID is the identity, the index stays empty.
    assert join_values("nvidia", "GPU-cccc", NVIDIA) == ("GPU-cccc", "")
    assert join_values("nvidia", "", NVIDIA) == ("", "")
    # Hygon calls its serial device_id, which our own label already is.
    assert join_label_names("hygon") == ("minor_number",)
    hygon = (DeviceMetrics("hygon", "PAK1", index=3, uuid="PAK1"),)
    assert join_values("hygon", "PAK1", hygon) == ("3",)
    assert join_label_names("kunlunxin") == ("card",)
    assert join_label_names("unknown") == () and join_label_names("") == ()
    assert set(JOIN_LABELS) >= {"nvidia", "amd", "ascend", "enflame", "cambricon", "iluvatar", "metax", "mthreads"}


def test_the_vendor_is_the_configured_one_else_the_scraped_one() -> None:
    assert vendor_of("amd", NVIDIA) == "amd"
    assert vendor_of("auto", NVIDIA) == "nvidia"
    assert vendor_of("auto", ()) == ""


def _families(report: TickReport, vendor: str, devices: tuple[DeviceMetrics, ...]) -> dict[str, Any]:
    text = AgentMetrics(lambda: report, node="n1", vendor=vendor, devices=lambda: devices).render().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_gpu_user_and_shadow_families_carry_the_vendor_join_labels() -> None:
    found = _world()
    devices = (DeviceMetrics("nvidia", "fakegpu1", index=1, uuid="fakegpu1"),)
    families = _families(TickReport(attribution=found), "nvidia", devices)
    users = families["gpushare_gpu_user"].samples
    assert len(users) == 9 and {s.value for s in users} == {1.0}
    web0 = next(s.labels for s in users if s.labels["pod"] == "web-0")
    assert web0 == {
        "node": "n1",
        "namespace": "default",
        "pod": "web-0",
        "container": "main",
        "role": "sharer",
        "source": SHADOW,
        "resource": "gpushare/share-gpu-4",
        "vendor": "nvidia",
        "device_id": "fakegpu1",
        "UUID": "fakegpu1",
        "gpu": "1",
    }
    for name, value in (("gpushare_shadow_slots", 4.0), ("gpushare_shadow_slots_used", 4.0)):
        (sample,) = families[name].samples
        assert sample.value == value and sample.labels["shadow"] == SHADOW and sample.labels["UUID"] == "fakegpu1"
    (sharers,) = families["gpushare_shadow_sharers"].samples
    assert sharers.value == 4.0


def test_without_a_vendor_the_rows_have_no_join_labels() -> None:
    families = _families(TickReport(attribution=_world()), "auto", ())
    labels = families["gpushare_gpu_user"].samples[0].labels
    assert labels["vendor"] == "" and "UUID" not in labels and "gpu" not in labels
