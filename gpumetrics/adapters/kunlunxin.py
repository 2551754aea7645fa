"""Kunlunxin XPU xpu-exporter (shipped with the XPU device plugin). LOW CONFIDENCE: units and labels guessed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from gpumetrics.adapters.base import MEM_FREE, MEM_TOTAL, MEM_USED, POWER, UTIL, Rule, TableAdapter, register


@register
class KunlunxinAdapter(TableAdapter):
    name = "kunlunxin"
    exporter = "xpu-exporter (Kunlunxin XPU device plugin), port 9507 -- low confidence, units guessed"
    rules: ClassVar[Mapping[str, Rule]] = {
        "node_xpu_utilization": Rule(UTIL),
        # Bytes is a guess shared with a third-party normalizer; nobody has published a scrape.
        "node_xpu_memused": Rule(MEM_USED),
        "node_xpu_memtotal": Rule(MEM_TOTAL),
        "node_xpu_memfree": Rule(MEM_FREE),
        "node_xpu_powerUsage": Rule(POWER),
    }
    index_labels = ("card", "device")
    model_labels = ("name",)
