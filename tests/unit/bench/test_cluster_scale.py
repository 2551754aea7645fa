"""The cluster-scale benchmark prints what it measured: the table, the ratios, the growth, the faults."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from bench.cluster_scale import STAGES, Row, Timeline, parse_nodes, render
from localcluster.scale import SchedulerCounts


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
        pipeline={s: (1.0, 2.0, None if s == "sharers bound" else 3.0) for s in STAGES},
        plain_writes={"POST pods": 2.0 * nodes, "POST pods/binding": 2.0 * nodes},
        sharer_writes={"POST pods": 10.0 * nodes, "POST pods/binding": 10.0 * nodes, "PATCH pods": 16.0 * nodes},
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
    t = Timeline.empty()
    for at, n in ((0.5, 0), (1.0, 3), (1.5, 9), (2.0, 10)):
        t.add(at, {"shadows bound": n})
    assert (t.reached("shadows bound", 0.5), t.reached("shadows bound", 0.9), t.reached("shadows bound", 1.0)) == (
        1.5,
        1.5,
        2.0,
    )
    assert t.reached("sharers bound", 0.5) is None


def test_api_writes_per_bound_pod_compare_the_phases_kind_by_kind() -> None:
    out = render([row(100)], idle_s=15)
    assert "API writes per bound pod (everyone's), plain / sharers: 2.00 / 4.50 (2.25x); PATCH pods 0.00/2.00, " in out
    assert "POST pods 1.00/1.25" in out and "POST pods/binding 1.00/1.25" in out
