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
    gpushare_pod_input_errors_total{field}    pods skipped since start: that field could not be read
    gpushare_leader                           1 while this agent holds the Lease
    gpushare_reconcile_last_pass_timestamp_seconds, gpushare_reconcile_pass_seconds
    gpushare_nri_connected                    1 while the NRI plugin is registered with containerd
    gpushare_nri_handler_seconds{decision}    CreateContainer handler latency (histogram)
    gpushare_nri_refusals_total{reason}       containers the NRI plugin refused, by reason (REFUSAL_REASONS)
    gpushare_gpu_user{node, namespace, pod, container, role, source, resource, vendor, device_id, <join>}
                                              1 per container and real GPU it holds or sees (attribution.py)
    gpushare_shadow_slots{node, shadow, resource, vendor, device_id, <join>}        N of each shadow here
    gpushare_shadow_slots_used{...}, gpushare_shadow_sharers{...}                 slots held; sharer containers

``<join>`` are the vendor exporter's own device labels (``attribution.JOIN_LABELS``), so a
recording rule can join our rows with the exporter's series (docs/observability.md).

Only these series are written: the library's ``<name>_created`` companions are dropped.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from controller.metrics.attribution import Attribution, join_label_names, join_values, vendor_of
from gpumetrics.model import DeviceMetrics
from gpushare.errors import REFUSAL_REASONS

# The text format generate_latest writes.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# gpushare_gpu_user's own labels; the vendor's join labels follow them.
USER_LABELS = ("node", "namespace", "pod", "container", "role", "source", "resource", "vendor", "device_id")
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
    @property
    def pod_input_errors_total(self) -> Mapping[str, int]: ...
    @property
    def attribution(self) -> Attribution: ...


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
        input_errors = CounterMetricFamily(
            "gpushare_pod_input_errors_total",
            "Pods skipped since start because a field of theirs could not be read, by field.",
            labels=["field"],
        )
        for field_name, n in sorted(report.pod_input_errors_total.items()):
            input_errors.add_metric([field_name], n)
        yield input_errors
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


class AttributionCollector:
    """``gpushare_gpu_user`` and the shadow slot families, labelled so they join the vendor exporter's series.

    ``devices`` is the agent's latest scrape of the exporter (empty without one): it names the
    vendor when the config says ``auto`` and gives each real ID the exporter's index label.
    """

    def __init__(
        self,
        report: Callable[[], PassReport],
        *,
        node: str,
        vendor: str = "auto",
        devices: Callable[[], Sequence[DeviceMetrics]] = lambda: (),
    ) -> None:
        self._report = report
        self._node = node
        self._vendor = vendor
        self._devices = devices

    def collect(self) -> Iterator[Metric]:
        found = self._report().attribution
        devices = tuple(self._devices())
        vendor = vendor_of(self._vendor, devices)
        join = join_label_names(vendor)
        user = GaugeMetricFamily(
            "gpushare_gpu_user",
            "1 for each container and real GPU it holds or sees on this node; role: owner, shadow, sharer, dind "
            "or borrower; source: the shadow, DinD source or lending owner.",
            labels=[*USER_LABELS, *join],
        )
        for u in found.users:
            row = [self._node, u.namespace, u.pod, u.container, u.role, u.source, u.resource, vendor, u.device_id]
            user.add_metric([*row, *join_values(vendor, u.device_id, devices)], 1.0)
        yield user
        names = ["node", "shadow", "resource", "vendor", "device_id", *join]
        slots = GaugeMetricFamily("gpushare_shadow_slots", "Slots (N) of each shadow holding a GPU here.", labels=names)
        used = GaugeMetricFamily("gpushare_shadow_slots_used", "Slots of each shadow its sharers hold.", labels=names)
        sharers = GaugeMetricFamily(
            "gpushare_shadow_sharers", "Sharer containers holding slots of each shadow.", labels=names
        )
        for s in found.shadows:
            labels = [self._node, s.shadow, s.resource, vendor, s.device_id, *join_values(vendor, s.device_id, devices)]
            slots.add_metric(labels, float(s.slots))
            used.add_metric(labels, float(s.used))
            sharers.add_metric(labels, float(s.sharers))
        yield from (slots, used, sharers)


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
        node: str = "",
        vendor: str = "auto",
        devices: Callable[[], Sequence[DeviceMetrics]] = lambda: (),
    ) -> None:
        self.registry = CollectorRegistry()
        self.nri_handler_seconds = Histogram(
            "gpushare_nri_handler_seconds",
            "CreateContainer handler latency, by decision (inject or refuse).",
            ["decision"],
            buckets=NRI_LATENCY_BUCKETS_S,
            registry=None,
        )
        # Both series from the start at 0: a first refusal is then an increase, as rate() and the alert see it.
        for decision in ("inject", "refuse"):
            self.nri_handler_seconds.labels(decision)
        self.nri_refusals = Counter(
            "gpushare_nri_refusals",
            "Containers the NRI plugin refused at CreateContainer, by reason.",
            ["reason"],
            registry=None,
        )
        for reason in REFUSAL_REASONS:  # every reason from the start at 0, for the same reason as above
            self.nri_refusals.labels(reason)
        own: list[Collector] = [
            PassCollector(report, nri_connected),
            AttributionCollector(report, node=node, vendor=vendor, devices=devices),
            self.nri_handler_seconds,
            self.nri_refusals,
        ]
        for collector in (*own, *collectors):
            self.registry.register(_WithoutCreated(collector))

    def observe_nri_decision(self, decision: str, seconds: float) -> None:
        self.nri_handler_seconds.labels(decision).observe(seconds)

    def count_nri_refusal(self, reason: str) -> None:
        self.nri_refusals.labels(reason).inc()

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
    "AttributionCollector",
    "PassCollector",
    "PassReport",
    "PodPhase",
    "render_text",
]
