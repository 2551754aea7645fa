"""Spot's pod killer against real runc containers on cgroup v2, inside the QEMU guest.

tests/integration/kernel/test_qemu.py boots Debian's 6.12 kernel with ``cgroup_no_v1=all`` and
the unified hierarchy at /sys/fs/cgroup (``run-guest.sh --cgroup2``) and runs this file there;
the host never collects it (its name does not match test_*.py). For each kubelet cgroup driver's
layout, runc creates borrower pods whose containers run fork loops and sleepers; the agent's own
``detect_layout``, ``find_pod_cgroup`` and ``kill_pods`` kill two of them, and the test reads the
kernel's view directly: every task gone, the pod cgroups unpopulated, runc's containers stopped,
and a third pod untouched. There is no systemd in the guest: for the systemd layout runc's
cgroupfs driver is given the systemd-shaped paths, which builds the same tree (runc_pods.py).

Most containers share the guest's pid namespace on purpose: in a namespace of its own, a
container's tasks all die with its pid 1, which would hide a killer that only hit the first
process. The container started after the pod's cgroup was looked up has its own namespace, the
way kubelet runs containers.
"""

from __future__ import annotations

import json
import os
import secrets
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest

from podcgroups.cgroups import CgroupDriver, CgroupVersion, PodCgroup, detect_layout, find_pod_cgroup
from podcgroups.pod_kill import kill_pods
from tests.integration.kernel.guest.runc_pods import (
    CGROUP_ROOT,
    FORK_LOOP,
    SLEEPERS,
    Container,
    Runc,
    container_rel,
    make_cgroup,
    make_qos_tree,
    pod_rel,
    populated,
    remove_tree,
    start_time,
    tasks_below,
)

OUT_ENV = "GS_CGROUP2_OUT"  # the guest's writable results folder; set only by the host's guest script
pytestmark = pytest.mark.skipif(OUT_ENV not in os.environ, reason="runs inside the QEMU guest: `make test` boots it")

KILL_BOUND_S = 10.0  # far above a kill under TCG (0.1 to 2 s on a busy host); reaching it fails the test
FORKING_WITHIN_S = 30.0
# The second victim pod's QoS per layout, so both layouts together cover every pod path shape.
OTHER_QOS = {CgroupDriver.CGROUPFS: "burstable", CgroupDriver.SYSTEMD: "guaranteed"}


@dataclass(frozen=True)
class Pod:
    uid: str
    rel: str
    containers: list[Container]

    @property
    def dir(self) -> Path:
        return CGROUP_ROOT / self.rel


@dataclass(frozen=True)
class KillFigures:
    """What one kill took, for the host to print."""

    driver: str
    method: str
    pods: int
    containers: int
    tasks_before: int
    signalled: int
    took_ms: float
    call_ms: float


@pytest.fixture
def runc(tmp_path: Path) -> Iterator[Runc]:
    assert (CGROUP_ROOT / "cgroup.controllers").is_file(), "the guest must have cgroup2 at /sys/fs/cgroup"
    r = Runc(tmp_path)
    try:
        yield r
    finally:
        r.delete_all()
        for top in ("kubepods", "kubepods.slice"):
            remove_tree(CGROUP_ROOT / top)


def _pod(runc: Runc, driver: CgroupDriver, qos: str, scripts: list[str]) -> Pod:
    uid = str(uuid.uuid4())
    rel = pod_rel(driver, qos, uid)
    make_cgroup(CGROUP_ROOT / rel)  # kubelet makes the pod cgroup before any container
    containers: list[Container] = []
    for script in scripts:
        cid = secrets.token_hex(32)
        containers.append(runc.run(cid, container_rel(driver, rel, cid), script))
    return Pod(uid, rel, containers)


def _wait_forking(containers: list[Container]) -> None:
    """Until each container holds >= 3 tasks and one never seen before: its loop is forking."""
    deadline = time.monotonic() + FORKING_WITHIN_S
    for c in containers:
        seen: set[int] = set()
        while True:
            now = set(tasks_below(c.cgroup))
            if len(now) >= 3 and seen and now - seen:
                break
            assert time.monotonic() < deadline, f"{c.id[:12]}: no fork seen in {FORKING_WITHIN_S:g}s"
            seen |= now
            time.sleep(0.05)


def _live(pids: dict[int, int | None]) -> list[int]:
    return [pid for pid, start in pids.items() if start is not None and start_time(pid) == start]


