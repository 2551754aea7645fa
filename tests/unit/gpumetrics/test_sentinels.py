"""Each vendor's "not measured / not supported" values read as unknown (None), never as a number
(gpumetrics/adapters/sentinels.py; the sources are listed in docs/metrics.md "Sentinels")."""

from __future__ import annotations

import pytest

from gpumetrics import DeviceMetrics, parse_metrics, parse_text
from gpumetrics.promtext import UNAVAILABLE_WORDS

MIB = 1024 * 1024


def one(text: str, vendor: str = "auto") -> DeviceMetrics:
    result = parse_metrics(text, vendor=vendor)
    assert result.bad_lines == 0, result.bad_line_examples
    assert len(result.devices) == 1, result
    return result.devices[0]


@pytest.mark.parametrize("word", sorted(UNAVAILABLE_WORDS))
def test_unavailable_words_are_unknown_values_not_bad_lines(word: str) -> None:
    parsed = parse_text(f'x{{a="1"}} {word}\nx {word} 1730000000123\n')
    assert parsed.bad_lines == 0
    assert [s.timestamp_ms for s in parsed.samples] == [None, 1730000000123]
    assert all(s.value != s.value for s in parsed.samples)  # NaN


@pytest.mark.parametrize("text", ["x ERROR - FAILED TO CONVERT TO STRING", "x n/a", "x [N/A] 1.5", "x N/A 1 2"])
def test_other_text_stays_a_bad_line(text: str) -> None:
    assert parse_text(text).bad_lines == 1


NV = 'gpu="0",UUID="GPU-1",Hostname="n1"'


@pytest.mark.parametrize(
    "raw",
    [
        "2147483632",  # DCGM_INT32_BLANK
        "2147483633",  # DCGM_INT32_NOT_FOUND
        "2147483634",  # DCGM_INT32_NOT_SUPPORTED
        "2147483635",  # DCGM_INT32_NOT_PERMISSIONED
        "9223372036854775792",  # DCGM_INT64_BLANK
        "9223372036854775794",  # DCGM_INT64_NOT_SUPPORTED
        "140737488355328",  # DCGM_FP64_BLANK
        "140737488355330",  # DCGM_FP64_NOT_SUPPORTED
        "<<<NOT_SUPPORTED>>>",
        "[N/A]",
        "[Not Supported]",
    ],
)
def test_nvidia_dcgm_blanks_in_every_field(raw: str) -> None:
    families = ["GPU_UTIL", "FB_USED", "FB_FREE", "FB_TOTAL", "POWER_USAGE"]
    d = one("".join(f"DCGM_FI_DEV_{f}{{{NV}}} {raw}\n" for f in families))
    assert (d.utilization_pct, d.memory_used_bytes, d.memory_total_bytes, d.power_watts) == (None, None, None, None)


def test_nvidia_readings_just_below_the_blanks_are_numbers() -> None:
    d = one(f"DCGM_FI_DEV_FB_USED{{{NV}}} 2147483631\nDCGM_FI_DEV_POWER_USAGE{{{NV}}} 140737488355327\n")
    assert d.memory_used_bytes == 2147483631 * MIB and d.power_watts == 140737488355327.0


AMD = 'gpu_id="0",gpu_uuid="U-0",gpu_partition_id="NA",hostname="n1"'


@pytest.mark.parametrize("raw", ["65535", "2147483647", "4294967295", "4294967296", "18446744073709551615", "N/A"])
def test_amd_not_applicable_values_in_every_field(raw: str) -> None:
    families = ["gpu_gfx_activity", "gpu_used_vram", "gpu_total_vram", "gpu_package_power"]
    d = one("".join(f"{f}{{{AMD}}} {raw}\n" for f in families), "amd")
    assert (d.utilization_pct, d.memory_used_bytes, d.memory_total_bytes, d.power_watts) == (None, None, None, None)


def test_amd_255_is_a_reading_where_it_can_be_one() -> None:
    d = one(f"gpu_gfx_activity{{{AMD}}} 255\ngpu_used_vram{{{AMD}}} 255\ngpu_package_power{{{AMD}}} 255\n", "amd")
    assert (d.utilization_pct, d.memory_used_bytes, d.power_watts) == (None, 255 * MIB, 255.0)


ASCEND = 'id="0",vdie_id="D-0",model_name="Ascend910"'


@pytest.mark.parametrize("raw", ["4294967295", "4294967296", "2147483647", "-1"])
def test_ascend_read_failures(raw: str) -> None:
    d = one(f"npu_chip_info_utilization{{{ASCEND}}} {raw} 1730000000123\nnpu_chip_info_power{{{ASCEND}}} 80\n")
    assert d.utilization_pct is None and d.power_watts == 80.0


@pytest.mark.parametrize(
    "text, vendor",
    [
        (
            'enflame_gcu_usage{uuid="G-0",minor_number="0"} -1\nenflame_gcu_power_consumption{uuid="G-0"} 60\n',
            "enflame",
        ),
        ('mlu_utilization{uuid="M-0",mlu="0",vf=""} -100\nmlu_power_usage{uuid="M-0",mlu="0",vf=""} 60\n', "cambricon"),
    ],
)
def test_enflame_and_cambricon_negative_unsupported(text: str, vendor: str) -> None:
    d = one(text, vendor)
    assert d.utilization_pct is None and d.power_watts == 60.0


HY = 'device_id="PAK1",minor_number="0",node="n1"'
IX = 'gpu="0",uuid="IX-0",node_name="n1"'


@pytest.mark.parametrize(
    "text, vendor",
    [
        (
            f"dcu_utilizationrate{{{HY}}} 0\ndcu_usedmemory_bytes{{{HY}}} 0\n"
            f"dcu_memorycap_bytes{{{HY}}} 0\ndcu_power_usage{{{HY}}} 0\n",
            "hygon",
        ),
        (
            f"ix_gpu_utilization{{{IX}}} 0\nix_mem_used{{{IX}}} 0\nix_mem_total{{{IX}}} 0\nix_power_usage{{{IX}}} 0\n",
            "iluvatar",
        ),
    ],
)
def test_a_device_whose_driver_calls_failed_reads_unknown_not_idle(text: str, vendor: str) -> None:
    """These exporters write 0 when a call fails; 0 W and 0 bytes of memory are never readings."""
    d = one(text, vendor)
    assert (d.utilization_pct, d.memory_used_bytes, d.memory_total_bytes, d.power_watts) == (None, None, None, None)


def test_hygon_idle_device_with_its_memory_known_is_idle() -> None:
    d = one(f"dcu_utilizationrate{{{HY}}} 0\ndcu_usedmemory_bytes{{{HY}}} 0\ndcu_memorycap_bytes{{{HY}}} 1024\n")
    assert (d.utilization_pct, d.memory_used_bytes, d.memory_total_bytes) == (0.0, 0, 1024)
