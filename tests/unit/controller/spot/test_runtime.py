"""controller.spot.runtime and controller.metrics.fake_exporter: the kmod bridge against a recording client,
the utilization watcher through the real file scrape path, the killer on real cgroups."""

from __future__ import annotations

import errno
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from controller.core.actions import REASON_OWNER_BACK, KillContainers, KmodCommand
from controller.core.detectors import IdleDetector
from controller.core.model import PodRef
from controller.metrics.fake_exporter import FakeGpu, parse_fake_gpu, render_dcgm, write_dcgm
from controller.metrics.scrape import Scraper
from controller.spot.procs import CgroupIndex
from controller.spot.runtime import CgroupKiller, KmodBridge, SpotRuntime, UtilizationWatcher
from gpukmod import KmodError
from tests.integration.spot.trees import CgroupTrees, skip_reason


class RecordingClient:
    """Stands in for gpukmod.KmodClient: records commands, fails the ones told to."""

    def __init__(self, fail: dict[str, int] | None = None) -> None:
        self.calls: list[tuple[str, int]] = []
        self.fail = fail or {}
        self.callback: Callable[[int], None] | None = None
        self.closed = False
        self.registered = False

    def register(self) -> None:
        self.registered = True

    def _cmd(self, op: str, ids: tuple[int, ...]) -> None:
        if op in self.fail:
            raise KmodError(self.fail[op], op, f"ids {list(ids)}")
        self.calls.extend((op, i) for i in ids)

    def add(self, *ids: int) -> None:
        self._cmd("add", ids)

    def delete(self, *ids: int) -> None:
        self._cmd("delete", ids)

    def detect(self, *ids: int) -> None:
        self._cmd("detect", ids)

    def undetect(self, *ids: int) -> None:
        self._cmd("undetect", ids)

    def release(self, *ids: int) -> None:
        self._cmd("release", ids)

    def start_notices(self, callback: Callable[[int], None], *, name: str = "") -> None:
        self.callback = callback

    def close(self) -> None:
        self.closed = True


def absent(unit: int) -> RecordingClient:
    raise KmodError(errno.EPROTONOSUPPORT, "open")


def test_bridge_registers_applies_commands_and_keeps_the_view() -> None:
    client = RecordingClient()
    wakes: list[int] = []
    bridge = KmodBridge(client_factory=lambda unit: client, wake=lambda: wakes.append(1))
    assert bridge.start() and client.registered
    for op, ino in [("add", 1), ("detect", 2), ("add", 3), ("undetect", 2), ("detect", 3), ("delete", 1)]:
        bridge.apply(KmodCommand(op, ino))  # type: ignore[arg-type]
    view = bridge.view()
    assert view.available and view.added == {2, 3} and view.detecting == {3}
    assert client.calls[-1] == ("delete", 1)
    # A notice arrives on the reader thread: queued with its time, the loop woken.
    assert client.callback is not None
    client.callback(3)
    drained = bridge.drain()
    assert [p for p, _ in drained] == [3] and wakes == [1] and bridge.drain() == []
    bridge.apply(KmodCommand("release", 3))
    assert bridge.view().detecting == frozenset()  # release disarms until the next detect
    bridge.close()
    assert client.closed and not bridge.available


def test_bridge_without_module_reports_utilization_alone_and_retries_later() -> None:
    now = [0.0]
    tries: list[int] = []

    def factory(unit: int) -> RecordingClient:
        tries.append(unit)
        raise KmodError(errno.EPROTONOSUPPORT, "open")

    bridge = KmodBridge(unit=29, client_factory=factory, clock=lambda: now[0], retry_s=30.0)
    assert not bridge.start()
    assert "not loaded; spot works on utilization alone" in bridge.reason
    assert bridge.view() == bridge.view() and not bridge.view().available
    assert tries == [29]  # no retry before retry_s
    bridge.apply(KmodCommand("detect", 5))  # nothing to keep in step: a no-op, not an error
    now[0] = 31.0
    bridge.view()
    assert tries == [29, 29]


def test_bridge_treats_enoent_on_undo_commands_as_done_but_raises_others() -> None:
    client = RecordingClient(fail={"undetect": errno.ENOENT, "add": errno.ENOSPC})
    bridge = KmodBridge(client_factory=lambda unit: client)
    bridge.start()
    bridge.apply(KmodCommand("undetect", 7))
    with pytest.raises(KmodError) as info:
        bridge.apply(KmodCommand("add", 8))
    assert info.value.errno == errno.ENOSPC and bridge.view().added == frozenset()
    bridge.close()


def test_bridge_drops_a_vanished_module() -> None:
    client = RecordingClient(fail={"detect": errno.ECONNREFUSED})
    bridge = KmodBridge(client_factory=lambda unit: client)
    bridge.start()
    with pytest.raises(KmodError):
        bridge.apply(KmodCommand("detect", 9))
    assert not bridge.available and client.closed and "unusable" in bridge.reason


def test_fake_gpu_spec_parsing_and_bad_input() -> None:
    assert parse_fake_gpu("fakegpu0=0") == FakeGpu("fakegpu0", 0.0)
    assert parse_fake_gpu("g=80@team/dev,spot/j/main") == FakeGpu("g", 80.0, ("team/dev", "spot/j/main"))
    assert parse_fake_gpu("g=unknown").utilization_pct is None
    with pytest.raises(ValueError, match="expected ID=UTIL"):
        parse_fake_gpu("fakegpu0")
    with pytest.raises(ValueError, match="not a number"):
        parse_fake_gpu("g=lots")
    with pytest.raises(ValueError, match=r"within 0\.\.100"):
        parse_fake_gpu("g=101")
    with pytest.raises(ValueError, match="not ns/pod"):
        parse_fake_gpu("g=1@justpod")
    assert 'UUID="g"' in render_dcgm([FakeGpu("g", 1.0)])


