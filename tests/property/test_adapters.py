"""Property tests for the metrics path: arbitrary text never raises, missing is never zero."""

from __future__ import annotations

import math
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpumetrics import AUTO, ParseResult, adapter_names, get_adapter, parse_metrics, parse_text
from gpumetrics.adapters.base import MEM_FREE, MEM_TOTAL, MEM_USED, POWER, UTIL, TableAdapter
from tests.unit.gpumetrics.expected import EXPECTED, fixture_text

FIXTURES = sorted(EXPECTED)
VENDORS = [AUTO, *adapter_names()]


def check_invariants(result: ParseResult) -> None:
    """What every device of every result must satisfy, whatever the input."""
    for d in result.devices:
        assert d.device_id
        assert d.utilization_pct is None or 0.0 <= d.utilization_pct <= 100.0
        for value in (d.memory_used_bytes, d.memory_total_bytes):
            assert value is None or (isinstance(value, int) and value >= 0)
        assert d.power_watts is None or (math.isfinite(d.power_watts) and d.power_watts >= 0)
        for w in d.workloads:
            assert w.namespace and w.pod and w.container != ""
    assert result.bad_lines >= 0 and len(result.bad_line_examples) <= result.bad_lines


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.text(), vendor=st.sampled_from(VENDORS))
def test_arbitrary_text_never_raises(text: str, vendor: str) -> None:
    result = parse_metrics(text, vendor=vendor)
    check_invariants(result)
    lines = [line.strip() for line in text.split("\n")]
    content = [line for line in lines if line and not line.startswith("#")]
    assert result.samples + result.bad_lines == len(content)


# Text built from the exposition format's own pieces finds more corners than random unicode.
piece = st.sampled_from(
    [
        "DCGM_FI_DEV_GPU_UTIL",
        "gpu_gfx_activity",
        "amd_gpu_used_vram",
        "npu_chip_info_utilization",
        "mlu_container",
        "enflame_gcu_usage",
        "{",
        "}",
        '"',
        "\\",
        "=",
        ",",
        " ",
        "\t",
        "\n",
        "#",
        'gpu="0"',
        'UUID="GPU-1"',
        'uuid="U"',
        'pod="p"',
        'namespace="n"',
        'vf="1"',
        'gpu_partition_id="1"',
        "NaN",
        "+Inf",
        "-1",
        "4294967295",
        "9223372036854775794",
        "1e400",
        "0.5",
        "101",
        "1730000000123",
        "1_0",
    ]
)


@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow])
@given(parts=st.lists(piece, max_size=60), vendor=st.sampled_from(VENDORS))
def test_format_shaped_garbage_never_raises(parts: list[str], vendor: str) -> None:
    text = "".join(parts)
    check_invariants(parse_metrics(text, vendor=vendor))
    parse_text(text)


# For each model field, the rule fields whose families can produce it (total = used + free fallback).
SOURCES = {
    "utilization_pct": {UTIL},
    "memory_used_bytes": {MEM_USED},
    "memory_total_bytes": {MEM_TOTAL, MEM_FREE},
    "power_watts": {POWER},
}


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(FIXTURES), field=st.sampled_from(sorted(SOURCES)))
def test_dropping_every_source_of_a_field_makes_it_unknown_never_zero(name: str, field: str) -> None:
    vendor, _ = EXPECTED[name]
    adapter = get_adapter(vendor)
    assert isinstance(adapter, TableAdapter)
    text = fixture_text(name)
    names = {s.name for s in parse_text(text).samples}
    prefix = adapter.resolve_prefix(names)
    dropped = {
        n for n in names if (key := adapter.metric_key(n, prefix)) and adapter.rules[key].field in SOURCES[field]
    }
    assert dropped, f"{name} has no family for {field}"
    kept = "\n".join(line for line in text.split("\n") if not any(line.startswith((d + "{", d + " ")) for d in dropped))
    result = parse_metrics(kept, vendor=vendor)
    check_invariants(result)
    for d in result.devices:
        if field == "memory_total_bytes" and (d.sub_device or "").startswith("vdcu"):
            continue  # a vDCU's total is its vdcu_memory_cap label, not a family
        assert getattr(d, field) is None, (name, d.device_id, field)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(FIXTURES), seed=st.integers(0, 2**32 - 1))
