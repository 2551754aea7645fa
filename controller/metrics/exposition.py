"""The agent's ``/metrics``: one ``prometheus_client`` registry per agent, written by the library.

Values that describe the latest reconcile pass are read from its frozen report when scraped
(a scrape never waits for the loop); latencies are library ``Histogram`` objects observed as
they happen. Spot adds its own collector (``controller.spot.counters.SpotCounters``).

    gpushare_devices_advertised{resource}     devices each plugin advertises now
    gpushare_devices_healthy{resource}        of which Healthy
    gpushare_plugin_registered{resource}      1 when kubelet accepted the registration
    gpushare_allocations{resource}            device IDs kubelet reports allocated (PodResources)
    gpushare_shadows{phase}                   shadow pods the agent sees
    gpushare_sharers{phase}                   sharer pods the agent sees
    gpushare_evictions_total{reason}          pods evicted since start
    gpushare_leader                           1 while this agent holds the Lease
    gpushare_reconcile_last_pass_timestamp_seconds, gpushare_reconcile_pass_seconds
    gpushare_nri_connected                    1 while the NRI plugin is registered with containerd
    gpushare_nri_handler_seconds{decision}    CreateContainer handler latency (histogram)

Only these series are written: the library's ``<name>_created`` companions are dropped.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Protocol

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

# The text format generate_latest writes.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
NRI_LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class PodPhase(Protocol):
    @property
    def phase(self) -> str: ...


class PassReport(Protocol):
    """What ``/metrics`` reads of the loop's latest pass (``controller.report.TickReport``)."""

    @property
    def at(self) -> float: ...
    @property
    def took_ms(self) -> float: ...
    @property
    def is_leader(self) -> bool: ...
    @property
    def advertised(self) -> Mapping[str, int]: ...
    @property
    def healthy(self) -> Mapping[str, int]: ...
    @property
    def registered(self) -> Mapping[str, bool]: ...
    @property
    def allocated(self) -> Mapping[str, int]: ...
    @property
    def shadows(self) -> Sequence[PodPhase]: ...
    @property
    def sharers(self) -> Sequence[PodPhase]: ...
    @property
    def evictions_total(self) -> Mapping[str, int]: ...


def _gauge(name: str, help_: str, label: str, values: Mapping[str, float]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, help_, labels=[label])
    for key, value in sorted(values.items()):
        family.add_metric([key], float(value))
    return family


class PassCollector:
    """The families computed at scrape time: the latest pass's report and the NRI connection."""

    def __init__(self, report: Callable[[], PassReport], nri_connected: Callable[[], bool | None]) -> None:
        self._report = report
        self._nri_connected = nri_connected

    def collect(self) -> Iterator[Metric]:
        report = self._report()
        yield _gauge(
            "gpushare_devices_advertised",
            "Devices each gpushare device plugin advertises to kubelet.",
            "resource",
            report.advertised,
        )
        yield _gauge("gpushare_devices_healthy", "Advertised devices that are Healthy.", "resource", report.healthy)
        yield _gauge(
            "gpushare_plugin_registered",
            "1 when kubelet accepted the plugin's registration.",
            "resource",
            {r: float(ok) for r, ok in report.registered.items()},
        )
        yield _gauge(
            "gpushare_allocations",
            "Device IDs kubelet reports allocated on this node (pod-resources), per resource.",
            "resource",
            report.allocated,
        )
        shadows = collections.Counter(s.phase for s in report.shadows)
        yield _gauge("gpushare_shadows", "Shadow pods seen by this agent, by phase.", "phase", shadows)
        sharers = collections.Counter(s.phase for s in report.sharers)
        yield _gauge("gpushare_sharers", "Sharer pods seen by this agent, by phase.", "phase", sharers)
        evictions = CounterMetricFamily(
            "gpushare_evictions_total", "Pods evicted by this agent since it started, by reason.", labels=["reason"]
        )
        for reason, n in sorted(report.evictions_total.items()):
            evictions.add_metric([reason], n)
        yield evictions
        yield from self._liveness(report)

    def _liveness(self, report: PassReport) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "gpushare_leader", "1 while this agent holds the gpushare-controller Lease.", value=float(report.is_leader)
        )
        yield GaugeMetricFamily(
            "gpushare_reconcile_last_pass_timestamp_seconds", "Wall-clock time of the last reconcile pass.", report.at
        )
        yield GaugeMetricFamily(
            "gpushare_reconcile_pass_seconds", "How long the last reconcile pass took.", report.took_ms / 1e3
        )
        connected = self._nri_connected()
        if connected is not None:  # no NRI plugin in this process: no series rather than a false 0
            yield GaugeMetricFamily(
                "gpushare_nri_connected", "1 while the NRI plugin is registered with containerd.", float(connected)
            )


class _WithoutCreated:
    """A collector's families minus the ``<name>_created`` samples the library adds to counters
    and histograms (per collector, so no process-wide library switch is flipped)."""

    def __init__(self, collector: Collector) -> None:
        self._collector = collector

    def collect(self) -> Iterator[Metric]:
        for family in self._collector.collect():
            kept = Metric(family.name, family.documentation, family.type, family.unit)
            kept.samples = [s for s in family.samples if s.name != family.name + "_created"]
            yield kept


class AgentMetrics:
    """The agent's registry: the pass's families, the NRI latency histogram, and any ``collectors``
    given (spot's); ``render()`` is the ``/metrics`` body."""

    def __init__(
        self,
        report: Callable[[], PassReport],
        *,
        nri_connected: Callable[[], bool | None] = lambda: None,
        collectors: Iterable[Collector] = (),
    ) -> None:
        self.registry = CollectorRegistry()
        self.nri_handler_seconds = Histogram(
            "gpushare_nri_handler_seconds",
            "CreateContainer handler latency, by decision (inject or refuse).",
            ["decision"],
            buckets=NRI_LATENCY_BUCKETS_S,
            registry=None,
        )
        own: list[Collector] = [PassCollector(report, nri_connected), self.nri_handler_seconds]
        for collector in (*own, *collectors):
            self.registry.register(_WithoutCreated(collector))

    def observe_nri_decision(self, decision: str, seconds: float) -> None:
        self.nri_handler_seconds.labels(decision).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def render_text(*collectors: Collector) -> str:
    """The exposition text of these collectors alone (a spot runtime's own series, tests)."""
    registry = CollectorRegistry()
    for collector in collectors:
        registry.register(_WithoutCreated(collector))
    return generate_latest(registry).decode()


__all__ = [
    "CONTENT_TYPE",
    "NRI_LATENCY_BUCKETS_S",
    "AgentMetrics",
    "PassCollector",
    "PassReport",
    "PodPhase",
    "render_text",
]
