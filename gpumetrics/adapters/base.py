"""The adapter interface, the registry, and the table-driven adapter most vendors are.

A vendor adapter is a ``GpuAdapter``: it says whether a scrape looks like its exporter
(``claims``) and turns the parsed samples into ``DeviceMetrics`` (``devices``). Most
exporters differ only in names, labels and units, so ``TableAdapter`` does the work from
class-level tables (metric -> field and scale; label names for identity) and a vendor
overrides a hook or two for its quirks (NVIDIA's memory total, AMD partitions, ...).

Decision code: stdlib and ``gpushare``/``controller.errors`` only, no I/O, no clock.
"""

from __future__ import annotations

import dataclasses
import math
from abc import ABC, abstractmethod
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, NamedTuple, TypeVar

from gpumetrics.errors import MetricsError
from gpumetrics.model import DeviceMetrics, Workload
from gpumetrics.promtext import Sample

__all__ = [
    "KIB",
    "MEM_FREE",
    "MEM_RESERVED",
    "MEM_TOTAL",
    "MEM_USED",
    "MIB",
    "POWER",
    "UTIL",
    "WORKLOAD",
    "AdapterOutput",
    "Draft",
    "GpuAdapter",
    "Rule",
    "TableAdapter",
    "adapter_class",
    "adapter_names",
    "get_adapter",
    "register",
    "unread_when_total_unknown",
]

KIB = 1024
MIB = 1024 * 1024

# Fields a metric can feed. WORKLOAD is an info metric (value 1) that only attributes pods.
UTIL = "utilization_pct"
MEM_USED = "memory_used_bytes"
MEM_TOTAL = "memory_total_bytes"
MEM_FREE = "memory_free_bytes"
MEM_RESERVED = "memory_reserved_bytes"
POWER = "power_watts"
WORKLOAD = "workload"

# Label spellings for (namespace, pod, container), most trusted first (docs/metrics.md, "The model").
# ``exported_*`` come first: they are the exporter's own labels after a Prometheus round
# trip, and when they exist the plain ones are the *target's* labels (the exporter pod).
EXPORTED_WORKLOAD_LABELS = ("exported_namespace", "exported_pod", "exported_container")
DEFAULT_WORKLOAD_LABELS: tuple[tuple[str, str, str], ...] = (
    ("dcu_pod_namespace", "dcu_pod_name", "container"),  # Hygon
    ("namespace", "pod", "container"),  # dcgm-exporter, AMD, Iluvatar, Cambricon mlu_container
    ("pod_namespace", "pod_name", "container_name"),  # dcgm --use-old-namespace, Enflame
    ("namespace", "pod_name", "container_name"),  # Ascend
)
DEFAULT_NODE_LABELS = ("hostname", "Hostname", "host", "node", "node_name")


@dataclass(frozen=True, slots=True)
class Rule:
    """How one metric feeds one field: ``value * scale``; the lowest ``rank`` with a valid value wins."""

    field: str
    scale: float = 1.0
    rank: int = 0


class AdapterOutput(NamedTuple):
    devices: list[DeviceMetrics]
    # Samples of a known family whose labels name no device (no uuid, serial or index).
    unattributed_samples: int


class Draft:
    """A device being assembled from its samples (mutable, private to one ``devices`` call)."""

    __slots__ = ("device_id", "labels", "sub_device", "timestamp_ms", "values", "workloads")

    def __init__(self, device_id: str, labels: Mapping[str, str], sub_device: str | None) -> None:
        self.device_id = device_id
        self.labels = labels
        self.sub_device = sub_device
        self.values: dict[str, dict[int, float]] = {}
        self.workloads: dict[Workload, None] = {}
        self.timestamp_ms: int | None = None

    def offer(self, field: str, rank: int, value: float) -> None:
        # First valid value per (field, rank) wins: time-sliced pods repeat identical series.
        self.values.setdefault(field, {}).setdefault(rank, value)

    def get(self, field: str) -> float | None:
        ranks = self.values.get(field)
        return ranks[min(ranks)] if ranks else None

    def ranked(self, field: str) -> list[float]:
        ranks = self.values.get(field, {})
        return [ranks[r] for r in sorted(ranks)]


