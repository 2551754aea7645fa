"""The common per-device model every vendor adapter produces (design §10; docs/metrics.md, "The model").

Units are normalised here once: bytes, watts, percent 0-100. ``None`` always means
"unknown" (not reported, unsupported, a sentinel, out of range) and is never 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["DeviceMetrics", "ParseResult", "Workload"]


@dataclass(frozen=True, slots=True, order=True)
class Workload:
    """A container the exporter says is using the device. Never holds empty strings."""

    namespace: str
    pod: str
    container: str | None = None

    def to_json(self) -> dict[str, str | None]:
        return {"namespace": self.namespace, "pod": self.pod, "container": self.container}


@dataclass(frozen=True, slots=True)
class DeviceMetrics:
    """One device (a whole GPU/NPU/DCU/MLU/GCU, or a MIG instance, partition, VF or vDCU).

    ``device_id`` is the stable key: the vendor UUID, else a serial, else ``<node>:<index>``
    (``<vendor>:<index>`` when the exporter names no node), with ``:<sub_device>`` appended for
    an instance. It is never empty.
    """

    vendor: str
    device_id: str
    index: int | None = None
    uuid: str | None = None
    node: str | None = None
    model: str | None = None
    pci_bus_id: str | None = None
    # "mig1", "part3", "vf2", "vdcu4"; None for a whole device.
    sub_device: str | None = None
    workloads: tuple[Workload, ...] = ()
    utilization_pct: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    power_watts: float | None = None
    # The newest sample timestamp of this device, when the exposition carries timestamps.
    timestamp_ms: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The object ``gpushare metrics parse -o json`` prints: exactly these keys, unknowns as ``null``."""
        return {
            "vendor": self.vendor,
            "index": self.index,
            "device_id": self.device_id,
            "uuid": self.uuid,
            "utilization_pct": self.utilization_pct,
            "memory_used_bytes": self.memory_used_bytes,
            "memory_total_bytes": self.memory_total_bytes,
            "power_w": self.power_watts,
            "pods": [w.to_json() for w in self.workloads],
        }


@dataclass(frozen=True, slots=True)
class ParseResult:
    """What one scrape turned into. A bad line never fails the parse; it is counted here."""

    devices: tuple[DeviceMetrics, ...]
    # The adapters that ran (detected or forced), in registry order.
    vendors: tuple[str, ...]
    samples: int
    bad_lines: int
    bad_line_examples: tuple[str, ...] = ()
    # Samples of a known family that name no device (no uuid, serial or index label).
    unattributed_samples: int = 0
    # Human-readable reasons why the result may be empty or partial (no known exporter, ...).
    warnings: tuple[str, ...] = ()
