"""NVIDIA dcgm-exporter (NVIDIA/dcgm-exporter): both label generations, MIG, blank sentinels."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import ClassVar

from gpumetrics.adapters.base import (
    MEM_FREE,
    MEM_RESERVED,
    MEM_TOTAL,
    MEM_USED,
    MIB,
    POWER,
    UTIL,
    Rule,
    TableAdapter,
    register,
)
from gpumetrics.adapters.sentinels import is_dcgm_blank


@register
class NvidiaAdapter(TableAdapter):
    name = "nvidia"
    exporter = "dcgm-exporter (NVIDIA/dcgm-exporter), port 9400"
    rules: ClassVar[Mapping[str, Rule]] = {
        "DCGM_FI_DEV_GPU_UTIL": Rule(UTIL),
        # MIG instances (and some Hopper setups) have no GPU_UTIL: the engine-active ratio is next best.
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": Rule(UTIL, scale=100.0, rank=1),
        "DCGM_FI_DEV_FB_USED": Rule(MEM_USED, MIB),
        "DCGM_FI_DEV_FB_TOTAL": Rule(MEM_TOTAL, MIB),
        "DCGM_FI_DEV_FB_FREE": Rule(MEM_FREE, MIB),
        "DCGM_FI_DEV_FB_RESERVED": Rule(MEM_RESERVED, MIB),
        "DCGM_FI_DEV_POWER_USAGE": Rule(POWER),
    }
    uuid_labels = ("UUID", "uuid")  # "uuid" with --use-old-namespace
    index_labels = ("gpu",)
    model_labels = ("modelName",)
    pci_labels = ("pci_bus_id",)

    def metric_key(self, name: str, prefix: str) -> str | None:
        # Some relabelling setups lower-case the families (dcgm_fi_dev_gpu_util).
        upper = name.upper()
        return upper if upper in self.rules else None

    def claims(self, metric_names: Collection[str]) -> bool:
        return any(name[:8].upper() == "DCGM_FI_" for name in metric_names)

    def sub_device(self, labels: Mapping[str, str]) -> str | None:
        instance = labels.get("GPU_I_ID")
        return f"mig{instance}" if instance else None

    def is_sentinel(self, raw: float) -> bool:
        return is_dcgm_blank(raw)
