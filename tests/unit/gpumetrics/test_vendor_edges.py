"""Vendor quirks beyond the fixture pages: sentinels, label generations, partitions, joins, units."""

from __future__ import annotations

import pytest

from gpumetrics import DeviceMetrics, Workload, parse_metrics
from gpumetrics.errors import MetricsError

MIB = 1024 * 1024


def one(text: str, vendor: str = "auto", prefix: str | None = None) -> DeviceMetrics:
    result = parse_metrics(text, vendor=vendor, prefix=prefix)
    assert len(result.devices) == 1, result
    return result.devices[0]


# ---- NVIDIA -----------------------------------------------------------------------------------

NV = 'gpu="0",UUID="GPU-1",Hostname="n1"'


@pytest.mark.parametrize(
    "raw",
    [
        "2147483632",  # DCGM int32 blank (0x7ffffff0)
        "2147483647",  # int32 max, also in the blank range
        "9223372036854775794",  # int64 blank, as the README shows for MEMORY_TEMP
        "140737488355328",  # fp64 blank (2**47)
        "NaN",
        "-1",
        "101",  # utilization outside 0..100
    ],
)
def test_dcgm_blank_utilization_is_unknown_and_never_zero(raw: str) -> None:
    d = one(f"DCGM_FI_DEV_GPU_UTIL{{{NV}}} {raw}\nDCGM_FI_DEV_POWER_USAGE{{{NV}}} 70\n")
    assert d.utilization_pct is None
    assert d.power_watts == 70.0


def test_dcgm_blank_value_line_is_skipped_and_counted_the_rest_still_counts() -> None:
    text = (
        f"DCGM_FI_DEV_GPU_UTIL{{{NV}}} \n"  # blank value: a bad line
        f"DCGM_FI_DEV_FB_USED{{{NV}}} ERROR - FAILED TO CONVERT TO STRING\n"
        f"DCGM_FI_DEV_POWER_USAGE{{{NV}}} 70\n"
    )
    result = parse_metrics(text)
    assert result.bad_lines == 2
    (d,) = result.devices
    assert (d.utilization_pct, d.memory_used_bytes, d.power_watts) == (None, None, 70.0)


def test_dcgm_blank_gpu_util_falls_back_to_engine_active() -> None:
    text = f"DCGM_FI_DEV_GPU_UTIL{{{NV}}} 2147483632\nDCGM_FI_PROF_GR_ENGINE_ACTIVE{{{NV}}} 0.25\n"
    assert one(text).utilization_pct == 25.0


def test_dcgm_memory_total_prefers_fb_total_and_needs_free_otherwise() -> None:
    with_total = f"DCGM_FI_DEV_FB_USED{{{NV}}} 10\nDCGM_FI_DEV_FB_FREE{{{NV}}} 20\nDCGM_FI_DEV_FB_TOTAL{{{NV}}} 40\n"
    assert one(with_total).memory_total_bytes == 40 * MIB
    used_only = f"DCGM_FI_DEV_FB_USED{{{NV}}} 10\nDCGM_FI_DEV_FB_RESERVED{{{NV}}} 5\n"
    d = one(used_only)
    assert (d.memory_used_bytes, d.memory_total_bytes) == (10 * MIB, None)


def test_dcgm_old_label_generation_and_empty_pod_labels() -> None:
    text = (
        'DCGM_FI_DEV_GPU_UTIL{gpu="1",uuid="GPU-old",Hostname="n1",pod_name="",pod_namespace="",'
        'container_name=""} 5\n'
        'DCGM_FI_DEV_GPU_UTIL{gpu="2",uuid="GPU-old2",hostname="n2",pod_name="p",pod_namespace="ns",'
        'container_name="c"} 6\n'
    )
    a, b = parse_metrics(text).devices
    assert (a.device_id, a.index, a.node, a.workloads) == ("GPU-old", 1, "n1", ())
    assert (b.device_id, b.node, b.workloads) == ("GPU-old2", "n2", (Workload("ns", "p", "c"),))


def test_dcgm_time_slicing_copies_merge_into_one_device_with_every_pod() -> None:
    text = "".join(
        f'DCGM_FI_DEV_GPU_UTIL{{{NV},pod="p{i}",namespace="ns",container="c",vgpu="0-{i}"}} 40\n' for i in range(3)
    )
    d = one(text)
    assert d.utilization_pct == 40.0
    assert d.workloads == tuple(Workload("ns", f"p{i}", "c") for i in range(3))


