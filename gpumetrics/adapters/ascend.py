"""Huawei Ascend npu-exporter (Ascend/mind-cluster): 910 (HBM) and 310 (DDR), read-failure sentinels."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from gpumetrics.adapters.base import MEM_TOTAL, MEM_USED, MIB, POWER, UTIL, Rule, TableAdapter, register
from gpumetrics.adapters.sentinels import ASCEND_SENTINELS


@register
class AscendAdapter(TableAdapter):
    name = "ascend"
    exporter = "npu-exporter (Ascend/mind-cluster), port 8082"
    rules: ClassVar[Mapping[str, Rule]] = {
        "npu_chip_info_utilization": Rule(UTIL),
        # 910 series: HBM; 310 series has no HBM and reports DDR. "MB" means MiB.
        "npu_chip_info_hbm_used_memory": Rule(MEM_USED, MIB, rank=0),
        "npu_chip_info_used_memory": Rule(MEM_USED, MIB, rank=1),
        "npu_chip_info_hbm_total_memory": Rule(MEM_TOTAL, MIB, rank=0),
        "npu_chip_info_total_memory": Rule(MEM_TOTAL, MIB, rank=1),
        "npu_chip_info_power": Rule(POWER),
    }
    uuid_labels = ("vdie_id",)  # empty in some versions: then "<node>:<id>"
    index_labels = ("id",)
    model_labels = ("model_name",)
    pci_labels = ("pcie_bus_info",)

    def is_sentinel(self, raw: float) -> bool:
        return raw in ASCEND_SENTINELS
