"""The utilization side of spot: the metrics source read into an ``IdleDetector`` on a thread.

A state change of a device (a GPU turned busy: maybe an owner back) wakes the loop at once
instead of at its next period, and the moment it was seen is kept as a candidate return signal.

With a state directory the detector's history outlives the process: it is written to the
state file after every scrape (one small transaction) and read back at start, where
``idle_history.trusted_tracks`` keeps only what a fresh reading could have continued.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

from controller.core.detectors import IdleDetector, IdleState, IdleStatus, IdleVerdict, verdict_from_status
from controller.core.idle_history import to_records, trusted_tracks
from controller.errors import StateError
from controller.io.state import StateStore
from gpumetrics.errors import MetricsError
from gpumetrics.model import DeviceMetrics
from gpumetrics.scrape import Scraper
from gpushare.log import kv

log = logging.getLogger(__name__)


class UtilizationWatcher:
    """Reads the metrics source every ``interval_s`` into an ``IdleDetector`` (thread gpushare-spot-scrape).

    The loop asks for ``verdicts(now)``; a state change (a GPU turned busy: maybe an owner
    back) wakes the loop at once instead of at its next period. ``state_dir``: keep the
    detector's history in ``<state_dir>/controller.sqlite3`` across restarts (None: memory only).
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
        state_dir: str | os.PathLike[str] | None = None,
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
        self._devices: tuple[DeviceMetrics, ...] = ()  # the last scrape that worked, for /metrics' join labels
        self.last_error = ""
        self.last_scrape_at: float | None = None
        self._thread: threading.Thread | None = None
        self._state_dir = state_dir
        self._store: StateStore | None = None
        self._save_error = ""

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
                self._devices = tuple(result.devices)
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
        self._save()
        return statuses

    # ---- the history across restarts (state file) ---------------------------------------------

    def restore(self) -> list[str]:
        """Open the state file and take back the history it can still vouch for; returns the devices taken.

        ``start`` calls it before the first scrape, so the loop's first pass already sees the
        saved verdicts. Without a state directory, or with an unusable file, nothing is restored
        and nothing will be saved (logged once).
        """
        if self._state_dir is None or self._store is not None:
            return []
        try:
            self._store = StateStore(self._state_dir)
            records = self._store.load_idle_tracks()
        except StateError as exc:
            self._close_store()
            log.warning("spot: idle history is not kept across restarts: %s", exc)
            return []
        now = self._clock()
        with self._lock:
            trusted, refused = trusted_tracks(records, now, self._detector)
            taken = self._detector.restore(trusted)
            for device_id in taken:
                self._states[device_id] = self._detector.status(device_id, now).state
        log.info("spot: idle history restored", extra=kv(devices=",".join(taken) or "none", saved=len(records)))
        for device_id, why in sorted(refused.items()):
            log.info("spot: saved idle history not used", extra=kv(device=device_id, reason=why))
        return taken

    def _save(self) -> None:
        """Write the detector's tracks (a whole-table replace: a handful of rows, one transaction)."""
        if self._store is None:
            return
        with self._lock:
            records = to_records(self._detector.tracks())
        try:
            self._store.save_idle_tracks(records)
        except StateError as exc:
            if str(exc) != self._save_error:
                log.warning("spot: idle history not saved: %s", exc)
            self._save_error = str(exc)
        else:
            self._save_error = ""

    def _close_store(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None

    @property
    def source(self) -> str:
        return self._scraper.source

    @property
    def endpoint(self) -> str:
        """Where the scrapes go (``Scraper.endpoint``)."""
        return self._scraper.endpoint

    def last_devices(self) -> tuple[DeviceMetrics, ...]:
        """The devices of the last scrape that worked (empty before one)."""
        return self._devices

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
        self.restore()

        def run() -> None:
            while not stop.is_set():
                try:
                    self.scrape_once()
                except Exception:  # top of a thread loop only: log, go on next interval
                    log.exception("spot: scrape pass failed")
                stop.wait(self._interval_s)
            self._close_store()

        self._thread = threading.Thread(target=run, name="gpushare-spot-scrape", daemon=True)
        self._thread.start()

    def join(self, timeout_s: float | None = None) -> None:
        """Wait for the scrape thread to end, then close the state file (also after ``restore`` alone)."""
        if self._thread is not None:
            self._thread.join(timeout_s)
        if self._thread is None or not self._thread.is_alive():
            self._close_store()


__all__ = ["UtilizationWatcher"]
