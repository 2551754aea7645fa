"""Hygon DCU dcu-exporter (Project-HAMi/dcu-exporter): physical DCUs and virtual DCUs (vDCU)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import ClassVar

from gpumetrics.adapters.base import (
    MEM_TOTAL,
    MEM_USED,
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
class HygonAdapter(TableAdapter):
    name = "hygon"
    exporter = "dcu-exporter (Project-HAMi/dcu-exporter), port 16080"
    rules: ClassVar[Mapping[str, Rule]] = {
        "dcu_utilizationrate": Rule(UTIL),
        "dcu_usedmemory_bytes": Rule(MEM_USED),
        "dcu_memorycap_bytes": Rule(MEM_TOTAL),
        "dcu_power_usage": Rule(POWER),
        # A vDCU series carries vdcu_minor_number and becomes its own sub-device record.
        "vdcu_utilizationrate": Rule(UTIL),
        "vdcu_usedmemory_bytes": Rule(MEM_USED),
    }
    # device_id is a board serial, not a UUID.
    uuid_labels = ()
    serial_labels = ("device_id",)
    index_labels = ("minor_number",)
    model_labels = ("name",)
    pci_labels = ("pcieBus_number",)
    # dcu-dcgm ignores the error of each rocm-smi call and exports the zero value: a powered DCU
    # never draws 0 W and never has 0 bytes of memory (pkg/dcgm/api.go of Project-HAMi/dcu-dcgm).
    zero_is_unread = frozenset({POWER, MEM_TOTAL})

    def sub_device(self, labels: Mapping[str, str]) -> str | None:
        vdcu = labels.get("vdcu_minor_number")
        return f"vdcu{vdcu}" if vdcu else None

    def finish(self, draft: Draft) -> DeviceMetrics:
        device = self.build(draft)
        if draft.sub_device is not None and device.memory_total_bytes is None:
            cap = draft.labels.get("vdcu_memory_cap", "")
            if cap.isascii() and cap.isdigit():
                device = dataclasses.replace(device, memory_total_bytes=int(cap))
        return unread_when_total_unknown(device)
