"""Detectors over the metrics model: the ``IdleDetector`` (design §6 "away"; rules in docs/metrics.md).

Decision code: plain data in, plain data out; no clock (``now`` is passed in, seconds on
any one steady clock; use wall-clock seconds if the tracks are persisted across restarts,
design §9), no I/O, no threads. It reads gpumetrics' per-device model (``DeviceMetrics``)
directly, and ``verdict_from_status`` turns a device's status into the ``IdleVerdict`` that
``plan_spot`` takes.

The idle rules, exactly
-----------------------
Each observation of a device is one *reading*:

- **idle**: ``utilization_pct`` is a number and ``<= threshold_pct`` (default 0: only a
  real 0 counts);
- **busy**: a number above the threshold;
- **unknown**: ``None`` (the adapter could not read it, a sentinel, unsupported), the
  device is missing from a scrape that worked (``observe_scrape``), or the scrape failed
  (``observe_failure``).

The *idle streak* of a device starts at the time of an idle reading that does not
continue a streak, and continues while each next reading is idle and comes at most
``max_gap_s`` after the previous one. It ends at a busy reading, at an **unknown
reading** (unknown never counts as idle: we cannot vouch for the time it covers), and at
a gap longer than ``max_gap_s`` (the next idle reading starts a new streak at its own
time). A device is **idle** when its streak is at least ``window_s`` old and its last
reading is idle and at most ``max_gap_s`` old; a device with no reading for longer than
``max_gap_s`` is **unknown** ("stale"), never idle: spot fails closed when metrics stop.

Nothing resets silently: every status carries a ``reason`` naming the reading that set
it, and every change of state is logged once at INFO with the device and the reason.
A reading older than the device's last one is ignored and says so in its ``reason``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Literal

from gpumetrics.model import DeviceMetrics, Workload
from gpushare.config import Config
from gpushare.errors import ConfigError
from gpushare.log import kv

__all__ = [
    "DeviceTrack",
    "IdleDetector",
    "IdleState",
    "IdleStatus",
    "IdleVerdict",
    "verdict_from_status",
]

log = logging.getLogger(__name__)

DEFAULT_WINDOW_S = 600.0
DEFAULT_THRESHOLD_PCT = 0.0
# About two scrape intervals (5 s) plus a timeout: one lost scrape does not break a streak.
DEFAULT_MAX_GAP_S = 12.0


class IdleState(StrEnum):
    BUSY = "busy"
    IDLING = "idling"  # idle readings, streak shorter than the window
    IDLE = "idle"  # streak at least the window: lendable as far as utilization goes
    UNKNOWN = "unknown"


# Reasons (the ``reason`` of a status). Stable strings: they appear in logs.
R_IDLE = "idle reading"
R_STREAK_STARTED = "idle reading started a streak"
R_GAP = "idle reading after a gap; streak restarted"
R_BUSY = "busy reading"
R_UNKNOWN = "unknown reading"
R_MISSING = "device missing from the scrape"
R_NEVER = "no reading yet"
R_STALE = "no reading within max_gap_s"
R_OUT_OF_ORDER = "reading older than the last one ignored"


@dataclass(frozen=True, slots=True)
class DeviceTrack:
    """What the detector remembers of one device; plain data so ``state.py`` can persist it."""

    last_reading_at: float
    # The kind of the last reading: IDLING (idle), BUSY or UNKNOWN.
    last_kind: IdleState
    idle_since: float | None
    reason: str
    utilization_pct: float | None = None
    workloads: tuple[Workload, ...] = ()


@dataclass(frozen=True, slots=True)
class IdleStatus:
    device_id: str
    state: IdleState
    # Start of the current idle streak, None when there is none.
    idle_since: float | None
    idle_for_s: float
    last_reading_at: float | None
    reason: str
    utilization_pct: float | None = None
    # From the last reading; an idle device with none is "unallocated", not "wasted".
    workloads: tuple[Workload, ...] = ()

    @property
    def is_idle(self) -> bool:
        return self.state is IdleState.IDLE


class IdleDetector:
    """Per device, since when utilization has been at or below a threshold (module docstring)."""

    def __init__(
        self,
        window_s: float = DEFAULT_WINDOW_S,
        threshold_pct: float = DEFAULT_THRESHOLD_PCT,
        max_gap_s: float = DEFAULT_MAX_GAP_S,
        tracks: Mapping[str, DeviceTrack] | None = None,
    ) -> None:
        problems = []
        if not window_s > 0:
            problems.append(f"idleWindow: must be more than 0 s (got {window_s})")
        if not 0 <= threshold_pct <= 100:
            problems.append(f"idleThresholdPct: must be within 0..100 (got {threshold_pct})")
        if not max_gap_s > 0:
            problems.append(f"max_gap_s: must be more than 0 s (got {max_gap_s})")
        if problems:
            raise ConfigError(problems, source="idle detector")
        self.window_s = window_s
        self.threshold_pct = threshold_pct
        self.max_gap_s = max_gap_s
        self._tracks: dict[str, DeviceTrack] = dict(tracks or {})

    @classmethod
    def from_config(cls, cfg: Config, tracks: Mapping[str, DeviceTrack] | None = None) -> IdleDetector:
        """``idleWindow``, ``idleThresholdPct``; the gap tolerance is 2 scrape intervals + the timeout."""
        gap = 2 * cfg.metrics.scrape_interval_s + cfg.metrics.scrape_timeout_s
        return cls(cfg.idle_window_s, cfg.idle_threshold_pct, gap, tracks)

    # ---- readings ----------------------------------------------------------------------------

    def observe(
        self,
        device_id: str,
        utilization_pct: float | None,
        now: float,
        workloads: tuple[Workload, ...] = (),
        *,
        unknown_reason: str = R_UNKNOWN,
    ) -> IdleStatus:
        """Record one reading of one device at ``now`` and return its status."""
        old = self._tracks.get(device_id)
        if old is not None and now < old.last_reading_at:
            status = self.status(device_id, now)
            return replace(status, reason=f"{R_OUT_OF_ORDER} (at {now:g}, last at {old.last_reading_at:g})")
        if utilization_pct is None:
            track = DeviceTrack(now, IdleState.UNKNOWN, None, unknown_reason, None, workloads)
        elif utilization_pct > self.threshold_pct:
            track = DeviceTrack(now, IdleState.BUSY, None, R_BUSY, utilization_pct, workloads)
        else:
            if (
                old is not None
                and old.idle_since is not None
                and old.last_kind is IdleState.IDLING
                and now - old.last_reading_at <= self.max_gap_s
            ):
                since, reason = old.idle_since, R_IDLE
            else:
                had_streak = old is not None and old.idle_since is not None
                since, reason = now, (R_GAP if had_streak else R_STREAK_STARTED)
            track = DeviceTrack(now, IdleState.IDLING, since, reason, utilization_pct, workloads)
        before = self.status(device_id, now).state if old is not None else None
        self._tracks[device_id] = track
        status = self.status(device_id, now)
        if status.state is not before:
            log.info(
                "idle-state",
                extra=kv(
                    device=device_id,
                    state=status.state.value,
                    previous=before.value if before else "none",
                    reason=status.reason,
                    utilization_pct=utilization_pct,
                ),
            )
        return status

    def observe_scrape(self, devices: Iterable[DeviceMetrics], now: float) -> dict[str, IdleStatus]:
        """One successful scrape: each device's reading; a known device absent from it reads unknown."""
        out: dict[str, IdleStatus] = {}
        for device in devices:
            out[device.device_id] = self.observe(device.device_id, device.utilization_pct, now, device.workloads)
        for device_id in list(self._tracks):
            if device_id not in out:
                out[device_id] = self.observe(device_id, None, now, unknown_reason=R_MISSING)
        return out

    def observe_failure(self, now: float, reason: str) -> dict[str, IdleStatus]:
        """The scrape failed: every known device reads unknown, with ``reason`` (the error text)."""
        return {
            device_id: self.observe(device_id, None, now, unknown_reason=f"scrape failed: {reason}")
            for device_id in list(self._tracks)
        }

    def forget(self, device_id: str) -> None:
        """Drop a device (it left the node); its next reading starts from nothing."""
        self._tracks.pop(device_id, None)

    # ---- queries -----------------------------------------------------------------------------

    def status(self, device_id: str, now: float) -> IdleStatus:
        """The device's state at ``now`` (a query; changes nothing)."""
        track = self._tracks.get(device_id)
        if track is None:
            return IdleStatus(device_id, IdleState.UNKNOWN, None, 0.0, None, R_NEVER)
        age = now - track.last_reading_at
        if age > self.max_gap_s:
            return IdleStatus(
                device_id,
                IdleState.UNKNOWN,
                None,
                0.0,
                track.last_reading_at,
                f"{R_STALE} (last {age:g}s ago, limit {self.max_gap_s:g}s)",
                None,
                track.workloads,
            )
        if track.last_kind is not IdleState.IDLING or track.idle_since is None:
            return IdleStatus(
                device_id,
                track.last_kind,
                None,
                0.0,
                track.last_reading_at,
                track.reason,
                track.utilization_pct,
                track.workloads,
            )
        idle_for = max(0.0, now - track.idle_since)
        state = IdleState.IDLE if idle_for >= self.window_s else IdleState.IDLING
        return IdleStatus(
            device_id,
            state,
            track.idle_since,
            idle_for,
            track.last_reading_at,
            track.reason,
            track.utilization_pct,
            track.workloads,
        )

    def statuses(self, now: float) -> dict[str, IdleStatus]:
        return {device_id: self.status(device_id, now) for device_id in self._tracks}

    def is_idle(self, device_id: str, now: float) -> bool:
        return self.status(device_id, now).is_idle

    def tracks(self) -> dict[str, DeviceTrack]:
        """A copy of the per-device memory, for persistence (``controller/core/idle_history.py``)."""
        return dict(self._tracks)

    def restore(self, tracks: Mapping[str, DeviceTrack]) -> list[str]:
        """Take tracks a previous run saved; a device already read since is kept. Returns those taken.

        The caller decides which saved tracks to trust (``idle_history.trusted_tracks``).
        """
        taken = []
        for device_id, track in sorted(tracks.items()):
            old = self._tracks.get(device_id)
            if old is None or old.last_reading_at < track.last_reading_at:
                self._tracks[device_id] = track
                taken.append(device_id)
        return taken


