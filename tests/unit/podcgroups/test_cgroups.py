"""podcgroups.cgroups: a pod's cgroup on recorded trees of both versions and drivers; a container's by ID.

The recorded trees are built in tmp dirs (no root needed); the real-v1 tests need root.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from podcgroups.cgroups import CgroupIndex, CgroupLayout, detect_layout, find_pod_cgroup, pod_cgroup_of_pid
from podcgroups.errors import ProcessError
from podcgroups.files import is_populated, read_pids
from podcgroups.paths import CgroupDriver, CgroupVersion, parse_pod_path, parse_proc_cgroup
from tests.integration.spot.trees import CgroupTrees, skip_reason
from tests.unit.podcgroups.cgroup_fixtures import (
    FIXTURES,
    RecordedTree,
    load_tree,
    materialize,
    proc_text,
    write_cgroup,
)

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


# --- pod cgroups on recorded trees (tests/fixtures/cgroups/trees), built in tmp dirs ---

TREES = {
    # name -> (version, driver, kubepods dirs relative to the layout root)
    "v1-cgroupfs-recorded.tsv": (CgroupVersion.V1, CgroupDriver.CGROUPFS, ["gs-kwnu26x_o/kubepods"]),
    "v2-cgroupfs-recorded.tsv": (CgroupVersion.V2, CgroupDriver.CGROUPFS, ["gs-kwnu26x_o/kubepods"]),
    "v1-systemd.tsv": (CgroupVersion.V1, CgroupDriver.SYSTEMD, ["kubepods.slice"]),
    "v2-systemd.tsv": (CgroupVersion.V2, CgroupDriver.SYSTEMD, ["kubepods.slice"]),
    "v2-cgroupfs.tsv": (CgroupVersion.V2, CgroupDriver.CGROUPFS, ["kubepods"]),
}


def _pods_in(tree: RecordedTree) -> dict[str, list[int]]:
    """Each pod of a recorded tree and every pid below its cgroup, read off the paths by the parser."""
    pods: dict[str, list[int]] = {}
    for path, pids in tree.cgroups.items():
        pod = parse_pod_path("/" + path)
        if pod is not None:
            pods.setdefault(pod.pod_uid, []).extend(pids)
    return {uid: sorted(pids) for uid, pids in pods.items()}


def _layout(tmp_path: Path, name: str, kubelet_root: str | None = None) -> CgroupLayout:
    tree = load_tree(name)
    found = detect_layout(materialize(tree, tmp_path / "cg"), kubelet_root=kubelet_root)
    assert isinstance(found, CgroupLayout), found
    return found


def test_every_recorded_tree_has_an_expectation() -> None:
    assert sorted(p.name for p in (FIXTURES / "trees").iterdir()) == sorted(TREES)


@pytest.mark.parametrize("name", sorted(TREES))
def test_recorded_tree_is_detected_and_every_pod_found_with_all_its_tasks(tmp_path: Path, name: str) -> None:
    version, driver, tops = TREES[name]
    layout = _layout(tmp_path, name)
    hierarchy = tmp_path / "cg" / ("freezer" if version is CgroupVersion.V1 else "")
    assert (layout.version, layout.driver, layout.root) == (version, driver, hierarchy)
    assert layout.kubepods == tuple(hierarchy / t for t in tops)
    pods = _pods_in(load_tree(name))
    assert len(pods) >= 1
    for uid, pids in pods.items():
        pod = find_pod_cgroup(uid, layout)
        assert pod is not None, uid
        assert len(pod.dirs) == 1 and parse_pod_path(str(pod.dirs[0])) is not None
        assert pod.pids() == pids  # every container, the sandbox included
        assert not pod.is_empty()
    assert find_pod_cgroup("00000000-0000-0000-0000-000000000000", layout) is None


def test_recorded_pid_counts() -> None:
    # The parser-derived table above, pinned for two trees so a parser bug cannot hide in both.
    assert _pods_in(load_tree("v1-cgroupfs-recorded.tsv")) == {
        "b21b07d6-77b8-4372-b573-02d941d6112b": [5595, 5626, 5658, 5689]
    }
    assert {u: len(p) for u, p in _pods_in(load_tree("v2-systemd.tsv")).items()} == {
        "7852b09e-7246-4abe-85a4-d21a6156b4da": 4,
        "ceffa969-0e80-4112-ac20-765f0aef39ff": 3,
        "3fd95e98-4260-4ecd-9aa6-0e529944316c": 4,
        "44331c94-d567-4c73-bc5d-a0f24fc23d30": 2,
    }


# /proc/<pid>/cgroup text -> the tree it belongs with; the pod found from the text must be the
# directory the UID lookup finds: the kernel's naming and ours agree.
PROC_TREES = [
    ("v1-hybrid-cgroupfs-besteffort.txt", "v1-cgroupfs-recorded.tsv"),
    ("v1-hybrid-cgroupfs-besteffort.txt", "v2-cgroupfs-recorded.tsv"),
    ("v1-hybrid-systemd-burstable.txt", "v1-systemd.tsv"),
    ("v1-legacy-systemd-guaranteed.txt", "v1-systemd.tsv"),
    ("v2-systemd-besteffort.txt", "v2-systemd.tsv"),
    ("v2-systemd-guaranteed.txt", "v2-systemd.tsv"),
    ("v2-systemd-pod-level.txt", "v2-systemd.tsv"),
    ("v2-systemd-cgroupns-relative.txt", "v2-systemd.tsv"),
    ("v2-cgroupfs-burstable.txt", "v2-cgroupfs.tsv"),
    ("v2-cgroupfs-guaranteed.txt", "v2-cgroupfs.tsv"),
    ("v2-cgroupfs-cgroupns-relative.txt", "v2-cgroupfs.tsv"),
]


@pytest.mark.parametrize(("proc", "tree"), PROC_TREES)
def test_the_pod_of_a_recorded_process_is_the_one_found_by_uid(tmp_path: Path, proc: str, tree: str) -> None:
    layout = _layout(tmp_path, tree)
    (tmp_path / "proc" / "4242").mkdir(parents=True)
    (tmp_path / "proc" / "4242" / "cgroup").write_text(proc_text(proc))
    pod = pod_cgroup_of_pid(4242, layout, proc_root=str(tmp_path / "proc"))
    assert pod is not None
    path = parse_proc_cgroup(proc_text(proc)).path_in(layout.version, layout.root.name)
    parsed = parse_pod_path(path or "")
    assert parsed is not None and pod.pod_uid == parsed.pod_uid
    assert pod.dirs[0].name == parsed.pod_path.rsplit("/", 1)[-1]
    if parsed.container_id is not None:  # the container's own cgroup is right below the pod's
        assert [d.name for d in pod.dirs[0].iterdir() if d.is_dir() and parsed.container_id in d.name]


def test_a_process_in_no_pod_or_gone_has_no_pod_cgroup(tmp_path: Path) -> None:
    layout = _layout(tmp_path, "v2-systemd.tsv")
    (tmp_path / "proc" / "7").mkdir(parents=True)
    (tmp_path / "proc" / "7" / "cgroup").write_text(proc_text("v2-host-service.txt"))
    assert pod_cgroup_of_pid(7, layout, proc_root=str(tmp_path / "proc")) is None
    assert pod_cgroup_of_pid(8, layout, proc_root=str(tmp_path / "proc")) is None


def test_kubelet_cgroup_root_narrows_the_search_and_several_kubelets_are_all_searched(tmp_path: Path) -> None:
    layout = _layout(tmp_path, "v1-cgroupfs-recorded.tsv", kubelet_root="/gs-kwnu26x_o")
    assert layout.kubepods == (tmp_path / "cg/freezer/gs-kwnu26x_o/kubepods",)
    # A second kubelet (another test cluster) on the same host: both are searched, a UID is in one.
    other = tmp_path / "cg/freezer/gs-kother/kubepods/besteffort/pod1234"
    write_cgroup(other.parent.parent, "v1", [], populated=False, hierarchy="freezer")
    write_cgroup(other, "v1", [77], populated=True, hierarchy="freezer")
    found = detect_layout(tmp_path / "cg")
    assert isinstance(found, CgroupLayout) and len(found.kubepods) == 2
    pod = find_pod_cgroup("1234", found)
    assert pod is not None and pod.pids() == [77]


def test_layout_describes_itself(tmp_path: Path) -> None:
    assert _layout(tmp_path / "a", "v2-systemd.tsv").describe().endswith("kill: cgroup.kill")
    (tmp_path / "a/cg/kubepods.slice/cgroup.kill").unlink()  # a kernel before 5.14
    assert _layout(tmp_path / "b", "v1-systemd.tsv").describe().startswith("cgroup v1, systemd driver")
    assert "v1 freezer" in _layout(tmp_path / "b", "v1-systemd.tsv").describe()


def test_v2_empty_is_populated_0(tmp_path: Path) -> None:
    layout = _layout(tmp_path, "v2-cgroupfs.tsv")
    pod = find_pod_cgroup("cfb213da-57d9-4538-b9c7-22498e2b48a9", layout)
    assert pod is not None and not pod.is_empty()
    (pod.dirs[0] / "cgroup.events").write_text("populated 0\nfrozen 0\n")
    assert pod.is_empty()


@pytest.mark.parametrize(
    ("build", "reason"),
    [
        (lambda root: None, "does not exist: mount the host's /sys/fs/cgroup there"),
        (lambda root: root.write_text(""), "is not a directory"),
        (lambda root: root.mkdir(), "no cgroup hierarchy under"),
    ],
)
def test_no_cgroup_tree_gives_a_reason(tmp_path: Path, build: Callable[[Path], object], reason: str) -> None:
    build(tmp_path / "cg")
    found = detect_layout(tmp_path / "cg")
    assert isinstance(found, str) and reason in found and "\n" not in found


@pytest.mark.parametrize("name", ["v2-systemd.tsv", "v1-systemd.tsv"])
def test_no_kubepods_gives_a_reason(tmp_path: Path, name: str) -> None:
    layout = _layout(tmp_path, name)
    for top in (tmp_path / "cg").glob("**/kubepods.slice"):  # in every v1 hierarchy: any one would do
        shutil.rmtree(top)
    found = detect_layout(tmp_path / "cg")
    assert isinstance(found, str) and found.startswith("no kubepods cgroup under ")
    assert f"(cgroup {layout.version})" in found


def test_a_wrong_kubelet_root_gives_a_reason(tmp_path: Path) -> None:
    materialize(load_tree("v2-systemd.tsv"), tmp_path / "cg")
    missing = detect_layout(tmp_path / "cg", kubelet_root="/nope.slice")
    assert isinstance(missing, str) and f"{tmp_path}/cg/nope.slice" in missing
    # A path that cannot be listed is reported, not raised.
    unreadable = detect_layout(tmp_path / "cg", kubelet_root="/init.scope/cgroup.procs")
    assert isinstance(unreadable, str) and unreadable.startswith("cannot read ") and "Not a directory" in unreadable


def test_both_drivers_at_once_is_ambiguous(tmp_path: Path) -> None:
    materialize(load_tree("v2-systemd.tsv"), tmp_path / "cg")
    write_cgroup(tmp_path / "cg/kubepods", "v2", [], populated=False)
    found = detect_layout(tmp_path / "cg")
    assert isinstance(found, str) and "both drivers" in found


def test_a_bad_uid_is_refused_before_any_path_is_built(tmp_path: Path) -> None:
    layout = _layout(tmp_path, "v2-systemd.tsv")
    with pytest.raises(ValueError, match="not a pod UID"):
        find_pod_cgroup("../../system.slice", layout)


def test_container_index_works_on_v2(tmp_path: Path) -> None:
    materialize(load_tree("v2-systemd.tsv"), tmp_path / "cg")
    cid = "d7f25dce6c7a2d92bd294cf7583fdd92960c0cb31a8708bb0ba0cebf66755d7a"
    found = CgroupIndex(cgroup_root=str(tmp_path / "cg")).locate([cid])
    assert found[cid].rel_path.endswith(f"/cri-containerd-{cid}.scope")
    assert found[cid].pids() == [4160, 4175, 4176]


def test_v1_without_a_freezer_hierarchy_uses_the_next_one(tmp_path: Path) -> None:
    materialize(load_tree("v1-systemd.tsv"), tmp_path / "cg")
    shutil.rmtree(tmp_path / "cg/freezer")
    layout = detect_layout(tmp_path / "cg")
    assert isinstance(layout, CgroupLayout) and layout.root == tmp_path / "cg/pids"
    assert layout.describe().endswith("kill: SIGKILL each task, no freezer")
    pod = find_pod_cgroup("ae21398a-3d57-498f-a4d1-625873258f8a", layout)
    assert pod is not None and pod.pids() == [2402, 2433]


def test_a_lookup_records_the_pods_containers(tmp_path: Path) -> None:
    layout = _layout(tmp_path, "v2-systemd.tsv")
    pod = find_pod_cgroup("3fd95e98-4260-4ecd-9aa6-0e529944316c", layout)
    assert pod is not None and len(pod.containers) == 3  # sandbox, container, ephemeral container
    assert {c.parent for c in pod.containers} == {pod.dirs[0]}


@pytest.mark.parametrize(
    ("name", "text", "problem"),
    [
        ("cgroup.procs", "12\nnot-a-pid\n", "holds something other than pids"),
        ("cgroup.events", "populated one\n", "line is not '<key> <number>'"),
        ("cgroup.events", "frozen 0\n", "has no 'populated' line"),
    ],
)
def test_a_control_file_in_a_form_the_kernel_never_writes_is_an_error(
    tmp_path: Path, name: str, text: str, problem: str
) -> None:
    (tmp_path / name).write_text(text)
    with pytest.raises(ProcessError, match=problem):
        read_pids(tmp_path / name) if name == "cgroup.procs" else is_populated(tmp_path)
