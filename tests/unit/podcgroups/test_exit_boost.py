"""ExitBoost against real processes in real cgroups v1 (root): killed tasks run their exit at once."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from podcgroups.cgroups import CGROUP_ROOT
from podcgroups.exit_boost import ExitBoost
from tests.integration.spot.trees import CgroupTrees, skip_reason

needs_cgroups = pytest.mark.skipif(bool(skip_reason()), reason=skip_reason() or "ok")


def _cpu_cgroup(pid: int) -> str | None:
    """The path of ``pid`` in the cpu hierarchy, from ``/proc/<pid>/cgroup`` (``2:cpu,cpuacct:/path``)."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return path
    return None


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