VerdictState = Literal["idle", "active", "unknown"]


@dataclass(frozen=True)
class IdleVerdict:
    """The idle tracker's view of one real GPU, as plain data.

    ``idle``: utilization at or below the threshold in every sample since ``idle_since``
    (samples cover that span). ``active``: above the threshold now. ``unknown``: metrics
    missing or invalid — never idle: unknown cannot vouch for the time it covers.

    ``users`` are the pods (``ns/name``) whose *processes* use the GPU now, when the source
    can attribute at process level; ``None`` when it cannot. An exporter that labels a
    device with the pod it is *allocated* to must give ``None``: a borrower's work would
    otherwise look like the owner's.
    """

    real_id: str
    state: VerdictState
    idle_since: float | None = None
    users: frozenset[str] | None = None


def verdict_from_status(real_id: str, status: IdleStatus, *, is_process_level: bool) -> IdleVerdict:
    """The ``IdleDetector``'s status of a device as the verdict ``plan_spot`` takes.

    ``is_process_level``: the source's workloads name the pods whose processes use the
    device (a test's fake exporter); False for exporters that label the
    pod the device is allocated to (dcgm-exporter and most vendor exporters).
    """
    users = frozenset(f"{w.namespace}/{w.pod}" for w in status.workloads) if is_process_level else None
    if status.state in (IdleState.IDLE, IdleState.IDLING) and status.idle_since is not None:
        return IdleVerdict(real_id, "idle", status.idle_since, users)
    if status.state is IdleState.BUSY:
        return IdleVerdict(real_id, "active", None, users)
    return IdleVerdict(real_id, "unknown", None, None)
