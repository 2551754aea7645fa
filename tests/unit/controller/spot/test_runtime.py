"""controller.spot.runtime: modes and status, the killer and reaper on real cgroups, the pidns cache."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from controller.core.actions import REASON_OWNER_BACK, KillContainers, KmodCommand
from controller.core.pod_facts import PodRef
from controller.metrics.exposition import render_text
from controller.metrics.fake_exporter import FakeGpu, write_dcgm
from controller.spot.cgroups import CgroupIndex
from controller.spot.killer import CgroupKiller
from controller.spot.kmod_bridge import KmodBridge
from controller.spot.runtime import SpotRuntime
from tests.integration.spot.trees import CgroupTrees, skip_reason
from tests.unit.controller.spot.spotfakes import RecordingClient, absent, watcher_on


def test_runtime_without_module_or_attribution_says_nothing_is_lent(tmp_path: Path) -> None:
    prom = tmp_path / "dcgm.prom"
    write_dcgm(prom, [FakeGpu("g", 0.0)])
    watcher, _, _ = watcher_on(prom)
    rt = SpotRuntime(watcher, KmodBridge(client_factory=absent), CgroupKiller())
    rt.bridge.start()
    assert rt.mode() == "utilization alone (gpukmod not loaded)"
    watcher.is_process_level = False
    assert rt.status()["mode"].startswith("no return signal")
    assert "gpushare_spot_kmod_available 0.0" in render_text(rt.counters).splitlines()


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
        exposition = render_text(rt.counters).splitlines()
        assert 'gpushare_spot_kills_total{reason="OwnerBack"} 1.0' in exposition
        assert 'gpushare_spot_return_seconds_bucket{le="0.025"} 0.0' in exposition
        assert 'gpushare_spot_return_seconds_bucket{le="0.05"} 1.0' in exposition
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
