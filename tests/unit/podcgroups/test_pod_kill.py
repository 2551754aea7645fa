"""podcgroups.pod_kill.kill_pods: the control flow on recorded trees with a stand-in kernel (no root),
then real kills of real process trees in real cgroups, v1 and v2, both drivers (root).

The stand-in kernel (``cgroup_fixtures.FakeKernel``) acts on the tmp tree's files only; the
tasks are real child processes, so every SIGKILL and every death here is real.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from podcgroups.cgroups import CgroupLayout, PodCgroup, detect_layout, find_pod_cgroup
from podcgroups.exit_boost import ExitBoost
from podcgroups.paths import CgroupDriver, CgroupVersion
from podcgroups.pod_kill import PodKillReport, kill_pods, urgent
from tests.unit.podcgroups.cgroup_fixtures import GHOST_PID, FakeKernel, load_tree, materialize, running
from tests.unit.podcgroups.podtrees import RealPods, cgroup2_root, skip_reason

BESTEFFORT_V2 = ("v2-systemd.tsv", "7852b09e-7246-4abe-85a4-d21a6156b4da")
GUARANTEED_V2 = ("v2-cgroupfs.tsv", "cfb213da-57d9-4538-b9c7-22498e2b48a9")
RECORDED_V2 = ("v2-cgroupfs-recorded.tsv", "b21b07d6-77b8-4372-b573-02d941d6112b")
RECORDED_V1 = ("v1-cgroupfs-recorded.tsv", "b21b07d6-77b8-4372-b573-02d941d6112b")
SYSTEMD_V1 = ("v1-systemd.tsv", "3fd95e98-4260-4ecd-9aa6-0e529944316c")


def _layout(tmp_path: Path, tree: str) -> CgroupLayout:
    found = detect_layout(materialize(load_tree(tree), tmp_path / "cg"))
    assert isinstance(found, CgroupLayout), found
    return found


def _borrower(tmp_path: Path, tree: str, uid: str, per_container: int = 2) -> tuple[PodCgroup, FakeKernel]:
    """The recorded pod, its recorded pids replaced by real sleepers of this test (``per_container`` each)."""
    layout = _layout(tmp_path, tree)
    pod = find_pod_cgroup(uid, layout)
    assert pod is not None
    kernel = FakeKernel(pod.dirs[0], str(layout.version))
    for d in sorted(c for c in pod.dirs[0].iterdir() if c.is_dir()):
        (d / "cgroup.procs").write_text("")
        for _ in range(per_container):
            kernel.spawn(d)
    return pod, kernel


def _all_killed(kernel: FakeKernel) -> bool:
    return all(p.wait(5) == -9 for p in kernel.children.values())


def _no_boost(tmp_path: Path) -> ExitBoost:
    """A boost of the test's own: the recorded trees have no cpu weight files, so it raises nothing."""
    return ExitBoost()


@pytest.mark.parametrize(("tree", "uid"), [BESTEFFORT_V2, GUARANTEED_V2, RECORDED_V2])
def test_v2_writes_cgroup_kill_once_and_returns_at_populated_0(tmp_path: Path, tree: str, uid: str) -> None:
    pod, kernel = _borrower(tmp_path, tree, uid)
    with running(kernel):
        report = kill_pods([pod], timeout_s=5.0)
        assert pod.is_empty()
    assert report.used_cgroup_kill and kernel.kill_writes == 1 and not report.froze
    assert report.signalled == report.tasks_at_start == 4
    assert report.remaining == () and report.unconfirmed == () and report.errors == ()
    assert [u for u, _ in report.emptied_s] == [uid] and report.took_s == report.emptied_s[0][1]
    assert not report.timed_out and not report.signalled_none
    assert _all_killed(kernel)


@pytest.mark.parametrize("how", ["no cgroup.kill (Linux < 5.14)", "use_cgroup_kill=False"])
def test_v2_without_cgroup_kill_freezes_kills_each_task_and_thaws(tmp_path: Path, how: str) -> None:
    pod, kernel = _borrower(tmp_path, *BESTEFFORT_V2)
    if how.startswith("no"):
        (pod.dirs[0] / "cgroup.kill").unlink()
    with running(kernel):
        report = kill_pods([pod], timeout_s=5.0, use_cgroup_kill=not how.endswith("False"))
    assert not report.used_cgroup_kill and kernel.kill_writes == 0
    assert report.froze and report.signalled == 4 and report.remaining == ()
    assert (pod.dirs[0] / "cgroup.freeze").read_text() == "0"  # thawed however the kill ended
    assert kernel.freeze_values[0] == "0" and "1" in kernel.freeze_values
    assert _all_killed(kernel)


