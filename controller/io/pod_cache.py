"""A list+watch cache of pods with a periodic full resync: a watch can go silent without an error.

``PodCache`` lists in full at start, after a 410 and every ``resync_s``, and watches in
between, keeping of each pod only what the agent reads (``controller.core.pod_trim``);
``view()`` hands one reconcile pass the pods, whether a full LIST refreshed them since the
last pass and which pods a watch saw deleted (what ``Snapshot`` needs to trust the *absence*
of a shadow).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from controller.core.pod_facts import PodRef
from controller.core.pod_trim import trim_pod
from controller.io.kube_client import KubeClient, WatchEvent
from controller.io.list_watch import ListWatchLoop
from gpushare.log import kv

log = logging.getLogger(__name__)

# How long a pod put in by ``assume`` stands in without a watch event for it: a watch delivers
# a new pod within a second or two; one that missed it is taken back and the next LIST decides.
ASSUME_S = 30.0


@dataclass(frozen=True)
class CacheView:
    """What one reconcile pass gets from a ``PodCache``."""

    pods: tuple[Mapping[str, Any], ...]
    is_fresh: bool  # a full LIST replaced the cache since the previous view
    deleted: frozenset[PodRef]  # seen DELETED on the watch since the last full LIST
    is_synced: bool  # at least one LIST succeeded


def _ref(obj: Mapping[str, Any]) -> PodRef:
    # Never raises: an odd object is kept for the pass, which skips and reports it, rather than
    # ending the watch thread and leaving the agent blind.
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    if not isinstance(meta, Mapping):
        meta = {}
    return PodRef(str(meta.get("namespace", "")), str(meta.get("name", "")), str(meta.get("uid", "")))


class PodCache(ListWatchLoop):
    """Pods matching a selector: a full LIST at start, on 410 and every ``resync_s``; watches in between.

    ``run(stop)`` is the body of one named thread (``gpushare-controller-watch-<name>``, started
    by the loop); ``view()`` is called by the reconcile thread. Events are hints
    (``on_change``); the reconcile pass recomputes from the view.
    """

    what = "pod"

    def __init__(
        self,
        client: KubeClient,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        resync_s: float = 300.0,
        on_change: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._selectors = {"namespace": namespace, "label_selector": label_selector, "field_selector": field_selector}
        self.resync_s = resync_s
        self._on_change = on_change or (lambda: None)
        self._clock = clock
        self._lock = threading.Lock()
        self._pods: dict[str, Mapping[str, Any]] = {}
        self._deleted: set[PodRef] = set()
        self._fresh = False
        self._synced = False
        self._resource_version = ""
        self._listed_at = float("-inf")
        self._assumed: dict[str, float] = {}  # pod key -> when ``assume`` put it in, until the watch confirms

    def relist(self) -> None:
        items, rv = self._client.list_pods(**self._selectors, each=trim_pod)
        with self._lock:
            self._pods = {_ref(p).key: p for p in items}
            self._deleted.clear()
            self._assumed.clear()
            self._fresh = True
            self._synced = True
            self._resource_version = rv
            self._listed_at = self._clock()
        log.debug("pod list", extra=kv(pods=len(items), resource_version=rv))
        self._on_change()

    def apply(self, event: WatchEvent) -> None:
        meta = event.obj.get("metadata") if isinstance(event.obj, Mapping) else None
        rv = str(meta.get("resourceVersion", "")) if isinstance(meta, Mapping) else ""
        with self._lock:
            if rv:
                self._resource_version = rv
            if event.type == "BOOKMARK":
                return
            ref = _ref(event.obj)
            self._assumed.pop(ref.key, None)
            if event.type == "DELETED":
                self._pods.pop(ref.key, None)
                self._deleted.add(ref)
            else:
                self._pods[ref.key] = trim_pod(event.obj)
        self._on_change()

    def watch_once(self, stop: threading.Event, timeout_s: int | None = None) -> None:
        """One watch from the last resource version; returns when it ends (or ``stop`` is set)."""
        with self._lock:
            rv = self._resource_version
        for event in self._client.watch_pods(rv, timeout_s=timeout_s, **self._selectors):
            self.apply(event)
            if stop.is_set():
                return

    def assume(self, pod: Mapping[str, Any]) -> None:
        """A pod this agent has just created, as the API server stored it, before the watch reports it.

        The pass after a create would otherwise read a cache that lags its own writes, find the
        pod missing and create it again (an AlreadyExists per pod, per pass, in a burst). As the
        scheduler's assumed pods, it stands in until the watch or a LIST speaks for it, and is
        dropped unconfirmed after ``ASSUME_S``. Ignored when the cache already holds the pod or
        saw it deleted: the watch is ahead of the create's answer.
        """
        ref = _ref(pod)
        if not (ref.name and ref.uid):
            return
        with self._lock:
            if self._synced and ref.key not in self._pods and ref not in self._deleted:
                self._pods[ref.key] = trim_pod(pod)
                self._assumed[ref.key] = self._clock()

    def _drop_stale_assumed(self) -> None:
        """Under the lock. An assumed pod no event confirmed (its watch missed it): the LIST decides."""
        now = self._clock()
        for key in [k for k, at in self._assumed.items() if now - at > ASSUME_S]:
            del self._assumed[key]
            self._pods.pop(key, None)

    def get(self, key: str) -> Mapping[str, Any] | None:
        """One pod by ``"<namespace>/<name>"`` as last seen, without copying the cache."""
        with self._lock:
            return self._pods.get(key)

    def view(self) -> CacheView:
        with self._lock:
            if self._assumed:
                self._drop_stale_assumed()
            out = CacheView(tuple(self._pods.values()), self._fresh, frozenset(self._deleted), self._synced)
            self._fresh = False
        return out


__all__ = ["ASSUME_S", "CacheView", "PodCache"]
