"""Plain data the decision code works on: pods, containers, GPU parts (bundles) and the runtime's indexed view.

Pure: no sockets, threads or clock. ``RuntimeView`` is immutable; every update returns a new one,
which ``BundleCache`` swaps in under its lock.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TypeVar

from gpushare import keys
from gpushare.cdi import CdiRegistry, Hook, Mount, parse_annotation_value

_T = TypeVar("_T")


@dataclass(frozen=True)
class DeviceNode:
    """A Linux device node as the runtime sees it (NRI ``LinuxDevice``)."""

    path: str
    type: str
    major: int
    minor: int
    file_mode: int | None = None  # permission bits only
    uid: int | None = None
    gid: int | None = None


def _union(first: tuple[_T, ...], second: tuple[_T, ...], key: Callable[[_T], object]) -> tuple[_T, ...]:
    seen = {key(x): x for x in first}
    for x in second:
        seen.setdefault(key(x), x)
    return tuple(seen.values())


@dataclass(frozen=True)
class Bundle:
    """A container's GPU part: device nodes, visibility variables, CDI annotations, and the mounts,
    hooks and CDI device names its vendor stack gave it (``GpuPartRule`` says which those are)."""

    devices: tuple[DeviceNode, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    annotations: tuple[tuple[str, str], ...] = ()
    mounts: tuple[Mount, ...] = ()
    hooks: tuple[Hook, ...] = ()
    cdi_devices: tuple[str, ...] = ()

    def merged(self, other: Bundle) -> Bundle:
        """Union, first occurrence wins (by device path, env name, annotation key, mount
        destination, hook); hooks keep their order, which runc runs them in."""
        return Bundle(
            _union(self.devices, other.devices, lambda d: d.path),
            _union(self.env, other.env, lambda kv: kv[0]),
            _union(self.annotations, other.annotations, lambda kv: kv[0]),
            _union(self.mounts, other.mounts, lambda m: m.destination),
            _union(self.hooks, other.hooks, lambda h: h.key),
            _union(self.cdi_devices, other.cdi_devices, lambda n: n),
        )

    @property
    def is_empty(self) -> bool:
        return not (self.devices or self.env or self.annotations or self.mounts or self.hooks or self.cdi_devices)

    def cdi_names(self) -> tuple[str, ...]:
        """The CDI devices this part names: the CRI request's, then its ``cdi.k8s.io/`` annotations'."""
        named = list(self.cdi_devices)
        for _, value in self.annotations:
            named.extend(parse_annotation_value(value))
        return tuple(dict.fromkeys(named))


@dataclass(frozen=True)
class GpuPartRule:
    """Which of a container's variables, mounts and hooks are its GPU's, not its tenant's.

    Device nodes are all recorded (the decision filters them, so a refusal can name what it
    skipped). Variables: those named in ``visibility_env``, and any a CDI spec of the node sets to
    the same value. Mounts: the vendor's device lists (a mount under a ``device_list_dirs``
    directory, NVIDIA's ``volume-mounts`` strategy) and any mount a CDI spec makes, same source
    and destination. Hooks: any a CDI spec makes. A tenant's volume or variable is never a GPU's.
    """

    visibility_env: frozenset[str] = frozenset()
    device_list_dirs: tuple[str, ...] = ()
    cdi: CdiRegistry = field(default_factory=CdiRegistry)

    @classmethod
    def of(
        cls,
        visibility_env: Iterable[str],
        device_list_dirs: Iterable[str] = (),
        cdi_registry: CdiRegistry | None = None,
    ) -> GpuPartRule:
        return cls(frozenset(visibility_env), tuple(device_list_dirs), cdi_registry or CdiRegistry())

    @functools.cached_property
    def _cdi_env(self) -> frozenset[str]:
        return frozenset(self.cdi.all_edits.env)

    @functools.cached_property
    def _cdi_mounts(self) -> frozenset[tuple[str, str]]:
        return frozenset((m.destination, m.source) for m in self.cdi.all_edits.mounts)

    @functools.cached_property
    def _cdi_hooks(self) -> frozenset[tuple[str, str, tuple[str, ...]]]:
        return frozenset(h.key for h in self.cdi.all_edits.hooks)

    def is_gpu_env(self, name: str, value: str) -> bool:
        return name in self.visibility_env or f"{name}={value}" in self._cdi_env

    def is_device_list(self, mount: Mount) -> bool:
        return any(mount.destination.startswith(d.rstrip("/") + "/") for d in self.device_list_dirs)

    def is_gpu_mount(self, mount: Mount) -> bool:
        return self.is_device_list(mount) or (mount.destination, mount.source) in self._cdi_mounts

    def is_gpu_hook(self, hook: Hook) -> bool:
        return hook.key in self._cdi_hooks

    def part_of(self, container: ContainerInfo) -> Bundle:
        return Bundle(
            devices=container.devices,
            env=tuple((k, v) for k, v in container.env if self.is_gpu_env(k, v)),
            annotations=tuple(
                sorted((k, v) for k, v in container.annotations.items() if k.startswith(keys.CDI_ANNOTATION_PREFIX))
            ),
            mounts=tuple(m for m in container.mounts if self.is_gpu_mount(m)),
            hooks=tuple(h for h in container.hooks if self.is_gpu_hook(h)),
            cdi_devices=container.cdi_devices,
        )


@dataclass(frozen=True)
class PodInfo:
    id: str
    name: str
    namespace: str
    uid: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class ContainerInfo:
    id: str
    pod_id: str
    name: str
    annotations: Mapping[str, str] = field(default_factory=dict)
    env: tuple[tuple[str, str], ...] = ()
    devices: tuple[DeviceNode, ...] = ()
    mounts: tuple[Mount, ...] = ()
    hooks: tuple[Hook, ...] = ()
    cdi_devices: tuple[str, ...] = ()


@dataclass(frozen=True)
class SourceRecord:
    """A container as a possible source: its bundle, and whether we gave it (part of) that bundle.

    Which real device IDs a container holds is never read from here (its environment is the
    tenant's to write): kubelet says who holds them (``nri_plugin.oracle.HolderOracle``).
    """

    container_id: str
    pod_id: str
    name: str
    bundle: Bundle
    # Given (part of) its bundle by us: a sharer, spot borrower or DinD target. It can still be a
    # same-pod source, but never the *holder* of real IDs: kubelet allocated them to someone else.
    is_recipient: bool = False


def parse_env(entries: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """``["K=V", ...]`` → ``(("K", "V"), ...)``; entries without ``=`` are ignored."""
    out = []
    for entry in entries:
        name, sep, value = entry.partition("=")
        if sep:
            out.append((name, value))
    return tuple(out)


def is_recipient(container: ContainerInfo, pod: PodInfo | None) -> bool:
    """Whether a container carries one of our instructions, so its devices came from another container.

    Needed when the plugin learns containers from Synchronize after a restart: their env already
    holds what we injected, and only the instruction tells a borrower from the owner.
    """
    if keys.ANNOTATION_DEVICES_FROM in container.annotations or keys.ANNOTATION_DEVICES_IDS in container.annotations:
        return True
    return pod is not None and keys.POD_ANNOTATION_DEVICES_FROM_PREFIX + container.name in pod.annotations


def record_of(container: ContainerInfo, rule: GpuPartRule, *, recipient: bool = False) -> SourceRecord:
    """A container as a possible source: its GPU part by ``rule``, nothing of its tenant's."""
    return SourceRecord(
        container_id=container.id,
        pod_id=container.pod_id,
        name=container.name,
        bundle=rule.part_of(container),
        is_recipient=recipient,
    )


@dataclass(frozen=True)
class RuntimeView:
    """The runtime's pods and containers on this node as the plugin knows them (Synchronize plus
    every event since), indexed for the decision code."""

    pods: Mapping[str, PodInfo] = field(default_factory=dict)
    containers: Mapping[str, SourceRecord] = field(default_factory=dict)
    _by_name: Mapping[tuple[str, str], str] = field(default_factory=dict)
    _pod_by_ref: Mapping[tuple[str, str], str] = field(default_factory=dict)

    # --- queries ---
    def pod_by_ref(self, namespace: str, name: str) -> PodInfo | None:
        pod_id = self._pod_by_ref.get((namespace, name))
        return self.pods.get(pod_id) if pod_id is not None else None

    def container_named(self, pod_id: str, name: str) -> SourceRecord | None:
        cid = self._by_name.get((pod_id, name))
        return self.containers.get(cid) if cid is not None else None

    def container_of(self, namespace: str, pod: str, name: str) -> SourceRecord | None:
        """The latest container ``name`` of pod ``namespace/pod`` (what kubelet's rows name)."""
        found = self.pod_by_ref(namespace, pod)
        return self.container_named(found.id, name) if found is not None else None

    # --- updates (each returns a new view) ---
    def with_pod(self, pod: PodInfo) -> RuntimeView:
        if self.pods.get(pod.id) == pod:
            return self
        pods = {**self.pods, pod.id: pod}
        refs = {k: v for k, v in self._pod_by_ref.items() if v != pod.id}
        refs[(pod.namespace, pod.name)] = pod.id
        return replace(self, pods=pods, _pod_by_ref=refs)

    def with_container(self, record: SourceRecord) -> RuntimeView:
        containers = {**self.containers, record.container_id: record}
        by_name = {**self._by_name, (record.pod_id, record.name): record.container_id}
        return replace(self, containers=containers, _by_name=by_name)

    def without_container(self, container_id: str) -> RuntimeView:
        record = self.containers.get(container_id)
        if record is None:
            return self
        containers = {k: v for k, v in self.containers.items() if k != container_id}
        # A restarted container (same name, new id) keeps the name slot: only drop our own entries.
        by_name = {k: v for k, v in self._by_name.items() if v != container_id}
        return replace(self, containers=containers, _by_name=by_name)

    def without_pod(self, pod_id: str) -> RuntimeView:
        view = self
        for cid in [c.container_id for c in self.containers.values() if c.pod_id == pod_id]:
            view = view.without_container(cid)
        if pod_id not in view.pods:
            return view
        pods = {k: v for k, v in view.pods.items() if k != pod_id}
        refs = {k: v for k, v in view._pod_by_ref.items() if v != pod_id}
        return replace(view, pods=pods, _pod_by_ref=refs)


def build_runtime_view(pods: Iterable[PodInfo], containers: Iterable[ContainerInfo], rule: GpuPartRule) -> RuntimeView:
    """A fresh view from a full listing (Synchronize), built in one pass."""
    pod_map = {p.id: p for p in pods}
    records = {c.id: record_of(c, rule, recipient=is_recipient(c, pod_map.get(c.pod_id))) for c in containers}
    return RuntimeView(
        pods=pod_map,
        containers=records,
        _by_name={(r.pod_id, r.name): r.container_id for r in records.values()},
        _pod_by_ref={(p.namespace, p.name): p.id for p in pod_map.values()},
    )
