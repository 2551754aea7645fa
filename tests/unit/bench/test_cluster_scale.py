"""The cluster-scale benchmark prints what it measured: the table, the ratios, the growth, the faults."""

from __future__ import annotations

import argparse
import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from bench.cluster_scale import (
    STAGES,
    Row,
    _create_and_bind,
    _pipeline,
    binding_floor,
    cpu_line,
    parse_nodes,
    render,
)
from localcluster.errors import ClusterError
from tests.harness.worlds.scale import (
    NAMESPACE,
    THIS_PROCESS,
    ClientLimit,
    SchedulerCounts,
    StageClock,
    client_limit_from_configz,
    sharer,
)
from tests.unit.controller.loop_pods import shadow


def row(nodes: int, **kw: object) -> Row:
    base = Row(
        nodes=nodes, plain=2 * nodes, sharers=8 * nodes, shadows=2 * nodes,
        plain_s_per_pod=0.02, sharer_s_per_pod=0.03, plain_median_s=1.0, plain_p90_s=2.0,
        sharer_median_s=3.0, sharer_p90_s=4.0, records_s=1.0, leader_cpu_s=nodes / 10,
        leader_peak_rss_mib=80.0, requests=nodes * 4, gc_s=20.0, gc_requests=nodes, refused=0, leader_passes=50,
        node_requests=nodes * 16,
        problems=(),
        plain_scheduler=SchedulerCounts(2 * nodes, 0, 0, 4 * nodes, 0.0),
        sharer_scheduler=SchedulerCounts(10 * nodes, 8 * nodes, 0, 30 * nodes, 12.5),
        scheduler_limit=ClientLimit(qps=50.0, burst=100.0),
        pipeline={s: (1.0, 2.0, None if s == "sharers bound" else 3.0) for s in STAGES},
        plain_writes={"POST pods": 2.0 * nodes, "POST pods/binding": 2.0 * nodes},
        sharer_writes={"POST pods": 10.0 * nodes, "POST pods/binding": 10.0 * nodes, "PATCH pods": 16.0 * nodes},
        plain_cpu={"kube-apiserver": 20.0, "etcd": 5.0, THIS_PROCESS: 2.0}, plain_cpu_wall_s=15.0,
        sharer_cpu={"kube-apiserver": 40.0, "leader agent": 6.0, THIS_PROCESS: 4.0}, sharer_cpu_wall_s=30.0,
        early=(0, 0),
    )  # fmt: skip
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def test_ratio_and_requests_per_sharer_are_derived_from_the_counts() -> None:
    r = row(100)
    assert r.ratio == pytest.approx(1.5) and r.requests_per_sharer == pytest.approx(0.5)


def test_the_table_has_a_row_per_size_the_growth_and_each_goal() -> None:
    out = render([row(100), row(300, leader_cpu_s=40.0)], idle_s=15)
    assert "| 100 | 200 | 800 | 200 |" in out and "| 300 | 600 | 2,400 | 600 |" in out
    assert "growth per step 100 -> 300" in out and "leader CPU s          4.0x" in out
    assert "100 nodes: ratio 1.50 <= 1.5; RSS 80 MiB <= 300; requests/sharer 0.50 <= 3" in out
    assert "the node agents' requests per sharer 2.00 (all agents together: 2.50)" in out
    assert "scheduler, plain: 200 scheduled, 0 unschedulable, 0 error attempts (1.00 per pod)" in out
    assert "scheduler, sharers: 1000 scheduled, 800 unschedulable, 0 error attempts (2.25 per pod); " in out
    assert "3000 API requests (3.75 per pod), 12.5 s waiting for its client's QPS" in out
    bad = render([row(100, sharer_s_per_pod=0.04, problems=("shadow x has 5 sharers, over its 4",))], idle_s=15)
    assert "ratio 2.00 > 1.5" in bad and "PROBLEM: shadow x has 5 sharers" in bad


