"""Moore Threads mtgpu exporter (no public source). LOW CONFIDENCE: third-party names only."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from gpumetrics.adapters.base import MEM_TOTAL, MEM_USED, POWER, UTIL, Rule, TableAdapter, register


@register
class MthreadsAdapter(TableAdapter):
    name = "mthreads"
    exporter = "mtgpu exporter -- low confidence, no public source or scrape seen"
    rules: ClassVar[Mapping[str, Rule]] = {
        "mtgpu_gpu_utilization": Rule(UTIL),
        "mtgpu_memory_used_bytes": Rule(MEM_USED),
        "mtgpu_memory_total_bytes": Rule(MEM_TOTAL),
        "mtgpu_power_usage_milliwatts": Rule(POWER, scale=0.001),
    }
    index_labels = ("index",)
    model_labels = ("name",)