def test_dcgm_lowercased_families_are_read() -> None:
    d = one(f"dcgm_fi_dev_gpu_util{{{NV}}} 9\ndcgm_fi_dev_power_usage{{{NV}}} 100.5\n")
    assert (d.vendor, d.utilization_pct, d.power_watts) == ("nvidia", 9.0, 100.5)


def test_exported_labels_win_and_plain_ones_are_then_the_exporter_pod() -> None:
    # Read back from Prometheus: pod/namespace are the exporter's own target labels.
    text = (
        f'DCGM_FI_DEV_GPU_UTIL{{{NV},pod="dcgm-exporter-x",namespace="gpu-operator",'
        'exported_pod="trainer-0",exported_namespace="ml",exported_container="t"} 50\n'
        'DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-2",pod="dcgm-exporter-x",namespace="gpu-operator",'
        'exported_pod="",exported_namespace=""} 0\n'
    )
    a, b = parse_metrics(text).devices
    assert a.workloads == (Workload("ml", "trainer-0", "t"),)
    assert b.workloads == ()


# ---- AMD --------------------------------------------------------------------------------------

AMD = 'gpu_id="0",gpu_uuid="U0",serial_number="S0",hostname="h"'


def test_amd_pod_without_namespace_is_not_a_workload() -> None:
    # A real series had pod="default-metrics-exporter-..." and no namespace: the exporter's own pod.
    d = one(f'gpu_gfx_activity{{{AMD},pod="default-metrics-exporter-abc"}} 3\n')
    assert d.workloads == ()


def test_amd_power_takes_the_first_family_present_and_above_zero() -> None:
    text = f"gpu_gfx_activity{{{AMD}}} 1\ngpu_package_power{{{AMD}}} 0\ngpu_power_usage{{{AMD}}} 250\n"
    assert one(text).power_watts == 250.0
    only_zero = f"gpu_gfx_activity{{{AMD}}} 1\ngpu_package_power{{{AMD}}} 0\n"
    assert one(only_zero).power_watts == 0.0
    average = f"gpu_gfx_activity{{{AMD}}} 1\ngpu_average_package_power{{{AMD}}} 90\n"
    assert one(average).power_watts == 90.0


@pytest.mark.parametrize(
    ("partition", "mode", "sub", "util", "power"),
    [
        ("NA", "", None, 7.0, 300.0),  # unpartitioned
        ("0", "spx", None, 7.0, 300.0),  # SPX: one partition is the whole GPU
        ("0", "dpx", "part0", 7.0, 300.0),  # primary partition keeps its readings
        ("1", "dpx", "part1", None, None),  # non-primary: activity and power are not its own
        ("3", "cpx", "part3", None, None),
    ],
)
def test_amd_partitions(partition: str, mode: str, sub: str | None, util: float | None, power: float | None) -> None:
    labels = f'gpu_id="0",gpu_uuid="U{partition}",gpu_partition_id="{partition}",gpu_compute_partition_type="{mode}"'
    text = (
        f"amd_gpu_gfx_activity{{{labels}}} 7\namd_gpu_package_power{{{labels}}} 300\namd_gpu_used_vram{{{labels}}} 2\n"
    )
    d = one(text)
    assert (d.sub_device, d.utilization_pct, d.power_watts, d.memory_used_bytes) == (sub, util, power, 2 * MIB)


def test_amd_partitions_sharing_a_serial_stay_apart_by_uuid() -> None:
    text = "".join(
        f'gpu_gfx_activity{{gpu_id="{i}",gpu_uuid="U{i}",serial_number="SAME",gpu_partition_id="{i}",'
        f'gpu_compute_partition_type="cpx"}} 0\n'
        for i in range(4)
    )
    assert [d.device_id for d in parse_metrics(text).devices] == ["U0:part0", "U1:part1", "U2:part2", "U3:part3"]


def test_amd_forced_prefix_reads_only_that_prefix() -> None:
    text = f"xx_gpu_gfx_activity{{{AMD}}} 12\ngpu_gfx_activity{{{AMD}}} 99\n"
    assert one(text, vendor="amd", prefix="xx").utilization_pct == 12.0


# ---- Ascend -----------------------------------------------------------------------------------

ASC = 'id="3",model_name="Ascend910B3",vdie_id="V3"'


