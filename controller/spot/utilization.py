"""The utilization side of spot: the metrics source read into an ``IdleDetector`` on a thread.

A state change of a device (a GPU turned busy: maybe an owner back) wakes the loop at once
instead of at its next period, and the moment it was seen is kept as a candidate return signal.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from controller.core.detectors import IdleDetector, IdleState, IdleStatus, IdleVerdict, verdict_from_status
from controller.errors import MetricsError
from controller.metrics.scrape import Scraper

log = logging.getLogger(__name__)


class UtilizationWatcher:
    """Reads the metrics source every ``interval_s`` into an ``IdleDetector`` (thread gpushare-spot-scrape).

    The loop asks for ``verdicts(now)``; a state change (a GPU turned busy: maybe an owner
    back) wakes the loop at once instead of at its next period.
    """

    def __init__(
        self,
        scraper: Scraper,
        detector: IdleDetector,
        *,
        interval_s: float,
        is_process_level: bool,
        wake: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._scraper = scraper
        self._detector = detector
        self._interval_s = interval_s
        self.is_process_level = is_process_level
        self._wake = wake
        self._clock = clock
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._states: dict[str, IdleState] = {}
        self._busy_at: list[float] = []
        self.last_error = ""
        self.last_scrape_at: float | None = None
        self._thread: threading.Thread | None = None

    def scrape_once(self) -> dict[str, IdleStatus]:
        """One read (tests call it directly); failures mark every device unknown."""
        now = self._clock()
        try:
            result = self._scraper.read()
        except MetricsError as exc:
            with self._lock:
                statuses = self._detector.observe_failure(now, str(exc))
                if str(exc) != self.last_error:
                    log.warning("spot: metrics unreadable: %s", exc)
                self.last_error = str(exc)
        else:
            with self._lock:
                statuses = self._detector.observe_scrape(result.devices, now)
                self.last_error = ""
                self.last_scrape_at = now
        changed = False
        with self._lock:
            for device_id, st in statuses.items():
                if self._states.get(device_id) != st.state:
                    changed = True
                    if st.state is IdleState.BUSY:
                        self._busy_at.append(self._monotonic())
                self._states[device_id] = st.state
        if changed:
            self._wake()
        return statuses

    def take_busy_times(self) -> list[float]:
        """Monotonic times GPUs turned busy since the last call (candidate return signals)."""
        with self._lock:
            out, self._busy_at = self._busy_at, []
        return out

    def verdicts(self, now: float) -> dict[str, IdleVerdict]:
        with self._lock:
            statuses = self._detector.statuses(now)
        return {
            rid: verdict_from_status(rid, st, is_process_level=self.is_process_level) for rid, st in statuses.items()
        }

    def start(self, stop: threading.Event) -> None:
        def run() -> None:
            while not stop.is_set():
                try:
                    self.scrape_once()
                except Exception:  # top of a thread loop only: log, go on next interval
                    log.exception("spot: scrape pass failed")
                stop.wait(self._interval_s)

        self._thread = threading.Thread(target=run, name="gpushare-spot-scrape", daemon=True)
        self._thread.start()

    def join(self, timeout_s: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout_s)


__all__ = ["UtilizationWatcher"]
