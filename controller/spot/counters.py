"""What spot adds to the agent's ``/metrics``, as a ``prometheus_client`` collector.

    gpushare_spot_kills_total{reason}               borrower pods whose tasks the agent killed
    gpushare_spot_kill_errors_total{reason}         kills that did not do their job (no_tasks, no_cgroup, ...)
    gpushare_spot_kill_bound_exceeded_total         kills whose tasks outlived the bound (owner released anyway)
    gpushare_spot_return_seconds                    owner's return signal -> every task of its borrowers dead
    gpushare_spot_release_seconds                   owner's kernel notice -> its held ioctl released
    gpushare_spot_lending_blocked{reason}           1 while spot lends nothing because pod cgroups are not found
    gpushare_spot_kmod_available                    1 while the agent is gpukmod's registered listener

The agent registers a ``SpotCounters`` in its registry (``controller.metrics.exposition.AgentMetrics``,
``collectors=``); ``controller.metrics.exposition.render_text(counters)`` writes these series alone.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator

from prometheus_client import Histogram
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

RETURN_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 3.0)


def _counter(name: str, help_: str, label: str, values: Counter[str]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, help_, labels=[label])
    # A copy first: the runtime may count while a scrape reads.
    for key, n in sorted(dict(values).items()):
        family.add_metric([key], n)
    return family


class SpotCounters:
    """Counted by the spot runtime under its own lock; ``kmod_available`` and ``lending_blocked`` are
    asked at scrape time."""

    def __init__(
        self,
        kmod_available: Callable[[], bool] = lambda: False,
        lending_blocked: Callable[[], str] = lambda: "",
    ) -> None:
        self.kills: Counter[str] = Counter()  # reason -> borrower pods killed
        self.kill_errors: Counter[str] = Counter()  # error label -> kills
        self.bound_exceeded = 0
        self.kmod_available = kmod_available
        self.lending_blocked = lending_blocked
        self._return_seconds = Histogram(
            "gpushare_spot_return_seconds",
            "From an owner's return signal to every task of its borrower pods dead.",
            buckets=RETURN_BUCKETS_S,
            registry=None,
        )
        self._release_seconds = Histogram(
            "gpushare_spot_release_seconds",
            "From an owner's kernel notice to its held GPU call released.",
            buckets=RETURN_BUCKETS_S,
            registry=None,
        )

    def observe_return(self, seconds: float) -> None:
        self._return_seconds.observe(seconds)

    def observe_release(self, seconds: float) -> None:
        self._release_seconds.observe(seconds)

    @property
    def total(self) -> int:
        """Owner returns observed (one per return whose borrowers were all seen dead)."""
        for family in self._return_seconds.collect():
            for sample in family.samples:
                if sample.name == family.name + "_count":
                    return int(sample.value)
        return 0

    def collect(self) -> Iterator[Metric]:
        yield _counter(
            "gpushare_spot_kills_total", "Borrower pods whose tasks the agent killed, by reason.", "reason", self.kills
        )
        yield _counter(
            "gpushare_spot_kill_errors_total",
            "Kills that did not do their job, by error: no_tasks (nothing signalled while kubelet reports the "
            "containers running), no_cgroup, no_cgroups, failed.",
            "reason",
            self.kill_errors,
        )
        yield CounterMetricFamily(
            "gpushare_spot_kill_bound_exceeded_total",
            "Kills whose tasks were still alive at the kill bound; the owner was released anyway.",
            value=self.bound_exceeded,
        )
        yield from self._return_seconds.collect()
        yield from self._release_seconds.collect()
        blocked = self.lending_blocked()
        family = GaugeMetricFamily(
            "gpushare_spot_lending_blocked",
            "1 while spot lends nothing on this node because pod cgroups cannot be found; reason says why.",
            labels=["reason"],
        )
        family.add_metric([blocked], 1.0 if blocked else 0.0)
        yield family
        yield GaugeMetricFamily(
            "gpushare_spot_kmod_available",
            "1 while the agent is gpukmod's registered listener.",
            float(self.kmod_available()),
        )


__all__ = ["RETURN_BUCKETS_S", "SpotCounters"]
