"""gpumetrics errors.

    GpushareError
    └── MetricsError          a metrics source could not be read, or no adapter can read it

A bad line in an exporter's page is never an error: the parser skips and counts it, so one
odd sample cannot blind spot to a node's GPUs.
"""

from __future__ import annotations

from gpushare.errors import GpushareError


class MetricsError(GpushareError):
    """A metrics source could not be read (scrape failed, file missing) or its vendor is unknown."""
