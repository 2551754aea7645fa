"""gpumetrics: every vendor's GPU exporter page read into one per-device model (design §10).

Each vendor's exporter text becomes the same ``DeviceMetrics``: bytes, watts, percent, pods;
unknown is None, never 0. One ``GpuAdapter`` per vendor, registered by name
(``adapter_names()``, ``get_adapter(name)``); ``parse_metrics(text)`` detects the vendor from
the metric names unless told. Our own lenient text-format parser (``parse_text``) skips and
counts a bad line instead of failing the scrape. ``scrape.Scraper`` reads a page over HTTP or
from a file; ``fake_exporter`` writes one for machines without GPUs. Each vendor's names,
units and quirks: docs/metrics.md.

The model, the parser and the adapters are decision code: stdlib and ``gpushare`` only, no
I/O, no clock. This part imports nothing of the agent; the agent reads its model.
"""

from gpumetrics.adapters import GpuAdapter, adapter_names, get_adapter, register
from gpumetrics.errors import MetricsError
from gpumetrics.model import DeviceMetrics, ParseResult, Workload
from gpumetrics.parse import AUTO, detect_vendors, parse_metrics
from gpumetrics.promtext import ParsedText, Sample, parse_text

__all__ = [
    "AUTO",
    "DeviceMetrics",
    "GpuAdapter",
    "MetricsError",
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
