"""IdleDetector over synthetic time series: plain data in, no clock (``now`` is passed in)."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.core.detectors import DeviceTrack, IdleDetector, IdleState
from gpumetrics import DeviceMetrics, Workload
from gpushare.config import Config, MetricsConfig
from gpushare.errors import ConfigError

WINDOW = 600.0
GAP = 12.0


def run(series: list[tuple[float, float | None]], threshold: float = 0.0) -> IdleDetector:
    det = IdleDetector(window_s=WINDOW, threshold_pct=threshold, max_gap_s=GAP)
    for t, util in series:
        det.observe("gpu0", util, t)
    return det


def every_5s(start: float, end: float, util: float | None) -> list[tuple[float, float | None]]:
    return [(float(t), util) for t in range(int(start), int(end) + 1, 5)]


def test_idle_after_exactly_the_window_of_idle_readings() -> None:
    det = run(every_5s(1000, 1595, 0.0))
    s = det.status("gpu0", 1595)
    assert (s.state, s.idle_since, s.idle_for_s) == (IdleState.IDLING, 1000, 595)
    det.observe("gpu0", 0.0, 1600)
    s = det.status("gpu0", 1600)
    assert (s.state, s.idle_since, s.idle_for_s, s.is_idle) == (IdleState.IDLE, 1000, 600, True)


def test_a_busy_reading_ends_the_streak_and_the_next_idle_one_starts_anew() -> None:
    det = run([*every_5s(0, 500, 0.0), (505, 3.0), *every_5s(510, 1000, 0.0)])
    s = det.status("gpu0", 1000)
    assert (s.state, s.idle_since) == (IdleState.IDLING, 510)
    assert det.status("gpu0", 1110).state is IdleState.UNKNOWN  # stale: no reading for 110 s
    det.observe("gpu0", 0.0, 1110)
    assert det.status("gpu0", 1110).idle_since == 1110  # a gap restarts, it does not bridge


def test_unknown_reading_is_never_idle_and_ends_the_streak_loudly(caplog: pytest.LogCaptureFixture) -> None:
    det = run(every_5s(0, 700, 0.0))
    assert det.is_idle("gpu0", 700)
    with caplog.at_level(logging.INFO, logger="controller.core.detectors"):
        caplog.clear()
        det.observe("gpu0", 0.0, 702)  # no change of state: no line
        s = det.observe("gpu0", None, 705)
    assert (s.state, s.idle_since, s.reason) == (IdleState.UNKNOWN, None, "unknown reading")
    (record,) = caplog.records
    assert record.getMessage() == "idle-state"
    fields = record.kv  # type: ignore[attr-defined]
    assert (fields["previous"], fields["state"], fields["reason"]) == ("idle", "unknown", "unknown reading")
    s = det.observe("gpu0", 0.0, 710)
    assert (s.state, s.idle_since, s.reason) == (IdleState.IDLING, 710, "idle reading started a streak")


def test_only_unknown_readings_are_unknown_forever() -> None:
    det = run(every_5s(0, 2000, None))
    s = det.status("gpu0", 2000)
    assert (s.state, s.idle_for_s, s.utilization_pct) == (IdleState.UNKNOWN, 0.0, None)


@pytest.mark.parametrize(
    ("threshold", "util", "state"),
    [
        (0.0, 0.0, IdleState.IDLE),
        (0.0, 0.01, IdleState.BUSY),
        (1.0, 1.0, IdleState.IDLE),  # at the threshold counts as idle
        (1.0, 0.5, IdleState.IDLE),
        (1.0, 1.01, IdleState.BUSY),
        (100.0, 100.0, IdleState.IDLE),
    ],
)
def test_threshold_is_inclusive(threshold: float, util: float, state: IdleState) -> None:
    det = run(every_5s(0, 600, util), threshold=threshold)
    assert det.status("gpu0", 600).state is state


def test_one_lost_scrape_is_tolerated_two_minutes_are_not() -> None:
    series = [(0.0, 0.0), (5.0, 0.0), (15.0, 0.0)]  # 10 s gap <= 12 s
    assert run(series).status("gpu0", 15).idle_since == 0
    det = run([(0.0, 0.0), (5.0, 0.0), (20.0, 0.0)])  # 15 s gap > 12 s
    s = det.status("gpu0", 20)
    assert (s.idle_since, s.reason) == (20, "idle reading after a gap; streak restarted")


def test_stale_last_reading_is_unknown_not_idle() -> None:
    det = run(every_5s(0, 700, 0.0))
    assert det.status("gpu0", 712).state is IdleState.IDLE
    s = det.status("gpu0", 713)
    assert s.state is IdleState.UNKNOWN and s.reason.startswith("no reading within max_gap_s")


def test_scrape_marks_missing_devices_unknown_and_keeps_workloads() -> None:
    det = IdleDetector(window_s=10, max_gap_s=GAP)
    pod = (Workload("ns", "owner-0", "main"),)
    a = DeviceMetrics("nvidia", "A", utilization_pct=0.0, workloads=pod)
    b = DeviceMetrics("nvidia", "B", utilization_pct=0.0)
    for t in range(0, 15, 5):
        out = det.observe_scrape([a, b], float(t))
    assert out["A"].state is IdleState.IDLE and out["A"].workloads == pod
    assert out["B"].state is IdleState.IDLE and out["B"].workloads == ()  # unallocated, not wasted
    out = det.observe_scrape([a], 15.0)
    assert out["B"].state is IdleState.UNKNOWN and out["B"].reason == "device missing from the scrape"
    assert out["A"].is_idle


def test_a_failed_scrape_makes_every_device_unknown_with_the_error() -> None:
    det = IdleDetector(window_s=10, max_gap_s=GAP)
    det.observe_scrape([DeviceMetrics("amd", "A", utilization_pct=0.0)], 0.0)
    out = det.observe_failure(5.0, "HTTP 500")
    assert out["A"].state is IdleState.UNKNOWN and out["A"].reason == "scrape failed: HTTP 500"


def test_an_older_reading_is_ignored_and_says_so() -> None:
    det = run(every_5s(0, 100, 0.0))
    s = det.observe("gpu0", 90.0, 50)
    assert s.idle_since == 0 and s.reason.startswith("reading older than the last one ignored")
    assert det.status("gpu0", 100).state is IdleState.IDLING


def test_tracks_survive_a_restart_within_the_gap_and_not_beyond() -> None:
    det = run(every_5s(0, 590, 0.0))
    saved = det.tracks()
    assert saved["gpu0"] == DeviceTrack(590, IdleState.IDLING, 0, "idle reading", 0.0, ())
    again = IdleDetector(window_s=WINDOW, max_gap_s=GAP, tracks=saved)
    again.observe("gpu0", 0.0, 600)
    assert again.is_idle("gpu0", 600)
    late = IdleDetector(window_s=WINDOW, max_gap_s=GAP, tracks=saved)
    late.observe("gpu0", 0.0, 700)
    assert late.status("gpu0", 700).idle_since == 700


def test_forget_and_never_seen() -> None:
    det = run(every_5s(0, 10, 0.0))
    det.forget("gpu0")
    s = det.status("gpu0", 10)
    assert (s.state, s.reason, s.last_reading_at) == (IdleState.UNKNOWN, "no reading yet", None)
    assert det.statuses(10) == {}


def test_from_config() -> None:
    cfg = Config(
        idle_window_s=90, idle_threshold_pct=2, metrics=MetricsConfig(scrape_interval_s=10, scrape_timeout_s=3)
    )
    det = IdleDetector.from_config(cfg)
    assert (det.window_s, det.threshold_pct, det.max_gap_s) == (90, 2, 23)
    assert IdleDetector.from_config(Config()).window_s == 600  # design §6 default: 10 min


def test_bad_parameters_are_one_config_error_listing_each() -> None:
    with pytest.raises(ConfigError) as err:
        IdleDetector(window_s=0, threshold_pct=101, max_gap_s=-1)
    assert len(err.value.problems) == 3
    assert "idleWindow" in err.value.problems[0] and "(got 0)" in err.value.problems[0]


# ---- against a brute-force reference ------------------------------------------------------------

readings = st.lists(
    st.tuples(st.floats(min_value=0.5, max_value=40), st.sampled_from([None, 0.0, 0.5, 1.0, 30.0])),
    min_size=1,
    max_size=80,
)


def reference_idle_since(series: list[tuple[float, float | None]], threshold: float) -> float | None:
    """The earliest time s such that every reading from s to the last is idle with gaps <= GAP."""
    since = None
    previous = None
    for t, util in series:
        if util is None or util > threshold:
            since = None
        elif since is None or previous is None or t - previous > GAP:
            since = t
        previous = t
    return since


@settings(max_examples=300, deadline=None)
@given(steps=readings, query_delay=st.floats(min_value=0, max_value=30))
def test_matches_the_reference_on_random_series(steps: list[tuple[float, float | None]], query_delay: float) -> None:
    series = []
    t = 0.0
    for dt, util in steps:
        t += dt
        series.append((t, util))
    det = IdleDetector(window_s=60, threshold_pct=0.5, max_gap_s=GAP)
    for when, util in series:
        det.observe("d", util, when)
    now = series[-1][0] + query_delay
    status = det.status("d", now)
    since = reference_idle_since(series, 0.5)
    # The age as the detector computes it: `query_delay` itself can differ from it in the last bit.
    fresh = now - series[-1][0] <= GAP
    expect_idle = fresh and since is not None and now - since >= 60
    assert status.is_idle == expect_idle
    if fresh and since is not None:
        assert status.idle_since == since
    if series[-1][1] is None or not fresh:
        assert status.state is IdleState.UNKNOWN