def test_v2_refused_cgroup_kill_falls_back_and_says_so(tmp_path: Path) -> None:
    pod, kernel = _borrower(tmp_path, *BESTEFFORT_V2)
    (pod.dirs[0] / "cgroup.kill").unlink()
    (pod.dirs[0] / "cgroup.kill").mkdir()  # any write fails, as on a read-only cgroupfs
    with running(kernel):
        report = kill_pods([pod], timeout_s=5.0)
    assert not report.used_cgroup_kill and report.froze and report.remaining == ()
    assert len(report.errors) == 1 and "cannot write '1' to" in report.errors[0]
    assert f"{pod.dirs[0]}/cgroup.kill: " in report.errors[0]
    assert _all_killed(kernel)


@pytest.mark.parametrize(("tree", "uid"), [RECORDED_V1, SYSTEMD_V1])
def test_v1_signals_every_task_below_the_pod(tmp_path: Path, tree: str, uid: str) -> None:
    pod, kernel = _borrower(tmp_path, tree, uid)
    with running(kernel):
        report = kill_pods([pod], timeout_s=5.0, exit_boost=_no_boost(tmp_path))
    assert not report.used_cgroup_kill and not report.froze
    assert report.signalled == report.tasks_at_start == 4 and report.remaining == ()
    assert _all_killed(kernel)


@pytest.mark.parametrize(
    ("tree", "uid", "use_cgroup_kill"),
    [(*BESTEFFORT_V2, True), (*BESTEFFORT_V2, False), (*RECORDED_V1, True)],
    ids=["v2-cgroup.kill", "v2-freeze", "v1"],
)
def test_a_container_started_after_the_kill_began_is_killed_too(
    tmp_path: Path, tree: str, uid: str, use_cgroup_kill: bool
) -> None:
    pod, kernel = _borrower(tmp_path, tree, uid, per_container=1)
    late: list[int] = []
    kernel.on_first_kill.append(lambda: late.append(kernel.spawn(pod.dirs[0] / "cri-containerd-late.scope")))
    with running(kernel):
        report = kill_pods([pod], timeout_s=5.0, use_cgroup_kill=use_cgroup_kill, exit_boost=_no_boost(tmp_path))
    assert late and kernel.children[late[0]].wait(5) == -9
    assert report.remaining == () and report.signalled == report.tasks_at_start + 1 == 3
    if use_cgroup_kill and tree.startswith("v2"):
        assert kernel.kill_writes == 2  # written again for the newcomer
    assert _all_killed(kernel)


def test_several_pods_are_signalled_first_then_watched_together(tmp_path: Path) -> None:
    layout = _layout(tmp_path, "v2-systemd.tsv")
    uids = ["7852b09e-7246-4abe-85a4-d21a6156b4da", "3fd95e98-4260-4ecd-9aa6-0e529944316c"]
    pods = [find_pod_cgroup(u, layout) for u in uids]
    assert all(p is not None for p in pods)
    kernels = [FakeKernel(p.dirs[0], "v2") for p in pods if p is not None]
    for kernel in kernels:
        for d in (c for c in kernel.top.iterdir() if c.is_dir()):
            (d / "cgroup.procs").write_text("")
            kernel.spawn(d)
    for kernel in kernels:
        kernel.start()
    try:
        report = kill_pods([p for p in pods if p is not None], timeout_s=5.0)
    finally:
        for kernel in kernels:
            kernel.stop()
    assert sorted(u for u, _ in report.emptied_s) == sorted(uids)
    assert report.took_s == max(s for _, s in report.emptied_s)
    assert report.signalled == report.tasks_at_start == 5 and report.used_cgroup_kill


