"""controller.spot.procs against real processes in real cgroups v1 (root), plus its parsers."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from controller.errors import KillTimeout, ProcessError
from controller.spot.procs import (
    CGROUP_ROOT,
    CgroupIndex,
    ContainerCgroup,
    ExitBoost,
    cgroup_of_pid,
    kill_cgroups,
    parse_proc_cgroup,
    pidns_inode,
)
from tests.integration.spot.trees import CgroupTrees, skip_reason

needs_cgroups = pytest.mark.skipif(bool(skip_reason()), reason=skip_reason() or "ok")


def test_parse_proc_cgroup_v1_and_unified_lines() -> None:
    text = "12:freezer:/kubepods/pod1/abc\n2:cpu,cpuacct:/k/y\n1:name=systemd:/s\n0::/u\ngarbage\n"
    assert parse_proc_cgroup(text) == {
        "freezer": "/kubepods/pod1/abc",
        "cpu": "/k/y",
        "cpuacct": "/k/y",
        "systemd": "/s",
        "": "/u",
    }


def test_pidns_inode_of_self_matches_stat_and_gone_pid_is_named() -> None:
    assert pidns_inode(os.getpid()) == os.stat("/proc/self/ns/pid").st_ino
    p = subprocess.Popen(["true"])
    p.wait()
    with pytest.raises(ProcessError, match=rf"/proc/{p.pid}/ns/pid does not exist"):
        pidns_inode(p.pid)


def test_cgroup_of_pid_without_v1_lines_is_refused(tmp_path: Path) -> None:
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "cgroup").write_text("0::/only-v2\n")
    with pytest.raises(ProcessError, match="spot needs cgroups v1"):
        cgroup_of_pid(7, proc_root=str(tmp_path))


def test_index_finds_cgroupfs_and_systemd_names(tmp_path: Path) -> None:
    for rel in ("freezer/kubepods/besteffort/podu1/abc123", "freezer/k/cri-containerd-def456.scope", "freezer/k/x"):
        (tmp_path / rel).mkdir(parents=True)
    idx = CgroupIndex(cgroup_root=str(tmp_path), hierarchy="freezer")
    found = idx.locate(["abc123", "def456", "nope", ""])
    assert {k: v.rel_path for k, v in found.items()} == {
        "abc123": "/kubepods/besteffort/podu1/abc123",
        "def456": "/k/cri-containerd-def456.scope",
    }
    # A vanished cgroup is looked up again, not served from the cache.
    (tmp_path / "freezer/kubepods/besteffort/podu1/abc123").rmdir()
    assert idx.locate(["abc123"]) == {}


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
def test_first_pid_is_the_tree_root_and_index_finds_the_tree() -> None:
    with CgroupTrees(2, children=2, forker=False) as trees:
        roots = [p.pid for p in trees.procs]
        assert [cg.first_pid() for cg in trees.cgroups] == roots
        assert cgroup_of_pid(roots[1]).rel_path == trees.cgroups[1].rel_path
        # Walking the real hierarchy finds a cgroup by its (unique) leaf name, as for a container ID.
        unique = trees.base.lstrip("/")
        found = CgroupIndex().locate([unique])
        assert found[unique].rel_path == trees.base
        assert found[unique].dir("pids").is_dir()


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
            assert parse_proc_cgroup(Path(f"/proc/{pid}/cgroup").read_text())["cpu"] == f"/{ExitBoost.NAME}"
        # The task hierarchies that decide "dead" are untouched by the move.
        assert sorted(trees.cgroups[0].pids()) == sorted(pids)
        shares = Path(CGROUP_ROOT, "cpu", ExitBoost.NAME, "cpu.shares").read_text().strip()
        assert shares == str(ExitBoost.MAX_SHARES)


def test_exit_boost_without_a_cpu_hierarchy_does_nothing(tmp_path: Path) -> None:
    assert ExitBoost(cgroup_root=str(tmp_path)).move([os.getpid()]) == 0
