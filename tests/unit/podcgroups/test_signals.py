"""podcgroups.signals against real processes in real cgroups v1 (root)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from podcgroups.cgroups import CGROUP_ROOT, ContainerCgroup
from podcgroups.errors import KillTimeout
from podcgroups.signals import ExitBoost, kill_cgroups
from tests.integration.spot.trees import CgroupTrees, skip_reason

needs_cgroups = pytest.mark.skipif(bool(skip_reason()), reason=skip_reason() or "ok")


def _cpu_cgroup(pid: int) -> str | None:
    """The path of ``pid`` in the cpu hierarchy, from ``/proc/<pid>/cgroup`` (``2:cpu,cpuacct:/path``)."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return path
    return None


def test_kill_of_a_gone_cgroup_is_a_no_op(tmp_path: Path) -> None:
    report = kill_cgroups([ContainerCgroup("gone", "/nothing/here", str(tmp_path))])
    assert report.signalled == 0 and report.rounds == 1


@needs_cgroups
@pytest.mark.parametrize("count", [1, 4, 16])
@pytest.mark.parametrize("use_freezer", [True, False], ids=["freezer", "repeat"])
def test_kill_real_trees_leaves_every_cgroup_empty(count: int, use_freezer: bool) -> None:
    with CgroupTrees(count, children=3, forker=True) as trees:
        before = trees.all_pids()
        assert len(before) >= count * 4
        report = kill_cgroups(trees.cgroups, use_freezer=use_freezer, timeout_s=5.0)
        # Dead right when kill_cgroups returns: no task listed, none of the old pids runs.
        assert trees.all_pids() == []
        for pid in before:
            assert not Path(f"/proc/{pid}/status").exists() or "State:\tZ" in Path(f"/proc/{pid}/status").read_text()
        assert report.frozen is use_freezer
        assert report.signalled >= len(before) - count  # the forker may have lost a short-lived child
        assert trees.reap() == [-9] * count
        for cg in trees.cgroups:
            state = cg.dir("freezer") / "freezer.state"
            assert state.read_text().strip() == "THAWED"


@needs_cgroups
def test_stuck_task_raises_kill_timeout_naming_it() -> None:
    # A task that stays FROZEN in another (parent) freezer cannot die: stand-in for D state.
    with CgroupTrees(1, children=1, forker=False) as trees:
        parent = Path(trees.cgroups[0].dir("freezer")).parent / "freezer.state"
        parent.write_text("FROZEN")
        try:
            with pytest.raises(KillTimeout, match="survived SIGKILL"):
                kill_cgroups(trees.cgroups, timeout_s=0.2, freeze_timeout_s=0.05)
        finally:
            parent.write_text("THAWED")
        deadline = time.monotonic() + 5
        while trees.all_pids() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert trees.all_pids() == []  # the pending SIGKILL lands once thawed


@needs_cgroups
def test_exit_boost_moves_tasks_into_the_high_weight_cpu_cgroup() -> None:
    boost = ExitBoost()
    with CgroupTrees(1, children=1, forker=False) as trees:
        pids = trees.all_pids()
        assert boost.move([*pids, 999_999_999]) == len(pids)  # a pid that does not exist is skipped
        for pid in pids:
            assert _cpu_cgroup(pid) == f"/{ExitBoost.NAME}"
        # The task hierarchies that decide "dead" are untouched by the move.
        assert sorted(trees.cgroups[0].pids()) == sorted(pids)
        shares = Path(CGROUP_ROOT, "cpu", ExitBoost.NAME, "cpu.shares").read_text().strip()
        assert shares == str(ExitBoost.MAX_SHARES)


def test_exit_boost_without_a_cpu_hierarchy_does_nothing(tmp_path: Path) -> None:
    assert ExitBoost(cgroup_root=str(tmp_path)).move([os.getpid()]) == 0