def watcher_on(path: Path, *, window_s: float = 10.0) -> tuple[UtilizationWatcher, list[int], list[float]]:
    wall = [1000.0]
    wakes: list[int] = []
    watcher = UtilizationWatcher(
        Scraper(str(path)),
        IdleDetector(window_s=window_s, threshold_pct=0.0, max_gap_s=30.0),
        interval_s=1.0,
        is_process_level=True,
        wake=lambda: wakes.append(1),
        clock=lambda: wall[0],
    )
    return watcher, wakes, wall


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


def test_runtime_without_module_or_attribution_says_nothing_is_lent(tmp_path: Path) -> None:
    prom = tmp_path / "dcgm.prom"
    write_dcgm(prom, [FakeGpu("g", 0.0)])
    watcher, _, _ = watcher_on(prom)
    rt = SpotRuntime(watcher, KmodBridge(client_factory=absent), CgroupKiller())
    rt.bridge.start()
    assert rt.mode() == "utilization alone (gpukmod not loaded)"
    watcher.is_process_level = False
    assert rt.status()["mode"].startswith("no return signal")
    assert "gpushare_spot_kmod_available 0" in rt.metrics_lines()


@pytest.mark.skipif(bool(skip_reason()), reason=skip_reason() or "ok")
def test_runtime_killer_kills_real_trees_and_observes_return_to_dead(tmp_path: Path) -> None:
    clock = [100.0]
    with CgroupTrees(4, children=2) as trees:
        # Cgroup names stand for container IDs; the index finds them under the trees' base only.
        index = CgroupIndex()
        rt = SpotRuntime(None, KmodBridge(client_factory=absent), CgroupKiller(index=index), monotonic=lambda: clock[0])
        ids = [cg.container_id for cg in trees.cgroups]
        index._cache.update({cg.container_id: cg for cg in trees.cgroups})
        client = RecordingClient()
        rt.bridge = KmodBridge(client_factory=lambda unit: client, clock=lambda: 99.95)
        rt.bridge.start()
        assert client.callback is not None
        client.callback(4242)
        assert rt.notices() == [4242]
        assert rt.pidns_of(ids[0]) is not None
        rt.killer(KillContainers(PodRef("spot", "job", "u1"), tuple(ids), REASON_OWNER_BACK))
        # The killer only signals; release waits for the reaper to see every cgroup empty.
        rt.kmod(KmodCommand("release", 4242))
        assert trees.all_pids() == []
        assert client.calls == [("release", 4242)]
        assert [pod for pod, _ in rt.dead] == ["spot/job"]
        # The plan kills a terminating pod again each pass: counted once.
        rt.killer(KillContainers(PodRef("spot", "job", "u1"), tuple(ids), REASON_OWNER_BACK))
        assert rt.wait_dead(5)
        assert rt.counters.kills == {REASON_OWNER_BACK: 1}
        assert rt.counters.total == 1 and rt.last_return["return_to_dead_ms"] == pytest.approx(50.0)
        assert 'gpushare_spot_kills_total{reason="OwnerBack"} 1' in rt.metrics_lines()
        assert 'gpushare_spot_return_seconds_bucket{le="0.025"} 0' in rt.metrics_lines()
        assert 'gpushare_spot_return_seconds_bucket{le="0.05"} 1' in rt.metrics_lines()
        rt.close()


def test_pidns_of_a_missing_container_is_not_looked_for_every_pass(tmp_path: Path) -> None:
    (tmp_path / "freezer").mkdir()
    clock = [0.0]
    index = CgroupIndex(cgroup_root=str(tmp_path), hierarchy="freezer")
    rt = SpotRuntime(None, KmodBridge(client_factory=absent), CgroupKiller(index=index), monotonic=lambda: clock[0])
    assert rt.pidns_of("abc") is None
    (tmp_path / "freezer" / "abc").mkdir()  # appears, but empty: no first process yet
    (tmp_path / "freezer" / "abc" / "cgroup.procs").write_text("")
    clock[0] = 1.0
    assert rt.pidns_of("abc") is None and "abc" not in index._cache  # within the pause: no walk
    clock[0] = 6.0
    assert rt.pidns_of("abc") is None and "abc" in index._cache  # looked for again, found, no task


def test_a_borrower_that_outlives_the_bound_is_logged_and_the_owner_still_released(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A cgroup whose task list never empties (a static file naming a child we really kill):
    # stands in for a task stuck in D state.
    child = subprocess.Popen(["sleep", "30"])
    (tmp_path / "freezer" / "stuck").mkdir(parents=True)
    (tmp_path / "freezer" / "stuck" / "cgroup.procs").write_text(f"{child.pid}\n")
    index = CgroupIndex(cgroup_root=str(tmp_path), hierarchy="freezer")
    client = RecordingClient()
    rt = SpotRuntime(None, KmodBridge(client_factory=lambda unit: client), CgroupKiller(index=index, timeout_s=0.1))
    rt.bridge.start()
    try:
        rt.killer(KillContainers(PodRef("spot", "stuck", "u2"), ("stuck",), REASON_OWNER_BACK))
        rt.kmod(KmodCommand("release", 77))  # waits for the reaper, which gives up after 0.1 s
        assert client.calls == [("release", 77)]
        assert "survived SIGKILL" in caplog.text and "spot/stuck" not in [p for p, _ in rt.dead]
        assert child.wait(5) == -9  # the signal itself went out
    finally:
        child.kill()
        child.wait()
        rt.close()