class GpuAdapter(ABC):
    """One vendor exporter. Instances are cheap and per parse; ``get_adapter`` makes them."""

    name: ClassVar[str]
    # Where the numbers come from, for docs and `gpushare metrics vendors`.
    exporter: ClassVar[str]
    # False for a vendor we know of but whose exporter nobody has seen (Biren).
    has_exporter: ClassVar[bool] = True
    # Whether the exporter lets an operator choose a metric-name prefix.
    prefixable: ClassVar[bool] = False
    # Said with every result of this adapter (Biren: why nothing can be read).
    warning: ClassVar[str | None] = None

    def __init__(self, prefix: str | None = None) -> None:
        if prefix is not None and not self.prefixable:
            raise MetricsError(
                f"gpushare: vendor {self.name!r} has no configurable metric prefix; drop the prefix option"
            )
        # None: auto (or the vendor's default); "" or "x_": forced.
        self.prefix = _normal_prefix(prefix)

    @abstractmethod
    def claims(self, metric_names: Collection[str]) -> bool:
        """Whether these family names look like this vendor's exporter."""

    @abstractmethod
    def devices(self, samples: Sequence[Sample]) -> AdapterOutput:
        """Turn one scrape's samples into devices. Never raises on odd values."""


def _normal_prefix(prefix: str | None) -> str | None:
    if prefix is None or prefix == "" or prefix.endswith("_"):
        return prefix
    return prefix + "_"  # Cambricon's --metrics-prefix=mlu makes "mlu_utilization"


_REGISTRY: dict[str, type[GpuAdapter]] = {}


_A = TypeVar("_A", bound=type[GpuAdapter])


def register(cls: _A) -> _A:
    """Class decorator: make ``cls`` available by its ``name`` (registration order = detection order)."""
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise MetricsError(f"gpushare: two metrics adapters are named {cls.name!r}")
    _REGISTRY[cls.name] = cls
    return cls


def adapter_names() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def adapter_class(name: str) -> type[GpuAdapter]:
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(_REGISTRY)
        raise MetricsError(f"gpushare: unknown GPU vendor {name!r}; known vendors: {known} (or 'auto')") from None


def get_adapter(name: str, prefix: str | None = None) -> GpuAdapter:
    """A fresh adapter for vendor ``name``; ``MetricsError`` names the known vendors if it is unknown."""
    return adapter_class(name)(prefix=prefix)


def _strip_prefix(name: str, prefix: str) -> str | None:
    if not prefix:
        return name
    return name[len(prefix) :] if name.startswith(prefix) else None


def _first(labels: Mapping[str, str], names: Sequence[str]) -> str | None:
    for name in names:
        value = labels.get(name)
        if value:
            return value
    return None


def _index(labels: Mapping[str, str], names: Sequence[str]) -> int | None:
    for name in names:
        value = labels.get(name)
        if value and value.isascii() and value.isdigit():
            return int(value)
    return None


def workload_from(labels: Mapping[str, str], spellings: Sequence[tuple[str, str, str]]) -> Workload | None:
    """The pod a series is attributed to, or None. A pod without a namespace is not a workload."""
    if EXPORTED_WORKLOAD_LABELS[1] in labels:
        spellings = (EXPORTED_WORKLOAD_LABELS,)
    for ns_label, pod_label, container_label in spellings:
        pod = labels.get(pod_label)
        namespace = labels.get(ns_label)
        if pod and namespace:
            return Workload(namespace, pod, labels.get(container_label) or None)
    return None


def is_valid_raw(value: float) -> bool:
    """NaN, infinities and negatives (the vendors' "unsupported" -1) are never a reading."""
    return math.isfinite(value) and value >= 0


