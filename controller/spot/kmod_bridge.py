"""gpukmod as spot sees it: the loop's KmodCommands applied, the module's notices queued.

A notice is handed first to ``on_notice`` (the spot runtime starts a thread that kills the
owner's borrowers and calls ``release``), which also queues it for the next pass and wakes it.

An absent or unloaded module is not an error: spot then works on utilization alone, and
the module is looked for again every ``KMOD_RETRY_S`` (it may be loaded later).
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from controller.core.actions import KmodCommand
from controller.spot.solver import KmodView
from gpukmod import KmodClient, KmodError
from gpushare.log import kv

log = logging.getLogger(__name__)

KMOD_RETRY_S = 30.0  # how often an absent module is looked for again (it may be loaded later)
# Commands whose ENOENT means "already done": the id left the table (module reloaded, or it
# was deleted by a timed-out hold's owner going away).
_IDEMPOTENT_ON_ENOENT = frozenset({"delete", "undetect", "release"})


class KmodLike(Protocol):
    """The part of ``gpukmod.KmodClient`` the bridge uses (tests pass a recording fake)."""

    def register(self) -> None: ...
    def add(self, *ids: int) -> None: ...
    def delete(self, *ids: int) -> None: ...
    def detect(self, *ids: int) -> None: ...
    def undetect(self, *ids: int) -> None: ...
    def release(self, *ids: int) -> None: ...
    def start_notices(self, callback: Callable[[int], None], *, name: str = ...) -> None: ...
    def close(self) -> None: ...


def open_kmod(unit: int) -> KmodLike:
    """The real client on netlink ``unit``, on a table emptied of what an earlier agent left
    (``KmodClient.open_flushed``; the bridge registers next); raises KmodError when the module is absent."""
    return KmodClient.open_flushed(unit=unit)


class KmodBridge:
    """Keeps gpukmod in step with the loop's KmodCommands and queues its notices.

    ``view()`` is what the loop passes to ``plan_spot``: the ids this instance added and
    armed. After an agent restart it starts empty; ``add`` of a present id and ``detect``
    of an armed one are harmless, so the plan simply re-applies the watch list.
    """

    def __init__(
        self,
        *,
        unit: int = 31,
        wake: Callable[[], None] = lambda: None,
        client_factory: Callable[[int], KmodLike] = open_kmod,
        clock: Callable[[], float] = time.monotonic,
        retry_s: float = KMOD_RETRY_S,
    ) -> None:
        self._unit = unit
        self._where = f"netlink unit {unit}"
        self._wake = wake
        self._factory = client_factory
        self._clock = clock
        self._retry_s = retry_s
        self._lock = threading.Lock()
        self._client: KmodLike | None = None
        self._added: set[int] = set()
        self._detecting: set[int] = set()
        self._notices: list[tuple[int, float]] = []
        # Set by the spot runtime: called on the notice thread with (pidns, arrival time) instead
        # of queueing the notice, so the return is acted on before the pass ``wake`` asks for.
        self.on_notice: Callable[[int, float], None] | None = None
        self._reason = "not started"
        self._next_try = 0.0
        self.notices_total = 0

    def start(self) -> bool:
        """Open, register as THE listener and start the notice thread; False if the module is absent."""
        with self._lock:
            return self._open_locked()

    def _open_locked(self) -> bool:
        self._next_try = self._clock() + self._retry_s
        try:
            client = self._factory(self._unit)
        except KmodError as exc:
            self._set_absent(exc)
            return False
        try:
            client.register()
            client.start_notices(self._on_notice, name="gpushare-spot-kmod-notices")
        except KmodError as exc:
            client.close()
            self._set_absent(exc)
            return False
        self._client = client
        self._added.clear()
        self._detecting.clear()
        self._reason = f"registered on {self._where}"
        log.info("spot kernel module connected", extra=kv(on=self._where))
        return True

    def use_client_factory(self, factory: Callable[[int], KmodLike], *, where: str) -> None:
        """Open the client with ``factory`` from now on; ``where`` names it in the status. Before ``start``.

        For ``gpushare agent --kmod-socket`` (controller/spot/notice_socket.py): a benchmark or
        test hands notices in where the kernel's would enter, and sees every command sent.
        """
        with self._lock:
            self._factory = factory
            self._where = where

    def _set_absent(self, exc: KmodError) -> None:
        reason = (
            "gpukmod not loaded; spot works on utilization alone"
            if exc.errno == errno.EPROTONOSUPPORT
            else f"gpukmod unusable ({exc}); spot works on utilization alone"
        )
        if reason != self._reason:
            log.warning("spot: %s", reason, extra=kv(unit=self._unit))
        self._reason = reason

    def _on_notice(self, pidns: int) -> None:
        at = self._clock()
        if self.on_notice is not None:
            # The spot runtime's return path: it queues the notice and wakes the pass itself, once
            # the kill is done, so no pass competes with the kill for the CPU.
            self.on_notice(pidns, at)
        else:
            self.queue_notice(pidns, at)
            self._wake()
        log.info("spot kernel notice", extra=kv(pidns=pidns))

    def wake(self) -> None:
        """Wake the pass that handles queued notices."""
        self._wake()

    def queue_notice(self, pidns: int, at: float) -> None:
        """Hand a notice (and its arrival time) to the next pass's ``drain``."""
        with self._lock:
            self._notices.append((pidns, at))
            self.notices_total += 1

    def release(self, pidns: int) -> None:
        """Let the owner's held ioctl run now, from the return path (not a pass). Raises KmodError.

        The view still shows it armed: the pass that drains its notice plans ``release`` and
        ``undetect`` as for any return, so a pass running meanwhile does not re-arm it.
        """
        with self._lock:
            client = self._client
        if client is None:
            return
        try:
            client.release(pidns)
        except KmodError as exc:
            if exc.errno != errno.ENOENT:
                raise

    @property
    def available(self) -> bool:
        return self._client is not None

    @property
    def reason(self) -> str:
        return self._reason

    def view(self) -> KmodView:
        with self._lock:
            if self._client is None and self._clock() >= self._next_try:
                self._open_locked()
            return KmodView(self._client is not None, frozenset(self._added), frozenset(self._detecting))

    def drain(self) -> list[tuple[int, float]]:
        """Notices since the last call, as (pidns, monotonic arrival time)."""
        with self._lock:
            out, self._notices = self._notices, []
        return out

    def apply(self, cmd: KmodCommand) -> None:
        """Send one command; the view follows what the kernel accepted. Raises KmodError."""
        with self._lock:
            client = self._client
        if client is None:
            return  # the module went away since the plan was made: nothing to keep in step
        try:
            getattr(client, cmd.op)(cmd.pidns)
        except KmodError as exc:
            if not (exc.errno == errno.ENOENT and cmd.op in _IDEMPOTENT_ON_ENOENT):
                if exc.errno in (errno.ECONNREFUSED, errno.ETIMEDOUT):
                    self._drop(exc)
                raise
        with self._lock:
            if cmd.op == "add":
                self._added.add(cmd.pidns)
            elif cmd.op == "delete":
                self._added.discard(cmd.pidns)
                self._detecting.discard(cmd.pidns)
            elif cmd.op == "detect":
                self._added.add(cmd.pidns)
                self._detecting.add(cmd.pidns)
            elif cmd.op in ("undetect", "release"):
                # release leaves the id in the table, disarmed until the next detect (docs/gpukmod.md)
                self._detecting.discard(cmd.pidns)

    def _drop(self, exc: KmodError) -> None:
        """The module vanished under us (unloaded): forget it and look for it again later."""
        with self._lock:
            client, self._client = self._client, None
            self._set_absent(exc)
            self._next_try = self._clock() + self._retry_s
        if client is not None:
            client.close()

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()  # joins the notice thread

    def status(self) -> dict[str, Any]:
        with self._lock:
            return {
                "available": self._client is not None,
                "reason": self._reason,
                "added": len(self._added),
                "detecting": len(self._detecting),
                "notices": self.notices_total,
            }


def refuse_kmod(unit: int) -> KmodLike:
    """A client factory for ``gpushare agent --no-kmod``: the bridge sees the module as absent."""
    raise KmodError(errno.EPROTONOSUPPORT, "open", "the kernel module is disabled (gpushare agent --no-kmod)")


__all__ = ["KMOD_RETRY_S", "KmodBridge", "KmodLike", "open_kmod", "refuse_kmod"]
