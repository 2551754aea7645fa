"""Enflame GCU gcu-exporter (EnflameTechnology/gcu-exporter): watts come from power_consumption only."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from gpumetrics.adapters.base import MEM_TOTAL, MEM_USED, POWER, UTIL, Rule, TableAdapter, register


@register
class EnflameAdapter(TableAdapter):
    name = "enflame"
    exporter = "gcu-exporter (EnflameTechnology/gcu-exporter), port 9400"
    # enflame_gcu_power_usage is consumption / capability x 100 (a percentage) and
    # enflame_gcu_memory_usage a 0..1 ratio: neither is a unit we report, so neither is read.
    rules: ClassVar[Mapping[str, Rule]] = {
        "enflame_gcu_usage": Rule(UTIL),
        "enflame_gcu_memory_used_bytes": Rule(MEM_USED),
        "enflame_gcu_memory_total_bytes": Rule(MEM_TOTAL),
        "enflame_gcu_power_consumption": Rule(POWER),
    }
    signature = frozenset({*rules, "enflame_gcu_power_usage", "enflame_gcu_health", "enflame_gcu_memory_usage"})
    index_labels = ("minor_number",)
    model_labels = ("name",)
    pci_labels = ("busid",)
