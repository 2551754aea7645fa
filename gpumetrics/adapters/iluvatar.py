"""Iluvatar CoreX ix-exporter (Deep-Spark/ix-exporter). Serials repeat: identity is the uuid."""

from __future__ import annotations

from collections.abc import Mapping
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
    unread_when_total_unknown,
)
from gpumetrics.model import DeviceMetrics


@register
class IluvatarAdapter(TableAdapter):
    name = "iluvatar"
    exporter = "ix-exporter (Deep-Spark/ix-exporter), port 32021"
    rules: ClassVar[Mapping[str, Rule]] = {
        "ix_gpu_utilization": Rule(UTIL),
        "ix_mem_used": Rule(MEM_USED, MIB),
        "ix_mem_total": Rule(MEM_TOTAL, MIB),
        "ix_mem_free": Rule(MEM_FREE, MIB),
        "ix_power_usage": Rule(POWER),
    }
    serial_labels = ("serial",)
    index_labels = ("gpu",)
    model_labels = ("name",)
    # ix-exporter returns 0 when an IXML call fails (pkg/collector/gpu_collector.go): a powered GPU
    # never draws 0 W and never has 0 bytes of memory.
    zero_is_unread = frozenset({POWER, MEM_TOTAL})

    def finish(self, draft: Draft) -> DeviceMetrics:
        return unread_when_total_unknown(self.build(draft))
