"""Cambricon MLU mlu-exporter (Cambricon/mlu-exporter): pods joined from ``<prefix>_container`` on uuid+vf."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import ClassVar

from gpumetrics.adapters.base import (
    MEM_TOTAL,
    MEM_USED,
    MIB,
    POWER,
    UTIL,
    WORKLOAD,
    Draft,
    Rule,
    TableAdapter,
    register,
)
from gpumetrics.model import DeviceMetrics

# Before v2.0.11 memory was MiB. No MLU has less than 10 MB, so a smaller total is MiB.
MIB_TOTAL_BELOW = 1e7


@register
class CambriconAdapter(TableAdapter):
    name = "cambricon"
    exporter = "mlu-exporter (Cambricon/mlu-exporter), port 30108"
    prefixable = True
    default_prefix = "mlu_"  # --metrics-prefix=mlu in the official manifests
    rules: ClassVar[Mapping[str, Rule]] = {
        "utilization": Rule(UTIL),
        "memory_used": Rule(MEM_USED),
        "memory_total": Rule(MEM_TOTAL),
        "power_usage": Rule(POWER),
        # mlu_container{namespace,pod,container,uuid,vf} 1: the only place pods are named.
        "container": Rule(WORKLOAD),
    }
    serial_labels = ("sn",)
    index_labels = ("mlu",)
    model_labels = ("model",)

    def sub_device(self, labels: Mapping[str, str]) -> str | None:
        vf = labels.get("vf")
        return f"vf{vf}" if vf else None

    def finish(self, draft: Draft) -> DeviceMetrics:
        device = self.build(draft)
        total = device.memory_total_bytes
        if total is not None and total < MIB_TOTAL_BELOW:
            used = device.memory_used_bytes
            device = dataclasses.replace(
                device,
                memory_total_bytes=total * MIB,
                memory_used_bytes=None if used is None else used * MIB,
            )
        return device