def test_corrupted_lines_are_counted_and_other_devices_are_untouched(name: str, seed: int) -> None:
    rng = random.Random(seed)
    lines = fixture_text(name).split("\n")
    sample_rows = [i for i, line in enumerate(lines) if line and not line.startswith("#")]
    broken = set(rng.sample(sample_rows, k=rng.randint(1, min(3, len(sample_rows)))))
    for i in broken:
        lines[i] = lines[i].rsplit(" ", 1)[0] + " ERROR - FAILED TO CONVERT TO STRING"
    result = parse_metrics("\n".join(lines))
    assert result.bad_lines == len(broken)
    check_invariants(result)
    corrupted = [lines[i] for i in broken]
    after = {d.device_id: d for d in result.devices}
    for before in parse_metrics(fixture_text(name)).devices:
        if before.uuid is not None and not any(before.uuid in line for line in corrupted):
            assert after[before.device_id] == before


@settings(max_examples=100)
@given(name=st.sampled_from(FIXTURES), seed=st.integers(0, 2**32 - 1))
def test_line_order_does_not_change_the_devices(name: str, seed: int) -> None:
    text = fixture_text(name)
    lines = [line for line in text.split("\n") if line and not line.startswith("#")]
    random.Random(seed).shuffle(lines)
    assert parse_metrics("\n".join(lines)).devices == parse_metrics(text).devices


# "Not measured" as each vendor writes it (gpumetrics/adapters/sentinels.py, docs/metrics.md "Sentinels"),
# and what every vendor shares: NaN, infinities, negatives, and the unavailable words.
SHARED_SENTINELS = ["NaN", "+Inf", "-1", "-100", "N/A", "[N/A]", "NA", "[Not Supported]", "<<<NOT_SUPPORTED>>>"]
VENDOR_SENTINELS = {
    "nvidia": [
        "2147483632",
        "2147483634",
        "2147483647",
        "9223372036854775792",
        "9223372036854775794",
        "140737488355328",
        "140737488355330",
    ],
    "amd": ["65535", "2147483647", "4294967295", "4294967296", "18446744073709551615"],
    "ascend": ["4294967295", "4294967296", "2147483647"],
}


def _with_value(line: str, value: str) -> str:
    """The sample line with its value replaced, its timestamp (if any) kept."""
    head, brace, tail = line.rpartition("}")
    if not brace:
        head, _, tail = line.partition(" ")
    fields = tail.split()
    return f"{head}{brace} {' '.join([value, *fields[1:]])}"


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(FIXTURES), field=st.sampled_from(sorted(SOURCES)), data=st.data())
def test_a_sentinel_in_every_source_of_a_field_is_unknown_and_not_a_bad_line(
    name: str, field: str, data: st.DataObject
) -> None:
    vendor, _ = EXPECTED[name]
    sentinel = data.draw(st.sampled_from(SHARED_SENTINELS + VENDOR_SENTINELS.get(vendor, [])), label="sentinel")
    adapter = get_adapter(vendor)
    assert isinstance(adapter, TableAdapter)
    text = fixture_text(name)
    names = {s.name for s in parse_text(text).samples}
    prefix = adapter.resolve_prefix(names)
    fed = {n for n in names if (key := adapter.metric_key(n, prefix)) and adapter.rules[key].field in SOURCES[field]}
    lines = [
        _with_value(line, sentinel) if any(line.startswith((f + "{", f + " ")) for f in fed) else line
        for line in text.split("\n")
    ]
    result = parse_metrics("\n".join(lines), vendor=vendor)
    assert result.bad_lines == parse_metrics(text, vendor=vendor).bad_lines
    check_invariants(result)
    for d in result.devices:
        if field == "memory_total_bytes" and (d.sub_device or "").startswith("vdcu"):
            continue  # a vDCU's total is its vdcu_memory_cap label, not a family
        assert getattr(d, field) is None, (name, d.device_id, field, sentinel)


@settings(max_examples=300)
@given(value=st.floats(min_value=0, max_value=100, allow_nan=False), vendor=st.sampled_from(sorted(VENDOR_SENTINELS)))
def test_every_reading_below_the_sentinels_is_kept(value: float, vendor: str) -> None:
    """The sentinel rules take nothing that is a reading: any utilization 0..100 stays a number."""
    adapter = get_adapter(vendor)
    assert isinstance(adapter, TableAdapter)
    (rule,) = [r for r in adapter.rules.values() if r.field == UTIL and r.scale == 1.0][:1]
    assert adapter.clean(rule, value) == value
