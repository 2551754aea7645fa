"""The names of the namespaces that carry a label, kept by a list+watch instead of a LIST per pass.

The spot pass asks on every run which namespaces opted in as lendable (design §6). A pass
runs on every pod event, so a LIST there would cost one API request per pod event on every
node. ``NamespaceCache`` lists once at start, after a 410 and every ``resync_s``, and
watches in between: a namespace that gains the label arrives as ADDED, one that loses it
as DELETED (the API server filters a watch by its label selector on both sides).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from controller.io.kube_client import KubeClient, WatchEvent
from controller.io.list_watch import ListWatchLoop
from gpushare.log import kv

log = logging.getLogger(__name__)


def _meta(obj: Any) -> Mapping[str, Any]:
    # Never raises: an odd object is ignored rather than ending the watch thread.
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    return meta if isinstance(meta, Mapping) else {}


def _name(obj: Any) -> str:
    return str(_meta(obj).get("name", ""))


class NamespaceCache(ListWatchLoop):
    """Namespaces matching ``label_selector``; ``run(stop)`` is the body of one named thread.

    ``names()`` is called by the reconcile thread; until the first LIST succeeds it is empty,
    which the spot pass reads as "no namespace opted in": nothing is lent on a guess.
    """

    what = "namespace"

    def __init__(
        self,
        client: KubeClient,
        *,
        label_selector: str,
        resync_s: float = 300.0,
        on_change: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self.label_selector = label_selector
        self.resync_s = resync_s
        self._on_change = on_change or (lambda: None)
        self._clock = clock
        self._lock = threading.Lock()
        self._names: frozenset[str] = frozenset()
        self._synced = False
        self._resource_version = ""
        self._listed_at = float("-inf")

    @property
    def is_synced(self) -> bool:
        with self._lock:
            return self._synced

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._names)

    def relist(self) -> None:
        items, rv = self._client.list_namespaces(label_selector=self.label_selector)
        names = frozenset(_name(n) for n in items)
        with self._lock:
            changed = names != self._names or not self._synced
            self._names, self._synced = names, True
            self._resource_version = rv
            self._listed_at = self._clock()
        log.debug("namespace list", extra=kv(namespaces=len(names), resource_version=rv))
        if changed:
            self._on_change()

    def apply(self, event: WatchEvent) -> None:
        rv = str(_meta(event.obj).get("resourceVersion", ""))
        name = _name(event.obj)
        with self._lock:
            if rv:
                self._resource_version = rv
            if event.type == "BOOKMARK" or not name:
                return
            before = self._names
            self._names = before - {name} if event.type == "DELETED" else before | {name}
            changed = self._names != before
        if changed:  # a namespace's other edits (annotations, status) change nothing here
            self._on_change()

    def watch_once(self, stop: threading.Event, timeout_s: int | None = None) -> None:
        """One watch from the last resource version; returns when it ends (or ``stop`` is set)."""
        with self._lock:
            rv = self._resource_version
        for event in self._client.watch_namespaces(rv, label_selector=self.label_selector, timeout_s=timeout_s):
            self.apply(event)
            if stop.is_set():
                return


__all__ = ["NamespaceCache"]
