"""controller.spot.utilization: the watcher through the real file scrape path and adapter."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from controller.core.detectors import IdleDetector
from controller.errors import StateError
from controller.io.state import FILE_NAME, StateStore
from controller.spot.utilization import UtilizationWatcher
from gpumetrics.fake_exporter import FakeGpu, write_dcgm
from gpumetrics.scrape import Scraper
from tests.unit.controller.spot.spotfakes import watcher_on


def test_watcher_reads_the_fake_file_through_the_real_adapter(tmp_path: Path) -> None:
    prom = tmp_path / "dcgm.prom"
    write_dcgm(prom, [FakeGpu("fakegpu0", 0.0), FakeGpu("fakegpu1", 50.0, ("team/dev",))])
    watcher, wakes, wall = watcher_on(prom)
    watcher.scrape_once()
    assert wakes == [1]  # first states are a change
    wall[0] += 11
    write_dcgm(prom, [FakeGpu("fakegpu0", 0.0), FakeGpu("fakegpu1", 50.0, ("team/dev",))])
    watcher.scrape_once()
    assert wakes == [1, 1]  # idling -> idle is a change too: the loop may lend now
    verdicts = watcher.verdicts(wall[0])
    assert verdicts["fakegpu0"].state == "idle" and verdicts["fakegpu0"].idle_since == 1000.0
    assert verdicts["fakegpu1"].state == "active" and verdicts["fakegpu1"].users == frozenset({"team/dev"})
    assert len(watcher.take_busy_times()) == 1 and watcher.take_busy_times() == []
    # The owner of fakegpu0 returns: a busy reading is a state change -> wake + a signal time.
    write_dcgm(prom, [FakeGpu("fakegpu0", 30.0, ("team/owner",)), FakeGpu("fakegpu1", 50.0, ("team/dev",))])
    wall[0] += 1
    watcher.scrape_once()
    assert wakes == [1, 1, 1] and len(watcher.take_busy_times()) == 1
    assert watcher.verdicts(wall[0])["fakegpu0"].users == frozenset({"team/owner"})
    # The file disappears: unknown, never idle, and the error is kept for status.
    prom.unlink()
    wall[0] += 1
    watcher.scrape_once()
    assert watcher.verdicts(wall[0])["fakegpu0"].state == "unknown"
    assert "dcgm.prom" in watcher.last_error


def test_watcher_thread_is_named_and_stops(tmp_path: Path) -> None:
    prom = tmp_path / "dcgm.prom"
    write_dcgm(prom, [FakeGpu("g", 0.0)])
    watcher, wakes, _ = watcher_on(prom)
    stop = threading.Event()
    watcher.start(stop)
    assert watcher._thread is not None and watcher._thread.name == "gpushare-spot-scrape"
    stop.set()
    watcher.join(5)
    assert not watcher._thread.is_alive() and wakes


def watcher_with_state(prom: Path, state: Path, wall: list[float], wakes: list[int]) -> UtilizationWatcher:
    return UtilizationWatcher(
        Scraper(str(prom)),
        IdleDetector(window_s=10.0, threshold_pct=0.0, max_gap_s=5.0),
        interval_s=1.0,
        is_process_level=True,
        wake=lambda: wakes.append(1),
        clock=lambda: wall[0],
        state_dir=state,
    )


def test_idle_history_survives_a_restart_through_the_state_file(tmp_path: Path) -> None:
    prom, state = tmp_path / "dcgm.prom", tmp_path / "state"
    write_dcgm(prom, [FakeGpu("owner-gpu", 0.0), FakeGpu("lent-gpu", 70.0, ("spot/job",))])
    wall, wakes = [1000.0], list[int]()
    before = watcher_with_state(prom, state, wall, wakes)
    assert before.restore() == []  # a new state file: nothing to take back
    for _ in range(4):
        before.scrape_once()  # each scrape is saved
        wall[0] += 3
    expected = before.verdicts(wall[0])
    assert expected["owner-gpu"].state == "idle" and expected["owner-gpu"].idle_since == 1000.0
    before.take_busy_times()
    # kill -9: no close, no last save; the new agent starts 3 s after the last scrape.
    after_wakes: list[int] = []
    after = watcher_with_state(prom, state, wall, after_wakes)
    assert after.restore() == ["lent-gpu", "owner-gpu"]
    # Before any scrape: the same verdicts, not "metrics unknown".
    assert after.verdicts(wall[0]) == expected
    assert after.verdicts(wall[0])["lent-gpu"].users == frozenset({"spot/job"})
    after.scrape_once()
    # Nothing changed for the loop: no wake, and the lent GPU's busy reading is no new return signal.
    assert after_wakes == [] and after.take_busy_times() == []
    assert after.verdicts(wall[0])["owner-gpu"].idle_since == 1000.0  # the streak went on
    after.join()


def test_history_older_than_the_gap_is_not_used(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    prom, state = tmp_path / "dcgm.prom", tmp_path / "state"
    write_dcgm(prom, [FakeGpu("owner-gpu", 0.0)])
    wall, wakes = [1000.0], list[int]()
    before = watcher_with_state(prom, state, wall, wakes)
    before.restore()
    before.scrape_once()
    before.join()
    wall[0] += 60  # the agent was away a minute: the streak cannot be vouched for
    after = watcher_with_state(prom, state, wall, wakes)
    caplog.set_level(logging.INFO)
    assert after.restore() == []
    assert after.verdicts(wall[0]) == {}
    (line,) = [r for r in caplog.records if r.getMessage() == "spot: saved idle history not used"]
    fields = getattr(line, "kv", {})
    assert fields["device"] == "owner-gpu" and fields["reason"].startswith("no reading within max_gap_s (last 60s")
    after.scrape_once()
    assert after.verdicts(wall[0])["owner-gpu"].idle_since == wall[0]  # a fresh streak: a whole window again
    after.join()


def test_an_unusable_state_file_only_costs_the_history(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    prom, state = tmp_path / "dcgm.prom", tmp_path / "state"
    write_dcgm(prom, [FakeGpu("g", 0.0)])
    state.mkdir()
    (state / FILE_NAME).write_bytes(b"not sqlite" * 100)
    watcher = watcher_with_state(prom, state, [1000.0], [])
    assert watcher.restore() == []
    assert "idle history is not kept across restarts" in caplog.text and "move it away" in caplog.text
    assert watcher.scrape_once()["g"].state.value == "idling"  # spot still reads its metrics


def test_a_save_that_fails_is_logged_once_and_scraping_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    prom, state = tmp_path / "dcgm.prom", tmp_path / "state"
    write_dcgm(prom, [FakeGpu("g", 0.0)])
    wall = [1000.0]
    watcher = watcher_with_state(prom, state, wall, [])
    watcher.restore()

    def full(self: StateStore, records: object) -> None:
        raise StateError("gpushare: cannot write idle tracks to x (database or disk is full)")

    monkeypatch.setattr(StateStore, "save_idle_tracks", full)
    for _ in range(3):
        watcher.scrape_once()
        wall[0] += 1
    assert caplog.text.count("idle history not saved") == 1
    assert watcher.verdicts(wall[0])["g"].state == "idle"
    watcher.join()