def test_sizes_must_be_increasing_counts() -> None:
    assert parse_nodes("100,300,1000") == [100, 300, 1000]
    for text in ("300,100", "100;300", "0", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_nodes(text)


def test_the_pipeline_prints_when_each_stage_reached_its_share_of_the_final_count() -> None:
    out = render([row(100)], idle_s=15)
    assert "    shadows Running   1.0 / 2.0 / 3.0" in out and "    sharers bound     1.0 / 2.0 / -" in out


def test_the_pipeline_is_read_from_each_pods_own_stage_times() -> None:
    stages = StageClock()
    for i, (seen, placed, running) in enumerate(((11.0, 12.0, 14.0), (11.5, 13.0, 20.0))):
        stages.pod_seen("ADDED", shadow(f"box-{i}"), seen)
        stages.pod_seen("MODIFIED", shadow(f"box-{i}", node="n1"), placed)
        stages.pod_seen("MODIFIED", shadow(f"box-{i}", node="n1", phase="Running"), running)
    stages.capacity_published("n1", stages.resource, 4, 15.0)
    stages.capacity_published("n1", stages.resource, 8, 21.0)
    created = {f"s{i}": 10.0 + i / 10 for i in range(8)}
    bound = {f"s{i}": 16.0 + i for i in range(8)}
    got = _pipeline(stages, created, bound, t0=10.0)
    assert list(got) == list(STAGES)
    assert got["sharers created"] == pytest.approx((0.3, 0.7, 0.7))
    assert got["shadows created"] == (1.0, 1.5, 1.5)
    assert got["shadows bound"] == (2.0, 3.0, 3.0)
    assert got["shadows Running"] == (4.0, 10.0, 10.0)
    assert got["slots advertised"] == (5.0, 11.0, 11.0)
    assert got["sharers bound"] == (9.0, 13.0, 13.0)


class _Client:
    """Creates pods; the "watch" reports every other one bound before the create returns, the rest later."""

    def __init__(self, stages: StageClock) -> None:
        self.stages = stages
        self.later: list[dict[str, Any]] = []

    def create_pod(self, manifest: dict[str, Any]) -> None:
        name = manifest["metadata"]["name"]
        p = {"metadata": {"namespace": NAMESPACE, "name": name, "uid": f"uid-{name}"}, "spec": {"nodeName": "n1"}}
        if int(name.rsplit("-", 1)[1]) % 2:
            self.stages.pod_seen("ADDED", p, time.monotonic())
        else:
            self.later.append(p)


class _World:
    """What ``_create_and_bind`` may use of a ``ScaleWorld``; it has no way to LIST pods, so a phase that
    polled the API server would fail here."""

    def __init__(self) -> None:
        self.stages = StageClock()
        self.client = _Client(self.stages)
        self.cpu_reads = 0

    def cpu(self) -> dict[str, float]:
        self.cpu_reads += 1
        return {"kube-apiserver": 10.0 * self.cpu_reads, THIS_PROCESS: 1.0 * self.cpu_reads}

    def wait(self, what: str, ok: Callable[[], bool], timeout_s: float, poll_s: float = 1.0) -> float:
        threading.Timer(0.05, self._deliver_late).start()
        deadline = time.monotonic() + timeout_s
        while not ok():
            assert time.monotonic() < deadline, what
            time.sleep(0.01)
        return 0.0

    def _deliver_late(self) -> None:
        """The watch's events for the pods bound after their create returned, while the benchmark waits."""
        for p in self.client.later:
            self.stages.pod_seen("MODIFIED", p, time.monotonic())


def test_a_phase_is_timed_from_the_watchs_events_and_asks_the_api_server_nothing_while_it_waits() -> None:
    world = _World()
    phase = _create_and_bind(world, [sharer(f"sharer-{i}") for i in range(6)], timeout_s=10)  # type: ignore[arg-type]
    assert phase.early == 3  # seen bound before their create returned: counted as 0 s
    assert sorted(phase.each)[:3] == [0.0, 0.0, 0.0] and all(e >= 0.05 for e in sorted(phase.each)[3:])
    assert phase.wall_s >= 0.05 and phase.cpu == {"kube-apiserver": 10.0, THIS_PROCESS: 1.0}
    assert phase.cpu_wall_s >= phase.wall_s
    assert phase.pipeline["sharers bound"][2] == pytest.approx(phase.wall_s)


def test_the_cpu_line_names_each_process_most_first_and_this_process_last() -> None:
    line = cpu_line("plain", {"etcd": 10.3, THIS_PROCESS: 5.0, "kube-apiserver": 41.24, "kwok": 0.0}, 40.2, cores=2)
    assert line == (
        "  CPU s by process, plain: kube-apiserver 41.2, etcd 10.3, kwok 0.0, this process 5.0 "
        "(total 56.5 of 2 cores x 40.2 s wall)"
    )
    out = render([row(100)], idle_s=15)
    assert "  CPU s by process, sharers: kube-apiserver 40.0, leader agent 6.0, this process 4.0 (total 50.0 of " in out
    assert "seen bound before their create returned" not in out
    assert "3 plain, 0 sharers" in render([row(100, early=(3, 0))], idle_s=15)


def test_api_writes_per_bound_pod_compare_the_phases_kind_by_kind() -> None:
    out = render([row(100)], idle_s=15)
    assert "API writes per bound pod (everyone's), plain / sharers: 2.00 / 4.50 (2.25x); PATCH pods 0.00/2.00, " in out
    assert "POST pods 1.00/1.25" in out and "POST pods/binding 1.00/1.25" in out


def test_the_binding_floor_is_what_the_schedulers_bucket_lets_each_phases_bindings_take() -> None:
    # 100 nodes: 200 plain bindings, the first 100 from the burst, then 50 a second: 2 s for 200 pods;
    # 1,000 sharer bindings (800 sharers, 200 shadows): 18 s for 800 pods.
    plain, sharers = binding_floor(row(100))
    assert plain == pytest.approx(0.01) and sharers == pytest.approx(0.0225)
    out = render([row(100)], idle_s=15)
    assert "the scheduler's client (qps 50, burst 100) alone lets 200 plain bindings take no less than 0.0100 s" in out
    assert "the sharers' 1000 (their shadows' included) 0.0225 s: ratio at that floor 2.25" in out
    # A plain phase inside the burst has no floor: the ratio is not divided by zero.
    small = row(10)
    assert binding_floor(small)[0] == 0.0 and "ratio at that floor n/a" in render([small], idle_s=15)


def test_a_client_limit_counts_the_burst_once() -> None:
    lim = ClientLimit(qps=50.0, burst=100.0)
    assert lim.least_s(0) == 0.0 and lim.least_s(100) == 0.0 and lim.least_s(150) == pytest.approx(1.0)


def test_the_client_limit_is_read_from_configz_in_either_spelling_and_a_missing_one_is_named() -> None:
    go_names = '{"componentconfig": {"Parallelism": 16, "ClientConnection": {"QPS": 50, "Burst": 100}}}'
    assert client_limit_from_configz(go_names) == ClientLimit(50.0, 100.0)
    camel = '{"componentconfig": {"clientConnection": {"qps": 100, "burst": 200}}}'
    assert client_limit_from_configz(camel) == ClientLimit(100.0, 200.0)
    with pytest.raises(ClusterError, match="no clientConnection"):
        client_limit_from_configz('{"componentconfig": {"Parallelism": 16}}')
    with pytest.raises(ClusterError, match="not a limit"):
        client_limit_from_configz('{"componentconfig": {"ClientConnection": {"QPS": -1, "Burst": 0}}}')
    for garbage, named in (
        ("<html>", "not JSON"),
        ('["componentconfig"]', "expected an object holding componentconfig"),
        ('{"componentconfig": {"ClientConnection": {"QPS": "50", "Burst": 100}}}', "must be numbers"),
    ):
        with pytest.raises(ClusterError, match=named):
            client_limit_from_configz(garbage)
