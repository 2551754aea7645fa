"""Every exporter page in ``tests/fixtures/metrics/`` normalises to exactly its values in ``expected.py``."""

from __future__ import annotations

import pytest

from gpumetrics import DeviceMetrics, parse_metrics
from tests.unit.gpumetrics.expected import EXPECTED, Expect, fixture_text, fixtures_dir


def test_every_shared_fixture_has_expected_values() -> None:
    # A fixture added to tests/fixtures/metrics/ without expectations here must fail, not pass unchecked.
    on_disk = {p.name for p in fixtures_dir().glob("*.prom")}
    assert on_disk == set(EXPECTED)


def _observed(d: DeviceMetrics) -> Expect:
    return Expect(
        d.device_id,
        d.index,
        d.utilization_pct,
        d.memory_used_bytes,
        d.memory_total_bytes,
        d.power_watts,
        d.workloads,
        d.sub_device,
    )


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_normalises_exactly(name: str) -> None:
    vendor, expected = EXPECTED[name]
    result = parse_metrics(fixture_text(name))
    assert result.vendors == (vendor,)
    assert result.bad_lines == 0
    assert result.unattributed_samples == 0
    assert result.warnings == ()
    assert [_observed(d) for d in result.devices] == list(expected)
    assert all(d.vendor == vendor for d in result.devices)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_forcing_the_detected_vendor_changes_nothing(name: str) -> None:
    vendor, _ = EXPECTED[name]
    assert parse_metrics(fixture_text(name), vendor=vendor) == parse_metrics(fixture_text(name))


@pytest.mark.parametrize(
    ("name", "field", "values"),
    [
        # Unknown stays None, never 0: the 310P chip 1 utilization is uint32 max (read failure).
        ("ascend-310p.prom", "utilization_pct", [0.0, None]),
        # Non-primary AMD partitions: no gfx activity and no power of their own.
        ("amd-prefixed-partitioned.prom", "power_watts", [168.0, None]),
        # Ascend samples carry their own millisecond timestamps; the newest per device is kept.
        ("ascend.prom", "timestamp_ms", [1730000000123, 1730000000160]),
        ("nvidia.prom", "timestamp_ms", [None, None]),
        ("nvidia.prom", "node", ["gpu-node-a", "gpu-node-a"]),
        ("nvidia.prom", "pci_bus_id", ["00000000:18:00.0", "00000000:2A:00.0"]),
        ("nvidia-mig.prom", "node", ["mig-node-7", "mig-node-7"]),
        ("enflame.prom", "uuid", ["GCU-T6P0A2400310", "GCU-T6P0A2400378"]),
        ("hygon.prom", "uuid", ["PAK1520120050301", "PAK1520120050477", "PAK1520120050477"]),
        ("cambricon.prom", "model", ["MLU370-X8", "MLU370-X8"]),
        ("amd.prom", "model", ["AMD Instinct MI300X OAM", "AMD Instinct MI300X OAM"]),
    ],
)
def test_fixture_details(name: str, field: str, values: list[object]) -> None:
    assert [getattr(d, field) for d in parse_metrics(fixture_text(name)).devices] == values


def test_cli_json_keys_are_exactly_the_issue_s() -> None:
    device = parse_metrics(fixture_text("nvidia.prom")).devices[0]
    assert list(device.to_json()) == [
        "vendor",
        "index",
        "device_id",
        "uuid",
        "utilization_pct",
        "memory_used_bytes",
        "memory_total_bytes",
        "power_w",
        "pods",
    ]
    assert device.to_json()["pods"] == [{"namespace": "team-ml", "pod": "llm-train-0", "container": "trainer"}]