@pytest.mark.parametrize("raw", ["4294967295", "2147483647", "-1"])
def test_ascend_read_failure_sentinels_are_unknown_in_every_field(raw: str) -> None:
    text = (
        f"npu_chip_info_utilization{{{ASC}}} {raw} 1730000000000\n"
        f"npu_chip_info_hbm_used_memory{{{ASC}}} {raw} 1730000000000\n"
        f"npu_chip_info_hbm_total_memory{{{ASC}}} {raw} 1730000000000\n"
        f"npu_chip_info_power{{{ASC}}} {raw} 1730000000000\n"
    )
    d = one(text)
    assert (d.utilization_pct, d.memory_used_bytes, d.memory_total_bytes, d.power_watts) == (None, None, None, None)
    assert d.timestamp_ms == 1730000000000


def test_ascend_hbm_wins_over_ddr_and_old_builds_name_only_the_chip_id() -> None:
    text = 'npu_chip_info_used_memory{id="0"} 100\nnpu_chip_info_hbm_used_memory{id="0"} 200\n'
    d = one(text)
    assert (d.device_id, d.uuid, d.memory_used_bytes) == ("ascend:0", None, 200 * MIB)


def test_ascend_empty_vdie_id_falls_back_to_index() -> None:
    d = one('npu_chip_info_utilization{id="5",vdie_id=""} 12\n')
    assert (d.device_id, d.index) == ("ascend:5", 5)


def test_timestamps_keep_the_newest_per_device_and_untimed_samples_do_not_erase_it() -> None:
    text = (
        f"npu_chip_info_utilization{{{ASC}}} 1 1730000000500\n"
        f"npu_chip_info_power{{{ASC}}} 2 1730000000100\n"
        f"npu_chip_info_hbm_used_memory{{{ASC}}} 3\n"
    )
    assert one(text).timestamp_ms == 1730000000500


# ---- Enflame ----------------------------------------------------------------------------------

GCU = 'minor_number="0",uuid="GCU-1",host="h"'


def test_enflame_power_usage_is_a_percentage_never_watts() -> None:
    only_percent = f"enflame_gcu_usage{{{GCU}}} 5\nenflame_gcu_power_usage{{{GCU}}} 70.66\n"
    assert one(only_percent).power_watts is None
    both = only_percent + f"enflame_gcu_power_consumption{{{GCU}}} 212.0\n"
    assert one(both).power_watts == 212.0


def test_enflame_unsupported_minus_one_is_unknown() -> None:
    text = f"enflame_gcu_usage{{{GCU}}} -1\nenflame_gcu_power_consumption{{{GCU}}} -1\n"
    d = one(text)
    assert (d.utilization_pct, d.power_watts) == (None, None)


def test_enflame_is_detected_from_the_percentage_family_alone() -> None:
    result = parse_metrics(f"enflame_gcu_power_usage{{{GCU}}} 22\n")
    assert result.vendors == ("enflame",)
    assert result.devices == ()  # no family we read: no device, rather than a device of zeros


# ---- Cambricon --------------------------------------------------------------------------------


def mlu(i: int, vf: str = "") -> str:
    return f'mlu="{i}",uuid="MLU-{i}",sn="SN{i}",model="MLU370",node="n",vf="{vf}"'


def test_cambricon_container_metric_joins_on_uuid_only() -> None:
    text = (
        f"mlu_utilization{{{mlu(0)}}} 10\n"
        f"mlu_utilization{{{mlu(1)}}} 20\n"
        f'mlu_container{{{mlu(1)},namespace="a",pod="p1",container="c"}} 1\n'
        f'mlu_container{{{mlu(1)},namespace="b",pod="p2",container="c"}} 1\n'
    )
    d0, d1 = parse_metrics(text).devices
    assert d0.workloads == ()
    # A shared card: every pod on it is collected on the one device record.
    assert d1.workloads == (Workload("a", "p1", "c"), Workload("b", "p2", "c"))
    assert d1.utilization_pct == 20.0


def test_cambricon_vf_rows_are_sub_devices_and_join_on_uuid_and_vf() -> None:
    text = (
        f"mlu_utilization{{{mlu(0)}}} 50\n"
        f"mlu_utilization{{{mlu(0, vf='2')}}} 30\n"
        f'mlu_container{{{mlu(0, vf="2")},namespace="a",pod="vf-user",container="c"}} 1\n'
    )
    card, vf = parse_metrics(text).devices
    assert (card.device_id, card.sub_device, card.workloads) == ("MLU-0", None, ())
    assert (vf.device_id, vf.sub_device, vf.utilization_pct) == ("MLU-0:vf2", "vf2", 30.0)
    assert vf.workloads == (Workload("a", "vf-user", "c"),)


