"""A share count that rises is published as soon as kubelet's device manager holds the new devices.

kubelet takes a device plugin's new list at once, but writes the Node's ``allocatable`` from it
only with its next node status, every ``nodeStatusUpdateFrequency`` (10 s by default). A sharer
that waits for a new shadow waits that long after the shadow runs (measured: 1.0 to 1.7 s of a
2.3 to 3.2 s start at 4 s). So when the node plan offers more Healthy slots of a share resource,
this thread asks kubelet's PodResources ``GetAllocatableResources`` every ``poll_s`` until its
device manager holds them, and publishes the count it holds (never more than the agent offers)
through the Node watch, which writes it only where the Node shows less and never for a count it
holds lower for a draining shadow (controller/share/node_watch.py). After ``give_up_s`` it stops
asking; kubelet's own node status then brings the count, as it always did.

``offered`` is called by the applier with every list it gives a share plugin, lower ones too, so
a catch-up in flight never publishes slots withdrawn since it started.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from gpushare.errors import GpushareError
from gpushare.log import kv

log = logging.getLogger(__name__)

POLL_S = 0.025  # between looks at kubelet's devices; each takes a turn of the PodResources call spacing
GIVE_UP_S = 2.0  # kubelet that has not taken the list by then is slow or restarting: its node status will do

Allocatable = Callable[[], Mapping[str, Sequence[str]]]  # PodResources: resource -> device IDs kubelet holds Healthy
Publish = Callable[[Callable[[], Mapping[str, int]]], Mapping[str, int]]  # NodeWatch.catch_up


class CountCatchUp:
    """``offered`` from the applier (loop thread); ``run(stop)`` is the body of one thread."""

    def __init__(
        self,
        allocatable: Allocatable,
        publish: Publish,
        *,
        poll_s: float = POLL_S,
        give_up_s: float = GIVE_UP_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._allocatable = allocatable
        self._publish = publish
        self._poll_s, self._give_up_s, self._clock = poll_s, give_up_s, clock
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._offered: dict[str, int] = {}  # share resource -> Healthy devices its plugin lists now
        self._waiting: dict[str, float] = {}  # share resource -> when to stop asking kubelet

    def offered(self, resource: str, healthy: int) -> None:
        """The share plugin of ``resource`` now lists ``healthy`` Healthy devices."""
        with self._lock:
            before = self._offered.get(resource, 0)
            self._offered[resource] = healthy
            if healthy > before:
                self._waiting[resource] = self._clock() + self._give_up_s
                self._wake.set()
            elif healthy < before:
                self._waiting.pop(resource, None)

    def waiting(self) -> list[str]:
        with self._lock:
            return sorted(self._waiting)

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            if not self.waiting():
                self._wake.wait(1.0)
                self._wake.clear()
                continue
            try:
                self.step()
            except Exception:  # one bad look must not end the thread: the counts would wait for kubelet again
                log.exception("share count catch-up failed")
            stop.wait(self._poll_s)

    def step(self) -> None:
        """One look at kubelet's devices: publish what it holds of each awaited resource."""
        try:
            held = self._allocatable()
        except GpushareError as exc:
            log.debug("kubelet's devices unavailable; the count waits for kubelet", extra=kv(reason=str(exc)))
            held = {}
        now = self._clock()
        with self._lock:
            waiting = dict(self._waiting)
        ready = {r for r in waiting if len(held.get(r, ())) >= self._offered_now(r) or now >= waiting[r]}
        if not ready:
            return

        def counts() -> dict[str, int]:
            # Read under the Node watch's publish lock: a list shortened meanwhile caps what goes out.
            return {r: n for r in ready if (n := min(len(held.get(r, ())), self._offered_now(r))) > 0}

        try:
            self._publish(counts)
        except GpushareError as exc:
            log.warning("cannot publish the share count; kubelet's node status will", extra=kv(error=str(exc)))
        finally:
            with self._lock:
                for r in ready:
                    if self._waiting.get(r) == waiting[r]:  # not offered more since
                        del self._waiting[r]

    def _offered_now(self, resource: str) -> int:
        with self._lock:
            return self._offered.get(resource, 0)


__all__ = ["GIVE_UP_S", "POLL_S", "CountCatchUp"]
