"""controller.spot.utilization: the watcher through the real file scrape path and adapter."""

from __future__ import annotations

import threading
from pathlib import Path

from controller.metrics.fake_exporter import FakeGpu, write_dcgm
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
