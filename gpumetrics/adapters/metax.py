"""MetaX mx-exporter (MACA SDK). LOW CONFIDENCE: names and units from third parties."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from gpumetrics.adapters.base import KIB, MEM_TOTAL, MEM_USED, POWER, UTIL, Rule, TableAdapter, register

MEMORY_FAMILIES = frozenset({"mx_memory_used", "mx_memory_total"})


@register
class MetaxAdapter(TableAdapter):
    name = "metax"
    exporter = "mx-exporter (MetaX MACA SDK), port 8000 -- low confidence, no real scrape seen"
    rules: ClassVar[Mapping[str, Rule]] = {
        "mx_gpu_usage": Rule(UTIL),
        "mx_memory_used": Rule(MEM_USED, KIB),
        "mx_memory_total": Rule(MEM_TOTAL, KIB),
        "mx_board_power": Rule(POWER, scale=0.001),  # milliwatts
    }
    index_labels = ("deviceId",)

    def accepts(self, key: str, labels: Mapping[str, str]) -> bool:
        # Memory families carry one series per memory type; device memory is type="vram".
        return key not in MEMORY_FAMILIES or labels.get("type", "vram") == "vram"