@pytest.mark.parametrize(("tree", "uid"), [RECORDED_V1, BESTEFFORT_V2])
def test_tasks_that_outlive_the_bound_are_reported_not_raised(tmp_path: Path, tree: str, uid: str) -> None:
    pod, kernel = _borrower(tmp_path, tree, uid, per_container=0)
    (next(d for d in pod.dirs[0].iterdir() if d.is_dir()) / "cgroup.procs").write_text(f"{GHOST_PID}\n")
    with running(kernel):
        start = time.monotonic()
        report = kill_pods([pod], timeout_s=0.1, exit_boost=_no_boost(tmp_path))
        waited = time.monotonic() - start
    assert waited >= 0.1 and report.took_s >= 0.1  # it waited out its bound, then returned
    assert report.timed_out and report.remaining == (GHOST_PID,) and report.unconfirmed == (uid,)
    assert report.emptied_s == () and report.tasks_at_start == 1
    if tree.startswith("v1"):
        # A task listed and none signalled (it could not be): the kill did nothing, and says so.
        assert report.signalled == 0 and report.signalled_none
    else:
        # cgroup.kill counts what it was written for; that it did not work shows as remaining.
        assert report.signalled == 1 and not report.signalled_none


def test_a_pod_without_tasks_and_a_gone_pod_are_empty_at_once(tmp_path: Path) -> None:
    pod, kernel = _borrower(tmp_path, *BESTEFFORT_V2, per_container=0)
    gone, _ = _borrower(tmp_path / "other", *GUARANTEED_V2, per_container=0)
    shutil.rmtree(gone.dirs[0])
    with running(kernel):
        report = kill_pods([pod, gone], timeout_s=5.0)
    assert report == PodKillReport(
        signalled=0,
        took_s=report.took_s,
        remaining=(),
        used_cgroup_kill=False,  # nothing needed killing
        tasks_at_start=0,
        emptied_s=report.emptied_s,
        signalled_s=report.signalled_s,
    )
    assert len(report.emptied_s) == 2 and not report.signalled_none
    assert report.boosted == 0  # nothing was killed: nothing raised


def test_an_unreadable_pod_cgroup_is_reported_and_the_others_still_killed(tmp_path: Path) -> None:
    pod, kernel = _borrower(tmp_path, *BESTEFFORT_V2)
    broken, _ = _borrower(tmp_path / "other", *RECORDED_V1, per_container=0)
    (broken.dirs[0] / "cgroup.procs").unlink()
    (broken.dirs[0] / "cgroup.procs").mkdir()  # reading it fails with EISDIR: not "gone", unreadable
    with running(kernel):
        report = kill_pods([pod, broken], timeout_s=5.0)
    assert report.unconfirmed == (broken.pod_uid,) and report.remaining == ()
    assert len(report.errors) == 1 and report.errors[0].startswith(f"pod {broken.pod_uid}: gpushare: cannot read ")
    assert [u for u, _ in report.emptied_s] == [pod.pod_uid]
    assert _all_killed(kernel)


# --- real processes in real cgroups (root) ---


@pytest.fixture(scope="module")
def v2_root() -> Iterator[Path | None]:
    if skip_reason(CgroupVersion.V2):
        yield None
        return
    with cgroup2_root() as root:
        yield root


def _real_kill(pods: RealPods, *, use_cgroup_kill: bool = True) -> PodKillReport:
    before = pods.all_pids()
    assert len(before) >= len(pods.uids) * 2 * 4  # 2 containers of a shell, 3 sleepers, a fork loop
    report = kill_pods(pods.pods(), timeout_s=5.0, use_cgroup_kill=use_cgroup_kill)
    # Dead right when kill_pods returns: no task listed, none of the old pids runs.
    assert pods.all_pids() == [] and report.remaining == () and report.errors == ()
    for pid in before:
        status = Path(f"/proc/{pid}/status")
        assert not status.exists() or "State:\tZ" in status.read_text()
    assert sorted(u for u, _ in report.emptied_s) == sorted(pods.uids)
    assert report.tasks_at_start >= len(before) - len(pods.uids) * 2  # the fork loops may have lost a child
    assert pods.reap() == [-9] * len(pods.procs)
    return report


@pytest.mark.skipif(bool(skip_reason(CgroupVersion.V1)), reason=skip_reason(CgroupVersion.V1) or "ok")
@pytest.mark.parametrize("driver", list(CgroupDriver))
@pytest.mark.parametrize("count", [1, 4])
def test_real_v1_pods_die_whole(driver: CgroupDriver, count: int) -> None:
    with RealPods(CgroupVersion.V1, driver, count) as pods:
        layout = pods.layout()
        assert (layout.version, layout.driver, layout.root.name) == (CgroupVersion.V1, driver, "freezer")
        report = _real_kill(pods)
        assert not report.used_cgroup_kill
        assert report.signalled >= report.tasks_at_start - count * 2  # a fork loop's child may exit first