class TableAdapter(GpuAdapter):
    """An adapter described by tables; override the hooks below for a vendor's quirks."""

    # Metric name (after the prefix) -> rule.
    rules: ClassVar[Mapping[str, Rule]]
    # The family names that identify the exporter; defaults to every rule's name.
    signature: ClassVar[frozenset[str] | None] = None
    # The prefix used when none is given (Cambricon's official manifests use "mlu").
    default_prefix: ClassVar[str] = ""
    uuid_labels: ClassVar[tuple[str, ...]] = ("uuid", "UUID")
    serial_labels: ClassVar[tuple[str, ...]] = ()
    index_labels: ClassVar[tuple[str, ...]] = ()
    model_labels: ClassVar[tuple[str, ...]] = ()
    pci_labels: ClassVar[tuple[str, ...]] = ()
    node_labels: ClassVar[tuple[str, ...]] = DEFAULT_NODE_LABELS
    workload_labels: ClassVar[tuple[tuple[str, str, str], ...]] = DEFAULT_WORKLOAD_LABELS
    # Fields whose 0 is the exporter's failed read, never a reading (Hygon, Iluvatar: docs/metrics.md).
    zero_is_unread: ClassVar[frozenset[str]] = frozenset()

    # ---- hooks -------------------------------------------------------------------------------

    def metric_key(self, name: str, prefix: str) -> str | None:
        """The rule name for a metric family, or None if it is not one of ours."""
        key = _strip_prefix(name, prefix)
        return key if key in self.rules else None

    def resolve_prefix(self, metric_names: Collection[str]) -> str:
        return self.default_prefix if self.prefix is None else self.prefix

    def sub_device(self, labels: Mapping[str, str]) -> str | None:
        """The instance name (MIG, partition, VF, vDCU) of a series, None for a whole device."""
        return None

    def accepts(self, key: str, labels: Mapping[str, str]) -> bool:
        """Whether this series of family ``key`` feeds its rule (MetaX memory: only type="vram")."""
        return True

    def is_sentinel(self, raw: float) -> bool:
        """A vendor's "no reading" value, beyond NaN/Inf/negatives which every vendor shares."""
        return False

    def finish(self, draft: Draft) -> DeviceMetrics:
        """Build the device from its draft; vendors adjust the result of ``build`` (``dataclasses.replace``)."""
        return self.build(draft)

    # ---- machinery ---------------------------------------------------------------------------

    def claims(self, metric_names: Collection[str]) -> bool:
        prefix = self.resolve_prefix(metric_names)
        signature = self.signature if self.signature is not None else frozenset(self.rules)
        return any(_strip_prefix(name, prefix) in signature for name in metric_names)

    def device_id(self, labels: Mapping[str, str]) -> tuple[str, str | None] | None:
        """``(device_id, sub_device)`` for a series, None when its labels name no device."""
        base = _first(labels, self.uuid_labels) or self._serial(labels)
        if base is None:
            index = _index(labels, self.index_labels)
            if index is None:
                return None
            base = f"{_first(labels, self.node_labels) or self.name}:{index}"
        sub = self.sub_device(labels)
        return (f"{base}:{sub}" if sub else base), sub

    def _serial(self, labels: Mapping[str, str]) -> str | None:
        # Iluvatar serials can be all zeros and repeat across cards: not an identity.
        serial = _first(labels, self.serial_labels)
        return serial if serial and serial.strip("0") else None

    def clean(self, rule: Rule, raw: float) -> float | None:
        """The normalised value, or None when the raw reading means "unknown"."""
        if not is_valid_raw(raw) or self.is_sentinel(raw) or (raw == 0 and rule.field in self.zero_is_unread):
            return None
        value = raw * rule.scale
        if rule.field == UTIL and value > 100.0:
            return None
        return value

    def devices(self, samples: Sequence[Sample]) -> AdapterOutput:
        prefix = self.resolve_prefix({s.name for s in samples})
        keys: dict[str, str | None] = {}
        drafts: dict[str, Draft] = {}
        # Label mappings are shared between samples by the parser: resolve each one once.
        identities: dict[int, tuple[str, str | None] | None] = {}
        workloads: dict[int, Workload | None] = {}
        unattributed = 0
        for sample in samples:
            name = sample.name
            if name not in keys:
                keys[name] = self.metric_key(name, prefix)
            key = keys[name]
            if key is None:
                continue
            labels = sample.labels
            if not self.accepts(key, labels):
                continue
            label_id = id(labels)
            if label_id not in identities:
                identities[label_id] = self.device_id(labels)
                workloads[label_id] = workload_from(labels, self.workload_labels)
            identity = identities[label_id]
            if identity is None:
                unattributed += 1
                continue
            device_id, sub = identity
            draft = drafts.get(device_id)
            if draft is None:
                draft = drafts[device_id] = Draft(device_id, labels, sub)
            rule = self.rules[key]
            workload = workloads[label_id]
            if rule.field == WORKLOAD:
                # An info metric: value 1 means "this container holds the device".
                if workload is not None and sample.value != 0:
                    draft.workloads[workload] = None
                continue
            if workload is not None:
                draft.workloads[workload] = None
            if sample.timestamp_ms is not None and (
                draft.timestamp_ms is None or sample.timestamp_ms > draft.timestamp_ms
            ):
                draft.timestamp_ms = sample.timestamp_ms
            value = self.clean(rule, sample.value)
            if value is not None:
                draft.offer(rule.field, rule.rank, value)
        built = [self.finish(d) for d in drafts.values()]
        built.sort(key=_device_order)
        return AdapterOutput(built, unattributed)

    def pick(self, draft: Draft, field: str) -> float | None:
        """The value of ``field``: the valid reading of the lowest rank (AMD overrides power)."""
        return draft.get(field)

    def build(self, draft: Draft) -> DeviceMetrics:
        """The generic device. Memory total falls back to used + free (+ reserved)."""
        labels = draft.labels
        used = self.pick(draft, MEM_USED)
        total = self.pick(draft, MEM_TOTAL)
        free = self.pick(draft, MEM_FREE)
        if total is None and used is not None and free is not None:
            total = used + free + (self.pick(draft, MEM_RESERVED) or 0.0)
        return DeviceMetrics(
            vendor=self.name,
            device_id=draft.device_id,
            index=_index(labels, self.index_labels),
            uuid=_first(labels, self.uuid_labels) or self._serial(labels),
            node=_first(labels, self.node_labels),
            model=_first(labels, self.model_labels),
            pci_bus_id=_first(labels, self.pci_labels),
            sub_device=draft.sub_device,
            workloads=tuple(draft.workloads),
            utilization_pct=_round(self.pick(draft, UTIL)),
            memory_used_bytes=_bytes(used),
            memory_total_bytes=_bytes(total),
            power_watts=_round(self.pick(draft, POWER)),
            timestamp_ms=draft.timestamp_ms,
        )


def unread_when_total_unknown(device: DeviceMetrics) -> DeviceMetrics:
    """For exporters that write 0 when a driver call fails: with the memory total unknown (its 0
    is a failed read), a 0 utilization or used memory is more likely the same failure than a
    reading, and unknown never counts as idle."""
    if device.memory_total_bytes is not None:
        return device
    return dataclasses.replace(
        device,
        utilization_pct=None if device.utilization_pct == 0 else device.utilization_pct,
        memory_used_bytes=None if device.memory_used_bytes == 0 else device.memory_used_bytes,
    )


def _round(value: float | None) -> float | None:
    # Scaling (ratio x 100, mW / 1000) leaves float noise such as 31.500000000000004.
    return None if value is None else round(value, 6)


def _bytes(value: float | None) -> int | None:
    return None if value is None else round(value)


def _device_order(device: DeviceMetrics) -> tuple[bool, int, str, str]:
    return (device.index is None, device.index or 0, device.sub_device or "", device.device_id)
