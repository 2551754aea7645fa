"""What spot adds to the agent's ``/metrics``, as a ``prometheus_client`` collector.

    gpushare_spot_kills_total{reason}   borrower pods whose processes the agent killed
    gpushare_spot_return_seconds        owner's return signal -> every process of a borrower pod dead
    gpushare_spot_kmod_available        1 while the agent is gpukmod's registered listener

The agent registers a ``SpotCounters`` in its registry (``controller.metrics.exposition.AgentMetrics``,
``collectors=``); ``controller.metrics.exposition.render_text(counters)`` writes these series alone.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator

from prometheus_client import Histogram
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

RETURN_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 3.0)


class SpotCounters:
    """``kills`` is counted by the spot runtime under its own lock; ``kmod_available`` is asked at scrape time."""

    def __init__(self, kmod_available: Callable[[], bool] = lambda: False) -> None:
        self.kills: Counter[str] = Counter()  # reason -> borrower pods killed
        self.kmod_available = kmod_available
        self._return_seconds = Histogram(
            "gpushare_spot_return_seconds",
            "From an owner's return signal to every process of a borrower pod dead.",
            buckets=RETURN_BUCKETS_S,
            registry=None,
        )

    def observe_return(self, seconds: float) -> None:
        self._return_seconds.observe(seconds)

    @property
    def total(self) -> int:
        """Owner returns observed (one per borrower pod seen dead after a return signal)."""
        for family in self._return_seconds.collect():
            for sample in family.samples:
                if sample.name == family.name + "_count":
                    return int(sample.value)
        return 0

    def collect(self) -> Iterator[Metric]:
        kills = CounterMetricFamily(
            "gpushare_spot_kills_total", "Borrower pods whose processes the agent killed, by reason.", labels=["reason"]
        )
        # A copy first: the runtime may count a kill while a scrape reads.
        for reason, n in sorted(dict(self.kills).items()):
            kills.add_metric([reason], n)
        yield kills
        yield from self._return_seconds.collect()
        yield GaugeMetricFamily(
            "gpushare_spot_kmod_available",
            "1 while the agent is gpukmod's registered listener.",
            float(self.kmod_available()),
        )


__all__ = ["RETURN_BUCKETS_S", "SpotCounters"]
