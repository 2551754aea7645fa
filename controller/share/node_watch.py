"""This node's Node object, watched, so that a share count kubelet writes back is lowered again at once.

While a shadow drains, the agent publishes a lower ``gpushare/share-<kind>-<N>`` count than
its share plugin still lists (docs/scale.md, "Shadow removal order"). Kubelet's own node
status, every ``nodeStatusUpdateFrequency``, writes the full count back; the scheduler must
not see it for longer than it takes this watch to show the write. So the pass tells
``NodeWatch`` the counts it publishes (``hold``), and every Node event that shows one of them
higher is answered from the watch thread with one merge-patch of ``nodes/status`` with the
lower number.

A count rises only through ``catch_up``: to what kubelet's device manager already holds, so
that a sharer waiting for a new shadow's slots is placed without waiting for kubelet's node
status (controller/share/count_catch_up.py). Every write, up or down, is made under one lock
and read against the Node as this watch last showed it, with the agent's own last write laid
over it: a lower that follows a catch-up sees the raised count even before the watch shows it.

The Node the watch last showed is also what ``lower`` reads before it writes, so publishing
costs no GET. Until the first LIST there is no Node to read: ``lower`` writes nothing, and the
counts held are written as soon as the LIST shows the Node.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from controller.io.kube_client import WatchEvent
from controller.io.list_watch import ListWatchLoop
from controller.io.node_status import catch_up_fields, lower_fields, merged
from gpushare.errors import GpushareError
from gpushare.log import kv

log = logging.getLogger(__name__)

_PROBLEMS_KEPT = 64  # distinct unreadable fields remembered, so each is logged once


class NodeClient(Protocol):
    """The calls ``NodeWatch`` makes through ``KubeClient``."""

    def list_node(self, name: str) -> tuple[list[dict[str, Any]], str]: ...
    def watch_node(self, name: str, resource_version: str, *, timeout_s: int | None = None) -> Iterator[WatchEvent]: ...
    def patch_node_status(self, node: str, status: Mapping[str, Any]) -> None: ...


def _meta(obj: Any) -> Mapping[str, Any]:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    return meta if isinstance(meta, Mapping) else {}


class NodeWatch(ListWatchLoop):
    """``run(stop)`` is the body of one named thread; ``hold`` and ``lower`` are called by the loop thread."""

    what = "node"

    def __init__(
        self, client: NodeClient, node: str, *, resync_s: float = 300.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._client = client
        self.node = node
        self.resync_s = resync_s
        self._clock = clock
        self._lock = threading.Lock()
        # Held across reading the Node and patching it: a lower and a catch-up never cross.
        self._publish = threading.Lock()
        self._doc: Mapping[str, Any] | None = None  # the Node as the watch last showed it
        self._held: dict[str, int] = {}  # share resource -> the count the last pass publishes
        # share resource -> when (``clock``) the Node last stopped showing it above the held
        # count, that is when a patch lowering it returned: the scheduler may have placed a
        # sharer on the higher count until then.
        self._lowered: dict[str, float] = {}
        self._synced = False
        self._resource_version = ""
        self._listed_at = float("-inf")
        self._problems_logged: frozenset[str] = frozenset()

    def hold(self, counts: Mapping[str, int]) -> None:
        """The counts this node publishes while shadows drain, in place of the previous pass's.

        A resource left out is no longer held: once no shadow of it drains, its count is kubelet's.
        """
        with self._lock:
            self._held = dict(counts)

    def held(self) -> dict[str, int]:
        with self._lock:
            return dict(self._held)

    def lowered_at(self) -> dict[str, float]:
        """Held resource -> when (``clock``) a patch of this watch last lowered its count on the Node."""
        with self._lock:
            return {r: at for r, at in self._lowered.items() if r in self._held}

    def lower(self, resource: str, count: int) -> bool:
        """Lower ``resource`` on the Node to ``count`` if the watch shows it higher; True if it wrote."""
        with self._publish:
            with self._lock:
                doc = self._doc
            return doc is not None and self._write(doc, {resource: count})

    def catch_up(self, counts: Callable[[], Mapping[str, int]]) -> dict[str, int]:
        """Raise share counts the Node shows lower to ``counts()``, evaluated under the publish lock;
        the counts written (empty when none was lower, the Node is not listed yet, or the patch failed).

        A resource held lower for a draining shadow is never raised.
        """
        with self._publish:
            with self._lock:
                doc, held = self._doc, set(self._held)
            if doc is None:
                return {}
            wanted = {r: c for r, c in counts().items() if r not in held}
            raise_to, problems = catch_up_fields(doc, wanted)
            self._log_problems(problems)
            if not raise_to:
                return {}
            try:
                self._client.patch_node_status(self.node, raise_to)
            except GpushareError as exc:
                log.warning("cannot publish the share count", extra=kv(node=self.node, counts=wanted, error=str(exc)))
                return {}
            with self._lock:
                if self._doc is doc:  # else the watch has shown a newer Node meanwhile
                    self._doc = merged(doc, raise_to)
        written = {r: int(c) for r, c in raise_to.get("allocatable", {}).items()}
        log.info("share count published ahead of kubelet's node status", extra=kv(node=self.node, counts=written))
        return written

    def relist(self) -> None:
        items, rv = self._client.list_node(self.node)
        mine = [n for n in items if _meta(n).get("name") == self.node]
        with self._lock:
            self._doc = mine[0] if mine else None
            self._synced = True
            self._resource_version = rv
            self._listed_at = self._clock()
        log.debug("node list", extra=kv(node=self.node, found=bool(mine), resource_version=rv))
        if mine:
            self._enforce(mine[0])

    def apply(self, event: WatchEvent) -> None:
        meta = _meta(event.obj)
        with self._lock:
            if rv := str(meta.get("resourceVersion", "")):
                self._resource_version = rv
        if event.type == "BOOKMARK":
            return
        if meta.get("name") != self.node:
            log.warning("node watch sent another object; ignored", extra=kv(node=self.node, got=meta.get("name")))
            return
        with self._lock:
            self._doc = None if event.type == "DELETED" else event.obj
        if event.type != "DELETED":
            self._enforce(event.obj)

    def watch_once(self, stop: threading.Event, timeout_s: int | None = None) -> None:
        """One watch from the last resource version; returns when it ends (or ``stop`` is set)."""
        with self._lock:
            rv = self._resource_version
        for event in self._client.watch_node(self.node, rv, timeout_s=timeout_s):
            self.apply(event)
            if stop.is_set():
                return

    def _enforce(self, doc: Mapping[str, Any]) -> None:
        """Kubelet (or anyone) wrote a held count back up: lower it again now, not at the next pass."""
        held = self.held()
        if not held:
            return
        with self._publish:
            wrote = self._write(doc, held)
        if wrote:
            log.info("share count written back; lowered again", extra=kv(node=self.node, counts=held))

    def _write(self, doc: Mapping[str, Any], counts: Mapping[str, int]) -> bool:
        """One merge-patch lowering the counts ``doc`` shows higher; a failure is logged, never raised.

        Each resource it lowers is noted with the time the patch returned, whether or not it
        went through (``lowered_at``): the pass withdraws a draining shadow's devices only in the
        gap that follows (controller/share/shadow_drain.py, ``in_write_back_gap``).
        """
        lower, problems = lower_fields(doc, counts)
        self._log_problems(problems)
        if not lower:
            return False
        wrote = False
        try:
            self._client.patch_node_status(self.node, lower)
            wrote = True
        except GpushareError as exc:
            # Kubelet's next status or the next pass brings another chance; the watch goes on.
            log.warning("cannot lower the share count", extra=kv(node=self.node, counts=dict(counts), error=str(exc)))
            return False
        finally:
            shown = {resource for field in lower.values() for resource in field}
            at = self._clock()
            with self._lock:
                self._lowered.update(dict.fromkeys(shown, at))
                if wrote and self._doc is doc:
                    self._doc = merged(doc, lower)
        return True

    def _log_problems(self, problems: list[str]) -> None:
        """Each odd field once: a Node event every few seconds, and every pass, must not repeat it."""
        with self._lock:  # the watch thread and the loop thread both write
            new = frozenset(problems) - self._problems_logged
            if len(self._problems_logged) > _PROBLEMS_KEPT:
                self._problems_logged = frozenset()  # bounded; a repeat after this is harmless
            self._problems_logged |= new
        for problem in sorted(new):
            log.warning("node status not readable; left as it is", extra=kv(node=self.node, problem=problem))


__all__ = ["NodeClient", "NodeWatch"]
