"""The idle detector's history across an agent restart: export, the trust rule, restore. Plain data, no clock."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.core.detectors import IdleDetector, IdleState, verdict_from_status
from controller.core.idle_history import TrackRecord, to_records, trusted_tracks
from gpumetrics import DeviceMetrics, Workload

WINDOW = 600.0
GAP = 12.0


def detector(window_s: float = WINDOW, threshold_pct: float = 0.0, max_gap_s: float = GAP) -> IdleDetector:
    return IdleDetector(window_s=window_s, threshold_pct=threshold_pct, max_gap_s=max_gap_s)


def restarted(
    before: IdleDetector, now: float, after: IdleDetector | None = None
) -> tuple[IdleDetector, dict[str, str]]:
    """What the agent does: save the tracks, start a new detector, restore what can be trusted at ``now``."""
    records = to_records(before.tracks())
    fresh = after or detector(before.window_s, before.threshold_pct, before.max_gap_s)
    trusted, refused = trusted_tracks(records, now, fresh)
    assert sorted(fresh.restore(trusted)) == sorted(trusted)
    return fresh, refused


def idle_from(start: float, end: float, det: IdleDetector | None = None, device: str = "gpu0") -> IdleDetector:
    det = det or detector()
    t = start
    while t <= end:
        det.observe(device, 0.0, t)
        t += 5
    return det


def test_saved_then_restored_gives_the_same_verdict_and_the_streak_goes_on() -> None:
    before = idle_from(0, 590)
    after, refused = restarted(before, now=595)
    assert refused == {}
    assert after.status("gpu0", 595) == before.status("gpu0", 595)
    same = [verdict_from_status("gpu0", d.status("gpu0", 595), is_process_level=True) for d in (before, after)]
    assert same[0] == same[1] and same[1].state == "idle" and same[1].idle_since == 0
    # The first scrape after the restart continues the streak: idle at the window, not a window later.
    assert after.observe("gpu0", 0.0, 600).state is IdleState.IDLE
    assert after.status("gpu0", 600).idle_since == 0


def test_a_lent_gpu_is_not_unknown_before_the_first_scrape() -> None:
    # A borrower works on the GPU: busy, with the pod the (process-level) source named.
    before = detector()
    job = (Workload("spot", "job", "main"),)
    before.observe_scrape([DeviceMetrics("nvidia", "gpu0", utilization_pct=80.0, workloads=job)], 100.0)
    after, _ = restarted(before, now=104)
    verdict = verdict_from_status("gpu0", after.status("gpu0", 104), is_process_level=True)
    assert verdict.state == "active" and verdict.users == frozenset({"spot/job"})
    assert after.tracks()["gpu0"].workloads == (Workload("spot", "job"),)


def test_history_older_than_the_gap_is_not_trusted_and_the_device_reads_unknown() -> None:
    before = idle_from(0, 590)
    after, refused = restarted(before, now=590 + GAP + 1)
    assert refused["gpu0"].startswith("no reading within max_gap_s (last 13s ago, limit 12s)")
    status = after.status("gpu0", 603)
    assert (status.state, status.reason) == (IdleState.UNKNOWN, "no reading yet")
    assert verdict_from_status("gpu0", status, is_process_level=True).state == "unknown"
    # The next idle reading starts a streak of its own: the owner waits a whole window again.
    assert after.observe("gpu0", 0.0, 605).idle_since == 605


def test_the_window_bounds_the_trust_when_it_is_shorter_than_the_gap() -> None:
    before = idle_from(0, 20, detector(window_s=10, max_gap_s=30))
    _, refused = restarted(before, now=20 + 11)
    assert "limit 10s" in refused["gpu0"]
    _, refused = restarted(before, now=20 + 10)
    assert refused == {}


def test_a_clock_that_went_back_is_not_trusted() -> None:
    before = idle_from(0, 100)
    after, refused = restarted(before, now=50)
    assert "is after now (50): the clock went back" in refused["gpu0"]
    # Kept, it would have made every new reading look out of order.
    assert after.observe("gpu0", 0.0, 55).reason == "idle reading started a streak"


def test_a_reading_the_new_threshold_judges_otherwise_is_not_trusted() -> None:
    before = idle_from(0, 100, detector(threshold_pct=5.0))
    before.observe("gpu0", 3.0, 105)  # idle at 5 %, busy at 0 %
    after, refused = restarted(before, now=106, after=detector(threshold_pct=0.0))
    assert "disagrees with idleThresholdPct 0" in refused["gpu0"]
    assert after.status("gpu0", 106).state is IdleState.UNKNOWN


GOOD = TrackRecord("gpu0", 100.0, "idling", 50.0, "idle reading", 0.0, ("team/dev",))


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"last_kind": "idle"}, "unreadable record (kind 'idle'"),
        ({"last_reading_at": math.nan}, "must be finite"),
        ({"idle_since": math.inf}, "must be finite"),
        ({"utilization_pct": math.nan}, "must be finite"),
        ({"idle_since": None}, "idling reading with idle_since None"),
        ({"idle_since": 101.0}, "idling reading with idle_since 101.0"),
        ({"last_kind": "busy", "utilization_pct": 50.0}, "busy reading with idle_since 50.0"),
        ({"last_kind": "busy", "idle_since": None, "utilization_pct": None}, "without its utilization"),
        ({"workloads": ("team",)}, "expected namespace/pod"),
        ({"workloads": ("team/dev/x",)}, "expected namespace/pod"),
        ({"workloads": ("/dev",)}, "expected namespace/pod"),
    ],
)
def test_a_malformed_record_is_left_out_with_its_reason(change: dict[str, Any], why: str) -> None:
    det = detector()
    trusted, refused = trusted_tracks([GOOD, dataclasses.replace(GOOD, device_id="gpu1", **change)], 105, det)
    assert list(trusted) == ["gpu0"]
    assert why in refused["gpu1"]


def test_restore_keeps_a_reading_taken_since() -> None:
    det = detector()
    det.observe("gpu0", 50.0, 106)
    trusted, _ = trusted_tracks([GOOD, dataclasses.replace(GOOD, device_id="gpu1")], 107, det)
    assert det.restore(trusted) == ["gpu1"]
    assert det.status("gpu0", 107).state is IdleState.BUSY


def test_unknown_last_readings_round_trip_as_unknown() -> None:
    before = detector()
    before.observe_failure(10.0, "connection refused")  # no devices known yet: nothing
    before.observe("gpu0", None, 10.0)
    after, refused = restarted(before, now=12)
    assert refused == {} and after.status("gpu0", 12) == before.status("gpu0", 12)


# ---- against the detector that never restarted -------------------------------------------------

steps = st.lists(
    st.tuples(st.floats(min_value=0.5, max_value=20), st.sampled_from([None, 0.0, 0.5, 30.0])),
    min_size=1,
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(steps=steps, pause=st.floats(min_value=0, max_value=30), after=st.sampled_from([None, 0.0, 30.0]))
def test_a_restart_changes_nothing_within_the_gap_and_forgets_beyond_it(
    steps: list[tuple[float, float | None]], pause: float, after: float | None
) -> None:
    kept = IdleDetector(window_s=60, threshold_pct=0.5, max_gap_s=GAP)
    t = 0.0
    for dt, util in steps:
        t += dt
        kept.observe("d", util, t)
    now = t + pause
    restored, refused = restarted(kept, now)
    if now - t <= GAP:  # the pause as the detector computes it (float rounding included)
        assert refused == {}
        assert restored.status("d", now) == kept.status("d", now)
        # and every later reading is judged as if the agent had never stopped
        assert restored.observe("d", after, now + 1) == kept.observe("d", after, now + 1)
    else:
        assert list(refused) == ["d"] and restored.status("d", now).state is IdleState.UNKNOWN