def _handle(uid: str, layout_driver: CgroupDriver, expected: Path) -> PodCgroup:
    layout = detect_layout()
    assert not isinstance(layout, str), layout
    assert (layout.version, layout.driver, layout.root) == (CgroupVersion.V2, layout_driver, CGROUP_ROOT)
    handle = find_pod_cgroup(uid, layout)
    assert handle is not None, f"find_pod_cgroup found no cgroup for pod {uid} under {layout.describe()}"
    assert handle.dirs == (expected,)
    return handle


# "cgroup.freeze" is the path kill_pods takes on kernels without cgroup.kill (5.2 to 5.13):
# freeze the pod, SIGKILL each task, thaw.
@pytest.mark.parametrize("method", ["cgroup.kill", "cgroup.freeze"])
@pytest.mark.parametrize("driver", [CgroupDriver.CGROUPFS, CgroupDriver.SYSTEMD])
def test_kill_pods_kills_every_task_of_runc_pods(runc: Runc, driver: CgroupDriver, method: str) -> None:
    make_qos_tree(driver)
    victims = [
        _pod(runc, driver, "besteffort", [FORK_LOOP, FORK_LOOP]),
        _pod(runc, driver, OTHER_QOS[driver], [FORK_LOOP, FORK_LOOP]),
    ]
    bystander = _pod(runc, driver, "besteffort", [SLEEPERS])
    runc.open_gate()
    _wait_forking([c for p in victims for c in p.containers])
    handles = [_handle(p.uid, driver, p.dir) for p in victims]
    _handle(bystander.uid, driver, bystander.dir)  # found as well; it must survive the kill

    # A container the pod gains after its cgroup was looked up (as kubelet may start one while
    # the agent decides): the pod-level kill must reach it without looking the pod up again.
    late_id = secrets.token_hex(32)
    late_rel = container_rel(driver, victims[0].rel, late_id)
    assert not (CGROUP_ROOT / late_rel).exists()
    late = runc.run(late_id, late_rel, FORK_LOOP, own_pidns=True)
    victims[0].containers.append(late)
    _wait_forking([late])

    before = {pid: start_time(pid) for p in victims for pid in tasks_below(p.dir)}
    spared = {pid: start_time(pid) for pid in tasks_below(bystander.dir)}
    # The CPU boost: every cgroup from each victim pod up to the top, as the kernel shows it.
    boosted = sorted(
        {
            d / "cpu.weight"
            for p in victims
            for d in (p.dir, *p.dir.parents)
            if d != CGROUP_ROOT and CGROUP_ROOT in d.parents
        }
    )
    weights = {f: f.read_text().strip() for f in boosted}
    called = time.monotonic()
    report = kill_pods(handles, timeout_s=KILL_BOUND_S, use_cgroup_kill=method == "cgroup.kill")
    call_s = time.monotonic() - called
    assert report.boosted == len(boosted), (report.boosted, [str(f) for f in boosted])
    # Given back once the kill ended (the victims' own cgroups may be gone with them by then).
    assert {f: f.read_text().strip() for f in boosted if f.exists()} == {f: w for f, w in weights.items() if f.exists()}

    assert not report.timed_out, f"tasks outlived the kill bound: {report.remaining}"
    assert report.errors == () and report.unconfirmed == (), report
    containers = [c for p in victims for c in p.containers]
    assert report.signalled >= len(containers), report  # each container had its sh and sleepers
    assert report.used_cgroup_kill is (method == "cgroup.kill"), report
    assert report.froze is (method == "cgroup.freeze"), report
    for p in victims:
        assert tasks_below(p.dir) == [], p.rel
        assert not populated(p.dir), p.rel
    assert _live(before) == [], "tasks of killed pods still alive"
    # runc's own view: every container of the killed pods stopped, the bystander's still running.
    assert runc.statuses() == {c.id: "stopped" for c in containers} | {bystander.containers[0].id: "running"}
    assert populated(bystander.dir) and sorted(_live(spared)) == sorted(spared), "the bystander pod was hit"
    if method == "cgroup.freeze":
        assert all((p.dir / "cgroup.freeze").read_text().strip() == "0" for p in victims), "a pod was left frozen"

    figures = KillFigures(
        str(driver),
        method,
        len(victims),
        len(containers),
        len(before),
        report.signalled,
        round(report.took_s * 1000, 2),
        round(call_s * 1000, 2),
    )
    print(f"\n{figures}")
    out = Path(os.environ[OUT_ENV])
    (out / f"cgroup2-{driver}-{method}.json").write_text(json.dumps(asdict(figures)))