def test_cambricon_container_metric_zero_attributes_nothing() -> None:
    text = f'mlu_utilization{{{mlu(0)}}} 1\nmlu_container{{{mlu(0)},namespace="a",pod="gone",container="c"}} 0\n'
    assert one(text).workloads == ()


def test_cambricon_old_releases_reported_mib() -> None:
    d = one(f"mlu_memory_used{{{mlu(0)}}} 2048\nmlu_memory_total{{{mlu(0)}}} 49152\n")
    assert (d.memory_used_bytes, d.memory_total_bytes) == (2048 * MIB, 49152 * MIB)


def test_cambricon_custom_prefix() -> None:
    text = f"cam_utilization{{{mlu(0)}}} 44\n"
    assert parse_metrics(text).vendors == ()
    assert one(text, vendor="cambricon", prefix="cam").utilization_pct == 44.0
    # In auto mode the prefix goes to the vendors that take one, so detection finds it too.
    assert one(text, prefix="cam").vendor == "cambricon"


# ---- Hygon, Iluvatar, MetaX, Kunlunxin --------------------------------------------------------


def test_hygon_old_builds_without_pod_labels() -> None:
    d = one('dcu_utilizationrate{device_id="T8R1380013061601",minor_number="0",name="",node="n"} 12\n')
    assert (d.device_id, d.model, d.workloads, d.utilization_pct) == ("T8R1380013061601", None, (), 12.0)


def test_iluvatar_all_zero_serials_are_not_an_identity() -> None:
    text = (
        'ix_gpu_utilization{gpu="0",serial="00000000000000",node_name="ix"} 1\n'
        'ix_gpu_utilization{gpu="1",serial="00000000000000",node_name="ix"} 2\n'
    )
    assert [d.device_id for d in parse_metrics(text).devices] == ["ix:0", "ix:1"]


def test_metax_memory_reads_only_vram() -> None:
    labels = 'deviceId="0",uuid="M0"'
    text = (
        f'mx_memory_used{{{labels},type="vis_vram"}} 999\n'
        f'mx_memory_used{{{labels},type="vram"}} 1024\n'
        f'mx_memory_total{{{labels},type="vram"}} 2048\n'
    )
    d = one(text)
    assert (d.memory_used_bytes, d.memory_total_bytes) == (1024 * 1024, 2048 * 1024)


def test_kunlunxin_device_label_is_an_index_too() -> None:
    assert one('node_xpu_utilization{device="3"} 1\n').index == 3


# ---- detection, unknown vendors, Biren --------------------------------------------------------


def test_unknown_exporter_gives_no_devices_and_a_warning_naming_what_was_seen() -> None:
    result = parse_metrics("node_cpu_seconds_total 5\nsome_gpu_util 3\n")
    assert (result.devices, result.vendors) == ((), ())
    (warning,) = result.warnings
    assert "no known GPU exporter" in warning and "node_cpu_seconds_total" in warning and "nvidia" in warning


def test_unknown_vendor_name_is_refused_with_the_known_ones() -> None:
    with pytest.raises(MetricsError, match=r"unknown GPU vendor 'acme'.*nvidia"):
        parse_metrics("a 1\n", vendor="acme")


def test_a_prefix_for_a_vendor_without_one_is_refused() -> None:
    with pytest.raises(MetricsError, match="no configurable metric prefix"):
        parse_metrics("a 1\n", vendor="nvidia", prefix="x")


def test_biren_answers_no_known_exporter() -> None:
    result = parse_metrics(f"DCGM_FI_DEV_GPU_UTIL{{{NV}}} 1\n", vendor="biren")
    assert result.devices == ()
    assert result.vendors == ("biren",)
    assert any("no known Prometheus exporter" in w for w in result.warnings)


def test_two_exporters_in_one_text_give_both_vendors() -> None:
    text = f"DCGM_FI_DEV_GPU_UTIL{{{NV}}} 1\nenflame_gcu_usage{{{GCU}}} 2\n"
    result = parse_metrics(text)
    assert result.vendors == ("enflame", "nvidia")
    assert sorted(d.vendor for d in result.devices) == ["enflame", "nvidia"]


def test_samples_naming_no_device_are_counted_not_invented() -> None:
    result = parse_metrics('DCGM_FI_DEV_GPU_UTIL{Hostname="n"} 4\n')
    assert (result.devices, result.unattributed_samples) == ((), 1)
