"""ExitBoost: a killed pod and every cgroup above it get the highest CPU weight for the kill, and get theirs back."""

from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path

import pytest

from podcgroups.cgroups import CGROUP_ROOT, CgroupLayout, PodCgroup
from podcgroups.errors import ExitBoostJournalError
from podcgroups.exit_boost import V1_FILE, V1_MAX, V2_FILE, V2_MAX, ExitBoost, weight_files
from podcgroups.paths import CgroupDriver, CgroupVersion
from tests.unit.podcgroups.podtrees import skip_reason


def _v2(tmp_path: Path, qos: str | None) -> tuple[PodCgroup, Path, Path]:
    kubepods = tmp_path / "kubepods"
    parent = kubepods / qos if qos else kubepods
    pod = parent / "pod1"
    pod.mkdir(parents=True)
    for d, weight in {parent: "1", kubepods: "76", pod: "1"}.items():
        (d / V2_FILE).write_text(f"{weight}\n")
    layout = CgroupLayout(CgroupVersion.V2, CgroupDriver.CGROUPFS, tmp_path, (kubepods,))
    return PodCgroup("1", layout, (pod,)), parent, kubepods


def test_a_besteffort_pod_and_every_cgroup_above_it_are_raised_and_restored(tmp_path: Path) -> None:
    cg, qos, kubepods = _v2(tmp_path, "besteffort")
    boost = ExitBoost()
    held = boost.raise_for([cg])
    assert sorted(held) == sorted(d / V2_FILE for d in (cg.dirs[0], qos, kubepods))
    assert {(d / V2_FILE).read_text() for d in (cg.dirs[0], qos, kubepods)} == {V2_MAX}
    assert not (tmp_path / V2_FILE).exists()  # the hierarchy's root has no weight: nothing is written there
    boost.restore(held)
    assert [(d / V2_FILE).read_text() for d in (cg.dirs[0], qos, kubepods)] == ["1", "1", "76"]
    assert boost.raised() == {}


def test_a_guaranteed_pod_right_below_kubepods_raises_itself_and_kubepods(tmp_path: Path) -> None:
    cg, _, kubepods = _v2(tmp_path, None)
    assert weight_files(cg) == [(cg.dirs[0] / V2_FILE, V2_MAX), (kubepods / V2_FILE, V2_MAX)]


def test_two_kills_at_once_share_the_qos_cgroup_and_the_last_one_restores_it(tmp_path: Path) -> None:
    cg, qos, _ = _v2(tmp_path, "besteffort")
    other = qos / "pod2"
    other.mkdir()
    (other / V2_FILE).write_text("1\n")
    second = PodCgroup("2", cg.layout, (other,))
    boost = ExitBoost()
    first_held = boost.raise_for([cg])
    second_held = boost.raise_for([second])
    boost.restore(first_held)
    assert (qos / V2_FILE).read_text() == V2_MAX  # the second kill still runs
    boost.restore(second_held)
    assert (qos / V2_FILE).read_text() == "1"


def test_a_weight_kubelet_wrote_meanwhile_is_left_as_kubelet_wrote_it(tmp_path: Path) -> None:
    cg, qos, _ = _v2(tmp_path, "burstable")
    boost = ExitBoost()
    held = boost.raise_for([cg])
    (qos / V2_FILE).write_text("39")  # kubelet's QoS manager, after a pod change
    boost.restore(held)
    assert (qos / V2_FILE).read_text() == "39"


def test_v1_weights_are_the_cpu_hierarchys_shares_at_the_same_path(tmp_path: Path) -> None:
    freezer_pod = tmp_path / "freezer" / "kubepods" / "besteffort" / "pod1"
    cpu_pod = tmp_path / "cpu,cpuacct" / "kubepods" / "besteffort" / "pod1"
    freezer_pod.mkdir(parents=True)
    cpu_pod.mkdir(parents=True)
    for d in (cpu_pod, cpu_pod.parent):
        (d / V1_FILE).write_text("2\n")
    kubepods = tmp_path / "freezer" / "kubepods"
    layout = CgroupLayout(CgroupVersion.V1, CgroupDriver.CGROUPFS, tmp_path / "freezer", (kubepods,))
    cg = PodCgroup("1", layout, (freezer_pod,))
    boost = ExitBoost()
    (tmp_path / "cpu,cpuacct" / V1_FILE).write_text("1024\n")  # the hierarchy's root
    (cpu_pod.parent.parent / V1_FILE).write_text("2048\n")
    held = boost.raise_for([cg])
    assert sorted(held) == sorted([cpu_pod / V1_FILE, cpu_pod.parent / V1_FILE, cpu_pod.parent.parent / V1_FILE])
    assert (cpu_pod / V1_FILE).read_text() == V1_MAX
    assert (tmp_path / "cpu,cpuacct" / V1_FILE).read_text() == "1024\n"
    boost.restore(held)
    assert (cpu_pod.parent / V1_FILE).read_text() == "2"
    assert (cpu_pod.parent.parent / V1_FILE).read_text() == "2048"


def test_without_a_cpu_controller_nothing_is_raised_and_the_kill_goes_on(tmp_path: Path) -> None:
    cg, _, _ = _v2(tmp_path, "besteffort")
    for d in (cg.dirs[0], cg.dirs[0].parent, cg.dirs[0].parent.parent):
        (d / V2_FILE).unlink()
    assert ExitBoost().raise_for([cg]) == []


