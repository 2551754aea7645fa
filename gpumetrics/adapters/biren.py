"""Biren: no public Prometheus exporter is known. A stub that reads nothing."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from gpumetrics.adapters.base import AdapterOutput, GpuAdapter, register
from gpumetrics.promtext import Sample

NO_EXPORTER = (
    "biren: no known Prometheus exporter (HAMi schedules Biren devices but nobody has published "
    "metric names or a scrape), so no device can be read; utilization stays unknown and spot "
    "lending stays off for these GPUs"
)


@register
class BirenAdapter(GpuAdapter):
    name = "biren"
    exporter = "none known"
    has_exporter = False
    warning = NO_EXPORTER

    def claims(self, metric_names: Collection[str]) -> bool:
        return False

    def devices(self, samples: Sequence[Sample]) -> AdapterOutput:
        return AdapterOutput([], 0)
