"""``BundleCache``: the node's pods and containers as an immutable ``RuntimeView``, swapped under a lock.

Learned from Synchronize (full replace) and every CreateContainer; forgotten on RemoveContainer
and RemovePodSandbox. Readers take the current view without locking (an attribute read is
atomic) and never see a half-applied update; writers hold the lock only to swap. Each container
is recorded as its GPU part only (``GpuPartRule``), so the cache never holds a tenant's
variables or volumes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from nri_plugin.model import (
    ContainerInfo,
    GpuPartRule,
    PodInfo,
    RuntimeView,
    SourceRecord,
    build_runtime_view,
    record_of,
)


class BundleCache:
    def __init__(self, rule: Callable[[], GpuPartRule]) -> None:
        self._rule = rule
        self._lock = threading.Lock()
        self._view = RuntimeView()

    @property
    def view(self) -> RuntimeView:
        return self._view

    def record(self, container: ContainerInfo, *, recipient: bool = False) -> SourceRecord:
        return record_of(container, self._rule(), recipient=recipient)

    def replace_all(self, pods: Iterable[PodInfo], containers: Iterable[ContainerInfo]) -> None:
        view = build_runtime_view(pods, containers, self._rule())
        with self._lock:
            self._view = view

    def add(self, pod: PodInfo, container: ContainerInfo | None = None, *, recipient: bool = False) -> None:
        record = self.record(container, recipient=recipient) if container is not None else None
        with self._lock:
            view = self._view.with_pod(pod)
            self._view = view.with_container(record) if record is not None else view

    def remove_container(self, container_id: str) -> None:
        with self._lock:
            self._view = self._view.without_container(container_id)

    def remove_pod(self, pod_id: str) -> None:
        with self._lock:
            self._view = self._view.without_pod(pod_id)