@pytest.mark.skipif(bool(skip_reason(CgroupVersion.V2)), reason=skip_reason(CgroupVersion.V2) or "ok")
@pytest.mark.parametrize("use_cgroup_kill", [True, False], ids=["cgroup.kill", "freeze+SIGKILL"])
@pytest.mark.parametrize("driver", list(CgroupDriver))
@pytest.mark.parametrize("count", [1, 4])
def test_real_v2_pods_die_whole(v2_root: Path, driver: CgroupDriver, count: int, use_cgroup_kill: bool) -> None:
    with RealPods(CgroupVersion.V2, driver, count, v2_root=v2_root) as pods:
        layout = pods.layout()
        assert (layout.version, layout.driver) == (CgroupVersion.V2, driver)
        has_kill = (pods.pods()[0].dirs[0] / "cgroup.kill").exists()
        report = _real_kill(pods, use_cgroup_kill=use_cgroup_kill)
        assert report.used_cgroup_kill is (use_cgroup_kill and has_kill)
        assert report.froze is not report.used_cgroup_kill
        for pod in pods.pods():
            assert (pod.dirs[0] / "cgroup.freeze").read_text().strip() == "0"


@pytest.mark.skipif(bool(skip_reason(CgroupVersion.V1)), reason=skip_reason(CgroupVersion.V1) or "ok")
def test_real_v1_task_that_cannot_die_is_reported_at_the_bound() -> None:
    # Frozen from above (kubelet's root frozen): SIGKILL stays pending, a stand-in for D state.
    with RealPods(CgroupVersion.V1, CgroupDriver.CGROUPFS, 1, containers=1, children=1, forker=False) as pods:
        before = pods.all_pids()
        frozen_root = pods.hierarchies[0] / pods.kubelet_root / "freezer.state"
        frozen_root.write_text("FROZEN")
        try:
            report = kill_pods(pods.pods(), timeout_s=0.2, exit_boost=ExitBoost())
        finally:
            frozen_root.write_text("THAWED")
        assert report.timed_out and sorted(report.remaining) == before
        assert report.signalled == len(before) and report.unconfirmed == (pods.uids[0],)
        deadline = time.monotonic() + 5
        while pods.all_pids() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pods.all_pids() == []  # the pending SIGKILL lands once thawed


@pytest.mark.parametrize(("tree", "uid"), [BESTEFFORT_V2, RECORDED_V1])
def test_containers_made_after_the_lookup_are_killed_too(tmp_path: Path, tree: str, uid: str) -> None:
    # The lookup's list of containers is stale by the kill: one container more, and a cgroup
    # nested inside a known container (a task that moved down out of sight of the first read).
    pod, kernel = _borrower(tmp_path, tree, uid, per_container=1)
    assert len(pod.containers) == 2
    newer = kernel.spawn(pod.dirs[0] / "cri-containerd-newer.scope")
    nested = kernel.spawn(pod.containers[0] / "nested")
    with running(kernel):
        report = kill_pods([pod], timeout_s=5.0, exit_boost=_no_boost(tmp_path))
    assert kernel.children[newer].wait(5) == -9 and kernel.children[nested].wait(5) == -9
    assert report.remaining == ()
    if tree.startswith("v1"):
        assert report.signalled == 4  # the first look saw the tree's new shape and walked it
    else:
        assert report.signalled >= 2  # cgroup.kill reaches every task below the pod without naming it
    assert _all_killed(kernel)


def test_the_killing_thread_runs_at_real_time_priority_only_for_the_kill() -> None:
    before = os.sched_getscheduler(0)
    with urgent() as raised:
        inside = os.sched_getscheduler(0)
    assert os.sched_getscheduler(0) == before
    if raised:
        assert inside == os.SCHED_FIFO
    else:  # not permitted here (no CAP_SYS_NICE): the kill runs at the thread's own priority
        assert inside == before
    kill_pods([], timeout_s=0.1)
    assert os.sched_getscheduler(0) == before
