"""Vendor GPU metrics adapters (design §10; each vendor's names, units and quirks: docs/metrics.md).

Each vendor's exporter text becomes the same per-device model, ``DeviceMetrics``: bytes,
watts, percent, pods; unknown is None, never 0. One ``GpuAdapter`` per vendor, registered
by name (``adapter_names()``, ``get_adapter(name)``); ``parse_metrics(text)`` detects the
vendor from the metric names unless told. Our own lenient text-format parser
(``promtext.parse_text``) skips and counts a bad line instead of failing the scrape.

Decision code only: stdlib, ``gpushare`` and ``controller.errors``; no I/O, no clock.
"""

# Importing the vendor modules registers them (in this order: adapter_names() and detection follow it).
from controller.metrics.adapters import (  # noqa: F401
    amd,
    ascend,
    biren,
    cambricon,
    enflame,
    hygon,
    iluvatar,
    kunlunxin,
    metax,
    mthreads,
    nvidia,
)
from controller.metrics.adapters.base import GpuAdapter, adapter_names, get_adapter, register
from controller.metrics.adapters.model import DeviceMetrics, ParseResult, Workload
from controller.metrics.adapters.parse import AUTO, detect_vendors, parse_metrics
from controller.metrics.adapters.promtext import ParsedText, Sample, parse_text

__all__ = [
    "AUTO",
    "DeviceMetrics",
    "GpuAdapter",
    "ParseResult",
    "ParsedText",
    "Sample",
    "Workload",
    "adapter_names",
    "detect_vendors",
    "get_adapter",
    "parse_metrics",
    "parse_text",
    "register",
]
