"""AMD Device Metrics Exporter (ROCm/device-metrics-exporter): optional prefix, partitioned MI300."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from typing import ClassVar

from gpumetrics.adapters.base import (
    MEM_FREE,
    MEM_TOTAL,
    MEM_USED,
    MIB,
    POWER,
    UTIL,
    Draft,
    Rule,
    TableAdapter,
    register,
)
from gpumetrics.adapters.sentinels import is_amd_not_applicable
from gpumetrics.model import DeviceMetrics

PARTITION_ID = "gpu_partition_id"
COMPUTE_PARTITION_TYPE = "gpu_compute_partition_type"
# "NA" (or nothing) means the GPU is not partitioned; SPX is one partition spanning the GPU.
UNPARTITIONED = frozenset({"", "NA", "na"})
WHOLE_GPU_MODES = frozenset({"", "spx", "SPX"})


@register
class AmdAdapter(TableAdapter):
    name = "amd"
    exporter = "device-metrics-exporter (ROCm/device-metrics-exporter), port 5000"
    prefixable = True
    rules: ClassVar[Mapping[str, Rule]] = {
        "gpu_gfx_activity": Rule(UTIL),
        "gpu_used_vram": Rule(MEM_USED, MIB),
        "gpu_total_vram": Rule(MEM_TOTAL, MIB),
        "gpu_free_vram": Rule(MEM_FREE, MIB),
        # MI3xx, then MI2xx/MI3xx (absent in SR-IOV guests), then MI2xx/Radeon.
        "gpu_package_power": Rule(POWER, rank=0),
        "gpu_power_usage": Rule(POWER, rank=1),
        "gpu_average_package_power": Rule(POWER, rank=2),
    }
    # Power names are too generic to say "AMD" on their own.
    signature = frozenset({"gpu_gfx_activity", "gpu_used_vram", "gpu_total_vram"})
    uuid_labels = ("gpu_uuid",)
    serial_labels = ("serial_number",)
    index_labels = ("gpu_id",)
    model_labels = ("card_series", "card_model")
    pci_labels = ("pci_bus_id", "pcie_bus_id")

    def resolve_prefix(self, metric_names: Collection[str]) -> str:
        """The configured prefix, else the one in front of a signature family (``amd_`` is common)."""
        if self.prefix is not None:
            return self.prefix
        for base in sorted(self.signature or ()):
            for name in metric_names:
                if name.endswith(base):
                    head = name[: -len(base)]
                    if head == "" or head.endswith("_"):
                        return head
        return ""

    def sub_device(self, labels: Mapping[str, str]) -> str | None:
        partition = labels.get(PARTITION_ID, "")
        if partition in UNPARTITIONED:
            return None
        if partition == "0" and labels.get(COMPUTE_PARTITION_TYPE, "") in WHOLE_GPU_MODES:
            return None
        return f"part{partition}"

    def is_sentinel(self, raw: float) -> bool:
        return is_amd_not_applicable(raw)

    def pick(self, draft: Draft, field: str) -> float | None:
        if field != POWER:
            return draft.get(field)
        # "The first one present and > 0": a 0 from one family is often "not on this model".
        readings = draft.ranked(POWER)
        return next((r for r in readings if r > 0), readings[0] if readings else None)

    def finish(self, draft: Draft) -> DeviceMetrics:
        device = self.build(draft)
        if draft.sub_device is not None and draft.labels.get(PARTITION_ID) != "0":
            # Non-primary partitions: power reads 0 and gfx activity is the primary's (metric list).
            device = dataclasses.replace(device, utilization_pct=None, power_watts=None)
        return device
