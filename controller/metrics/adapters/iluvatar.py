"""Iluvatar CoreX ix-exporter (Deep-Spark/ix-exporter). Serials repeat: identity is the uuid."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from controller.metrics.adapters.base import (
    MEM_FREE,
    MEM_TOTAL,
    MEM_USED,
    MIB,
    POWER,
    UTIL,
    Rule,
    TableAdapter,
    register,
)


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
