"""controller.spot.cgroups: finding a container's cgroup by ID, in a fake tree and in real cgroups v1 (root)."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.spot.cgroups import CgroupIndex
from tests.integration.spot.trees import CgroupTrees, skip_reason

needs_cgroups = pytest.mark.skipif(bool(skip_reason()), reason=skip_reason() or "ok")


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


@needs_cgroups
def test_first_pid_is_the_tree_root_and_index_finds_the_tree() -> None:
    with CgroupTrees(2, children=2, forker=False) as trees:
        roots = [p.pid for p in trees.procs]
        assert [cg.first_pid() for cg in trees.cgroups] == roots
        # Walking the real hierarchy finds a cgroup by its (unique) leaf name, as for a container ID.
        unique = trees.base.lstrip("/")
        found = CgroupIndex().locate([unique])
        assert found[unique].rel_path == trees.base
        assert found[unique].dir("pids").is_dir()
