"""Plain data the decision code works on: pods, containers, bundles and the runtime's indexed view.

Pure: no sockets, threads or clock. ``RuntimeView`` is immutable; every update returns a new one,
which ``BundleCache`` swaps in under its lock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from gpushare import keys


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


@dataclass(frozen=True)
class Bundle:
    """What a container was given: device nodes, visibility variables, CDI annotations."""

    devices: tuple[DeviceNode, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    annotations: tuple[tuple[str, str], ...] = ()

    def merged(self, other: Bundle) -> Bundle:
        """Union, first occurrence wins (by device path, env name, annotation key)."""
        devices = {d.path: d for d in self.devices}
        for d in other.devices:
            devices.setdefault(d.path, d)
        env = dict(self.env)
        for k, v in other.env:
            env.setdefault(k, v)
        ann = dict(self.annotations)
        for k, v in other.annotations:
            ann.setdefault(k, v)
        return Bundle(tuple(devices.values()), tuple(env.items()), tuple(ann.items()))

    @property
    def is_empty(self) -> bool:
        return not (self.devices or self.env or self.annotations)


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


def record_of(container: ContainerInfo, visibility_env: Iterable[str], *, recipient: bool = False) -> SourceRecord:
    """Extract a container's bundle: all its devices (filtered at decision time, so refusals can
    name what was skipped), its visibility variables and its CDI annotations."""
    wanted = set(visibility_env)
    env = tuple((k, v) for k, v in container.env if k in wanted)
    cdi = tuple(sorted((k, v) for k, v in container.annotations.items() if k.startswith(keys.CDI_ANNOTATION_PREFIX)))
    return SourceRecord(
        container_id=container.id,
        pod_id=container.pod_id,
        name=container.name,
        bundle=Bundle(container.devices, env, cdi),
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


def build_runtime_view(
    pods: Iterable[PodInfo], containers: Iterable[ContainerInfo], visibility_env: Iterable[str]
) -> RuntimeView:
    """A fresh view from a full listing (Synchronize), built in one pass."""
    vis = tuple(visibility_env)
    pod_map = {p.id: p for p in pods}
    records = {c.id: record_of(c, vis, recipient=is_recipient(c, pod_map.get(c.pod_id))) for c in containers}
    return RuntimeView(
        pods=pod_map,
        containers=records,
        _by_name={(r.pod_id, r.name): r.container_id for r in records.values()},
        _pod_by_ref={(p.namespace, p.name): p.id for p in pod_map.values()},
    )
