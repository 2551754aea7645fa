"""controller.spot.runtime: the return path on the notice thread, kills off the pass, what is counted.

The host's cgroups are recording functions (spotfakes.FakeHost) except in the last test, which
kills real process trees in a kubepods-shaped cgroup v1 tree through the real PodKiller.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from controller.core.actions import REASON_OWNER_BACK, REASON_OWNER_LEFT, KillPods, KmodCommand, PodToKill
from controller.core.pod_facts import PodRef
from controller.metrics.exposition import render_text
from controller.spot.killer import PodKiller
from controller.spot.kmod_bridge import KmodBridge
from controller.spot.runtime import SpotRuntime
from controller.spot.solver import ReturnTarget
from gpumetrics.fake_exporter import FakeGpu, write_dcgm
from podcgroups.cgroups import CgroupDriver, CgroupIndex, CgroupVersion, detect_layout
from tests.unit.controller.spot.spotfakes import FakeHost, RecordingClient, absent, kill_report, watcher_on
from tests.unit.podcgroups import podtrees

A = PodRef("spot", "a", "uid-a")
B = PodRef("spot", "b", "uid-b")
PIDNS = 4242
KILL = KillPods((PodToKill(A, 1), PodToKill(B, 2)), REASON_OWNER_BACK)
TARGET = ReturnTarget(PIDNS, "team/owner/app", ("GPU-0", "GPU-1"), KILL)


class World:
    """A runtime on a recording kernel client and fake cgroups; ``events`` in the order they happened."""

    def __init__(self, host: FakeHost | None = None) -> None:
        self.host = host or FakeHost()
        self.events: list[tuple[str, object]] = []
        self.host.on_kill = lambda: self.events.append(("kill", self.host.killed[-1]))
        self.client = RecordingClient()
        self.clock = [100.0]
        killer = PodKiller(
            detect=self.host.detect, find=self.host.find, kill=self.host.kill, monotonic=lambda: self.clock[0]
        )
        wake = lambda: self.events.append(("wake", None))  # noqa: E731
        bridge = KmodBridge(client_factory=lambda unit: self.client, clock=lambda: 99.95, wake=wake)
        self.rt = SpotRuntime(None, bridge, killer, monotonic=lambda: self.clock[0], pidns_index=CgroupIndex())
        self.rt.spot_health_target = lambda rid, ok: self.events.append(("health", (rid, ok)))
        self.client.release = self._release  # type: ignore[method-assign]
        self.rt.bridge.start()

    def _release(self, *ids: int) -> None:
        self.events.append(("release", (ids, len(self.rt.bridge._notices))))
        self.client.calls.extend(("release", i) for i in ids)

    def notice(self, pidns: int = PIDNS) -> None:
        assert self.client.callback is not None
        self.client.callback(pidns)
        assert self.rt.wait_dead(5)  # the return runs on a thread of its own

    def metrics(self) -> list[str]:
        return render_text(self.rt.counters).splitlines()


def test_runtime_without_module_or_attribution_says_nothing_is_lent(tmp_path: Path) -> None:
    prom = tmp_path / "dcgm.prom"
    write_dcgm(prom, [FakeGpu("g", 0.0)])
    watcher, _, _ = watcher_on(prom)
    host = FakeHost()
    rt = SpotRuntime(watcher, KmodBridge(client_factory=absent), PodKiller(detect=host.detect))
    rt.bridge.start()
    assert rt.mode() == "utilization alone (gpukmod not loaded)"
    watcher.is_process_level = False
    assert rt.status()["mode"].startswith("no return signal")
    assert "gpushare_spot_kmod_available 0.0" in render_text(rt.counters).splitlines()


def test_a_notice_kills_the_armed_borrowers_and_releases_the_owner_before_any_pass() -> None:
    w = World()
    w.rt.arm({PIDNS: TARGET})
    assert w.host.found == ["uid-a", "uid-b"]  # located when armed, not on the return
    w.notice()
    # Devices closed, borrowers killed together, the notice queued, then the owner released.
    assert w.events == [
        ("health", ("GPU-0", False)),
        ("health", ("GPU-1", False)),
        ("kill", ("uid-a", "uid-b")),
        ("release", ((PIDNS,), 1)),
        ("wake", None),
    ]
    assert w.rt.notices() == [PIDNS]  # the pass still sees the return: evictions, Events, undetect
    counters = w.rt.counters
    assert counters.kills == {REASON_OWNER_BACK: 2} and counters.total == 1
    assert w.rt.last_return["return_to_dead_ms"] == pytest.approx(54.0)  # 99.95 -> 100.0 + 4 ms kill
    assert w.rt.last_return["release_ms"] == pytest.approx(50.0) and w.rt.last_return["pods"] == ["spot/a", "spot/b"]
    assert [pod for pod, _ in w.rt.dead] == ["spot/a", "spot/b"]
    lines = w.metrics()
    assert 'gpushare_spot_kills_total{reason="OwnerBack"} 2.0' in lines
    assert "gpushare_spot_return_seconds_count 1.0" in lines and "gpushare_spot_release_seconds_count 1.0" in lines
    # The pass that follows kills the same pods again (a restarted container): counted once, no second return.
    w.rt.notices()
    w.rt.killer(KILL)
    w.rt.kmod(KmodCommand("release", PIDNS))  # waits for that kill, then a no-op release
    assert counters.kills == {REASON_OWNER_BACK: 2} and counters.total == 1
    assert w.host.killed == [("uid-a", "uid-b")] * 2


def test_a_kill_that_signals_nothing_is_an_error_not_a_fast_return(caplog: pytest.LogCaptureFixture) -> None:
    w = World(FakeHost(report=kill_report(0)))
    w.rt.arm({PIDNS: TARGET})
    with caplog.at_level("ERROR"):
        w.notice()
    assert ("release", ((PIDNS,), 1)) in w.events  # the owner is never left held
    assert w.rt.counters.kill_errors == {"no_tasks": 1} and w.rt.counters.total == 0
    assert "signalled no task although kubelet reports containers running" in caplog.text
    assert w.rt.last_return["error"].startswith("no_tasks") and "return_to_dead_ms" not in w.rt.last_return
    lines = w.metrics()
    assert 'gpushare_spot_kill_errors_total{reason="no_tasks"} 1.0' in lines
    assert "gpushare_spot_return_seconds_count 0.0" in lines and "gpushare_spot_release_seconds_count 1.0" in lines
    assert w.rt.status()["kill_errors"] == {"no_tasks": 1}


def test_past_the_kill_bound_the_owner_is_released_and_that_is_counted_apart() -> None:
    w = World(FakeHost(report=kill_report(6, took_s=2.0, remaining=(77,))))
    w.rt.arm({PIDNS: TARGET})
    w.notice()
    assert ("release", ((PIDNS,), 1)) in w.events
    assert w.rt.counters.bound_exceeded == 1 and w.rt.counters.total == 0 and not w.rt.counters.kill_errors
    assert w.rt.last_return["bound_exceeded"] is True and w.rt.status()["kill_bound_exceeded"] == 1
    assert "gpushare_spot_kill_bound_exceeded_total 1.0" in w.metrics()


def test_an_away_owner_is_released_at_once_and_an_unknown_notice_is_left_to_the_pass() -> None:
    w = World()
    w.rt.arm({PIDNS: ReturnTarget(PIDNS, "team/owner/app", ("GPU-0",), None)})
    w.notice()
    assert w.events == [("health", ("GPU-0", False)), ("release", ((PIDNS,), 1)), ("wake", None)]
    assert w.host.killed == [] and w.rt.last_return["borrowers"] == 0
    w.rt.notices()
    w.events.clear()
    w.notice(999)  # no entry: a stale watch or an owner armed since the last pass
    assert w.events == [("wake", None)] and w.rt.notices() == [999]


def test_a_pass_kill_runs_off_the_loop_and_release_waits_for_it() -> None:
    gate = threading.Event()
    w = World()
    w.host.on_kill = lambda: gate.wait(5)
    action = KillPods((PodToKill(A, 1),), REASON_OWNER_LEFT)
    started = time.monotonic()
    w.rt.killer(action)
    assert time.monotonic() - started < 0.5  # the loop thread did not wait for the kill
    releasing = threading.Thread(target=w.rt.kmod, args=(KmodCommand("release", PIDNS),))
    releasing.start()
    releasing.join(0.2)
    assert releasing.is_alive() and w.client.calls == []  # held until every kill in flight is over
    gate.set()
    releasing.join(5)
    assert w.client.calls == [("release", PIDNS)]
    assert w.rt.counters.kills == {REASON_OWNER_LEFT: 1} and w.rt.last_return == {}  # a reclaim, not a return


def test_a_utilization_return_is_timed_from_the_scrape_that_saw_it() -> None:
    w = World()
    w.rt.bridge.queue_notice(1, 99.9)  # any return signal of this pass fixes its time
    w.rt.notices()
    w.rt.killer(KILL)
    assert w.rt.wait_dead(5)
    assert w.rt.counters.total == 1 and w.rt.last_return["return_to_dead_ms"] == pytest.approx(104.0)
    assert "release_ms" not in w.rt.last_return


def test_lending_blocked_is_on_metrics_and_status() -> None:
    w = World(FakeHost(layout="no kubepods cgroup under /empty (cgroup v2): kubelet is not running"))
    assert w.rt.hooks().blocked() == w.host.layout
    assert w.rt.status()["lending_blocked"] == w.host.layout
    assert (
        'gpushare_spot_lending_blocked{reason="no kubepods cgroup under /empty (cgroup v2): kubelet is not '
        'running"} 1.0' in w.metrics()
    )
    w.host.layout = FakeHost().layout
    w.rt.pod_killer._next_check = 0.0
    assert w.rt.blocked() == "" and 'gpushare_spot_lending_blocked{reason=""} 0.0' in w.metrics()


def test_pidns_of_a_missing_container_is_not_looked_for_every_pass(tmp_path: Path) -> None:
    (tmp_path / "freezer").mkdir()
    clock = [0.0]
    index = CgroupIndex(cgroup_root=str(tmp_path), hierarchy="freezer")
    host = FakeHost()
    rt = SpotRuntime(None, KmodBridge(client_factory=absent), PodKiller(detect=host.detect), monotonic=lambda: clock[0])
    rt._pidns._index = index
    assert rt.pidns_of("abc") is None
    (tmp_path / "freezer" / "abc").mkdir()  # appears, but empty: no first process yet
    (tmp_path / "freezer" / "abc" / "cgroup.procs").write_text("")
    clock[0] = 1.0
    assert rt.pidns_of("abc") is None and "abc" not in index._cache  # within the pause: no walk
    clock[0] = 6.0
    assert rt.pidns_of("abc") is None and "abc" in index._cache  # looked for again, found, no task


@pytest.mark.parametrize("driver", [CgroupDriver.CGROUPFS, CgroupDriver.SYSTEMD])
@pytest.mark.parametrize("version", [CgroupVersion.V1, CgroupVersion.V2])
def test_a_notice_kills_real_borrower_pods_through_their_pod_cgroups(
    version: CgroupVersion, driver: CgroupDriver
) -> None:
    """The whole return path on real process trees (fork loops included) in kubelet-shaped cgroups."""
    if why := podtrees.skip_reason(version):
        pytest.skip(why)
    with podtrees.cgroup2_root() as v2_root, podtrees.RealPods(version, driver, 2, v2_root=v2_root) as pods:
        killer = PodKiller(
            cgroup_root=str(pods.cgroup_root),
            detect=lambda root: detect_layout(root, kubelet_root=pods.kubelet_root),
        )
        client = RecordingClient()
        rt = SpotRuntime(None, KmodBridge(client_factory=lambda unit: client), killer, pidns_index=CgroupIndex())
        rt.bridge.start()
        refs = [PodRef("spot", f"job{i}", uid) for i, uid in enumerate(pods.uids)]
        kill = KillPods(tuple(PodToKill(ref, 2) for ref in refs), REASON_OWNER_BACK)
        rt.arm({PIDNS: ReturnTarget(PIDNS, "team/owner/app", ("GPU-0",), kill)})
        before = pods.all_pids()
        assert len(before) >= 2 * 2 * 4
        left_at_release: list[list[int]] = []
        release = client.release

        def release_and_look(*ids: int) -> None:
            left_at_release.append(pods.all_pids())
            release(*ids)

        client.release = release_and_look  # type: ignore[method-assign]
        assert client.callback is not None
        client.callback(PIDNS)
        assert rt.wait_dead(10)  # the return runs on a thread of its own
        # By the time the owner is released, no task of either pod is left.
        assert client.calls == [("release", PIDNS)] and left_at_release == [[]]
        assert pods.all_pids() == [] and all(code == -9 for code in pods.reap())
        assert rt.counters.total == 1 and not rt.counters.kill_errors and rt.counters.bound_exceeded == 0
        assert rt.last_return["signalled"] >= 2 * 2 * 4 and rt.last_return["pods"] == ["spot/job0", "spot/job1"]
        rt.close()
