"""The idle detector's history as plain records, and when a saved one may be believed (design §9).

Without it a restarted agent knows nothing of its GPUs: a lent GPU reads "metrics unknown"
and an idle owner waits a whole fresh ``idleWindow``. So the utilization watcher saves every
device's ``DeviceTrack`` in the state file after each scrape (``to_records``) and, at start,
gives the detector back the saved tracks that can still be believed (``trusted_tracks``).

A saved track is believed only as far as a reading is (the idle rules, docs/metrics.md):

- its last reading lies at most the gap tolerance (and at most the window) before ``now``;
  after a longer pause the next reading could not continue its streak anyway, so the device
  starts again from "no reading yet";
- a last reading after ``now`` means the wall clock went back: not believed (it would also
  make every new reading look out of order);
- a reading that the current ``idleThresholdPct`` would judge otherwise (the config changed
  across the restart) and a malformed record are not believed either.

Each record left out comes back with its reason, for one log line; nothing is dropped silently.
Plain data only: the caller passes ``now`` (wall-clock seconds, the clock the tracks were fed).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from controller.core.detectors import R_STALE, DeviceTrack, IdleDetector, IdleState
from gpumetrics.model import Workload

__all__ = ["TrackRecord", "to_records", "trusted_tracks"]

_KINDS = {k.value: k for k in (IdleState.IDLING, IdleState.BUSY, IdleState.UNKNOWN)}


@dataclass(frozen=True, slots=True)
class TrackRecord:
    """One device's ``DeviceTrack`` as the state file keeps it.

    ``last_kind`` is an ``IdleState`` value (``idling``, ``busy`` or ``unknown``: the kind of
    the last reading); ``workloads`` are ``namespace/pod`` names (neither may contain a slash).
    """

    device_id: str
    last_reading_at: float
    last_kind: str
    idle_since: float | None
    reason: str
    utilization_pct: float | None
    workloads: tuple[str, ...]


def to_records(tracks: Mapping[str, DeviceTrack]) -> list[TrackRecord]:
    """The tracks (``IdleDetector.tracks()``) as records, sorted by device."""
    return [
        TrackRecord(
            device_id,
            t.last_reading_at,
            t.last_kind.value,
            t.idle_since,
            t.reason,
            t.utilization_pct,
            tuple(f"{w.namespace}/{w.pod}" for w in t.workloads),
        )
        for device_id, t in sorted(tracks.items())
    ]


def trusted_tracks(
    records: Iterable[TrackRecord], now: float, detector: IdleDetector
) -> tuple[dict[str, DeviceTrack], dict[str, str]]:
    """The saved tracks ``detector`` may take at ``now`` (``IdleDetector.restore``), and each other one's reason."""
    trusted: dict[str, DeviceTrack] = {}
    refused: dict[str, str] = {}
    for record in records:
        track = _track_of(record, now, detector)
        if isinstance(track, str):
            refused[record.device_id] = track
        else:
            trusted[record.device_id] = track
    return trusted, refused


def _track_of(r: TrackRecord, now: float, detector: IdleDetector) -> DeviceTrack | str:
    """The track a record stands for, or why it is not believed at ``now``."""
    kind = _KINDS.get(r.last_kind)
    numbers = (r.last_reading_at, r.idle_since or 0.0, r.utilization_pct or 0.0)
    if kind is None or not all(math.isfinite(x) for x in numbers):
        return f"unreadable record (kind {r.last_kind!r}; times and utilization must be finite numbers)"
    pods = [w.split("/") for w in r.workloads]
    if any(len(p) != 2 or not all(p) for p in pods):
        return f"unreadable workload names {list(r.workloads)} (expected namespace/pod)"
    has_streak = r.idle_since is not None and r.idle_since <= r.last_reading_at
    if (kind is IdleState.IDLING) != has_streak:
        return f"unreadable record ({r.last_kind} reading with idle_since {r.idle_since})"
    if r.last_reading_at > now:
        return f"last reading at {r.last_reading_at:g} is after now ({now:g}): the clock went back"
    limit = min(detector.max_gap_s, detector.window_s)
    if now - r.last_reading_at > limit:
        return f"{R_STALE} (last {now - r.last_reading_at:g}s ago, limit {limit:g}s)"
    if kind is not IdleState.UNKNOWN:
        if r.utilization_pct is None:
            return f"unreadable record ({r.last_kind} reading without its utilization)"
        if (r.utilization_pct <= detector.threshold_pct) != (kind is IdleState.IDLING):
            return (
                f"a {r.last_kind} reading of {r.utilization_pct}% disagrees with "
                f"idleThresholdPct {detector.threshold_pct:g} (changed since it was saved)"
            )
    workloads = tuple(Workload(ns, pod) for ns, pod in pods)
    return DeviceTrack(r.last_reading_at, kind, r.idle_since, r.reason, r.utilization_pct, workloads)
