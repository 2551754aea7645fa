"""The list-then-watch loop the agent's caches share (pods, lendable namespaces).

A cache lists in full at start, after a 410 (``ResourceExpired``), after any failure and every
``resync_s``, and watches from the last resource version in between. Only what to list and
what to watch differs between caches; this loop, its backoff and its log lines do not.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from controller.errors import KubeError, ResourceExpired
from gpushare.log import kv

log = logging.getLogger(__name__)

_FIRST_BACKOFF_S = 0.5
_MAX_BACKOFF_S = 30.0


class ListWatchLoop:
    """Base of a watched cache: subclasses set the fields below and define ``relist`` and ``watch_once``."""

    what: str  # for the log lines: "pod", "namespace"
    resync_s: float
    _synced: bool  # at least one LIST succeeded
    _listed_at: float
    _clock: Callable[[], float]

    def relist(self) -> None:
        raise NotImplementedError

    def watch_once(self, stop: threading.Event, timeout_s: int | None = None) -> None:
        raise NotImplementedError

    def run(self, stop: threading.Event) -> None:
        """List, then watch until ``stop``; list again every ``resync_s`` and after any failure."""
        backoff_s = _FIRST_BACKOFF_S
        while not stop.is_set():
            try:
                if not self._synced or self._clock() - self._listed_at >= self.resync_s:
                    self.relist()
                self.watch_once(stop)
                backoff_s = _FIRST_BACKOFF_S
            except ResourceExpired as exc:
                log.info(f"{self.what} watch expired; listing again", extra=kv(reason=str(exc)))
                self._listed_at = float("-inf")
            except KubeError as exc:
                # A silent or broken stream, or an API hiccup: back off and list again in full.
                log.warning(f"{self.what} watch failed; listing again", extra=kv(reason=str(exc), backoff_s=backoff_s))
                self._listed_at = float("-inf")
                stop.wait(backoff_s)
                backoff_s = min(backoff_s * 2, _MAX_BACKOFF_S)


__all__ = ["ListWatchLoop"]