def test_raise_and_restore_from_many_threads_leave_the_weights_as_they_were(tmp_path: Path) -> None:
    cg, qos, _ = _v2(tmp_path, "besteffort")
    boost = ExitBoost()

    def kill() -> None:
        for _ in range(50):
            boost.restore(boost.raise_for([cg]))

    threads = [threading.Thread(target=kill) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert (qos / V2_FILE).read_text() == "1" and boost.raised() == {}


def test_a_kill_the_agent_never_finished_is_put_back_when_it_starts_again(tmp_path: Path) -> None:
    cg, qos, kubepods = _v2(tmp_path, "besteffort")
    journal = tmp_path / "run" / "exit-boost.json"
    ExitBoost(journal).raise_for([cg])  # the agent dies here: nothing restores
    assert journal.exists()
    (qos / V2_FILE).write_text("7")  # kubelet wrote the QoS weight meanwhile: that one is kubelet's now
    restored = ExitBoost(journal).recover(tmp_path)
    assert sorted(restored) == sorted([cg.dirs[0] / V2_FILE, kubepods / V2_FILE])
    assert (kubepods / V2_FILE).read_text() == "76" and (qos / V2_FILE).read_text() == "7"
    assert not journal.exists()
    assert ExitBoost(journal).recover(tmp_path) == []  # nothing left to do


def test_the_journal_lists_only_what_is_raised_now(tmp_path: Path) -> None:
    cg, _, _ = _v2(tmp_path, "besteffort")
    journal = tmp_path / "exit-boost.json"
    boost = ExitBoost(journal)
    held = boost.raise_for([cg])
    assert len(json.loads(journal.read_text())) == 3
    boost.restore(held)
    assert not journal.exists()


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("not json", "is not a weight journal"),
        ("[1, 2]", "the journal is a list"),
        ('{"/etc/passwd": ["1", "10000"]}', "'/etc/passwd'"),  # not below the cgroup root
        ('{"CG/kubepods/cpu.weight": "10000"}', "cpu.weight"),  # not an [original, raised] pair
        ('{"CG/kubepods/../../x/cpu.weight": ["1", "10000"]}', ".."),
        ('{"CG/kubepods/cgroup.procs": ["1", "10000"]}', "cgroup.procs"),
    ],
)
def test_a_journal_that_is_no_weight_journal_is_refused_by_name_and_writes_nothing(
    tmp_path: Path, text: str, named: str
) -> None:
    _, _, kubepods = _v2(tmp_path, "besteffort")
    (kubepods / V2_FILE).write_text(V2_MAX)
    (kubepods / "cgroup.procs").write_text("10000")
    journal = tmp_path / "exit-boost.json"
    journal.write_text(text.replace("CG", str(tmp_path)))
    with pytest.raises(ExitBoostJournalError, match=re.escape(named)):
        ExitBoost(journal).recover(tmp_path)
    assert (kubepods / V2_FILE).read_text() == V2_MAX and (kubepods / "cgroup.procs").read_text() == "10000"
    assert not journal.exists()  # refused once, not at every start


@pytest.mark.skipif(bool(skip_reason(CgroupVersion.V1)), reason=skip_reason(CgroupVersion.V1) or "ok")
def test_the_kernel_takes_the_raise_and_the_restore_in_real_v1_cgroups() -> None:
    cpu_root = next(
        (Path(CGROUP_ROOT, n) for n in ("cpu", "cpu,cpuacct") if Path(CGROUP_ROOT, n, V1_FILE).exists()), None
    )
    assert cpu_root is not None, f"no v1 cpu hierarchy under {CGROUP_ROOT}"
    top = f"gs-boost-{os.getpid()}-{time.monotonic_ns() % 10**9}"
    rel = Path(top, "kubepods", "besteffort", "pod1")
    freezer = Path(CGROUP_ROOT, "freezer")
    made = [freezer / rel, cpu_root / rel]
    try:
        for d in made:
            d.mkdir(parents=True)
        for level in (cpu_root / rel, cpu_root / rel.parent):
            (level / V1_FILE).write_text("2")
        layout = CgroupLayout(CgroupVersion.V1, CgroupDriver.CGROUPFS, freezer, (freezer / top / "kubepods",))
        boost = ExitBoost()
        held = boost.raise_for([PodCgroup("1", layout, (freezer / rel,))])
        levels = [cpu_root / rel, cpu_root / rel.parent, cpu_root / top / "kubepods", cpu_root / top]
        assert sorted(held) == sorted(d / V1_FILE for d in levels)
        assert {(d / V1_FILE).read_text().strip() for d in levels} == {V1_MAX}  # as the kernel reports it
        boost.restore(held)
        assert [(d / V1_FILE).read_text().strip() for d in levels[:2]] == ["2", "2"]
        assert [(d / V1_FILE).read_text().strip() for d in levels[2:]] == ["1024", "1024"]
    finally:
        for base in (freezer, cpu_root):
            for d in sorted((base / top).glob("**/"), key=lambda x: -len(x.parts)):
                d.rmdir()
