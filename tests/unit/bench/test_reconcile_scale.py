"""The decision-cost benchmark measures what it says: sizes, pods per node, the leader's caches, growth."""

from __future__ import annotations

import argparse

import pytest

from bench.reconcile_scale import (
    PODS_PER_NODE,
    growth_per_10x,
    main,
    parse_nodes,
    synthetic_cluster,
)
from controller.core.model import build_snapshot
from gpushare import keys
from gpushare.config import Config


@pytest.mark.parametrize("nodes", [10, 30])
def test_the_synthetic_cluster_has_twenty_pods_per_node_and_every_role(nodes: int) -> None:
    c = synthetic_cluster(nodes)
    assert len(c.pods) == nodes * PODS_PER_NODE
    assert len({(p["metadata"]["namespace"], p["metadata"]["name"]) for p in c.pods}) == len(c.pods)
    snap = build_snapshot(c.pods, Config(node_name="node-0000"))
    assert not snap.problems and snap.shadows and snap.spot_pods
    assert any(s.is_pending for s in snap.sharers) and any(s.holds_slots for s in snap.sharers)
    node, pending, shadows = c.leader_caches()
    assert {p["spec"]["nodeName"] for p in node} == {"node-0000"}
    assert all(not p["spec"].get("nodeName") for p in pending)
    assert len(shadows) == len(snap.shadows) and all(
        p["metadata"]["namespace"] == keys.DEFAULT_NAMESPACE for p in shadows
    )


def test_growth_per_10x_is_10_for_linear_cost() -> None:
    assert growth_per_10x((100, 2.0), (1000, 20.0)) == pytest.approx(10.0)
    assert growth_per_10x((100, 2.0), (300, 6.0)) == pytest.approx(10.0)
    assert growth_per_10x((100, 1.0), (1000, 100.0)) == pytest.approx(100.0)


def test_node_list_is_read_and_bad_lists_are_refused_by_name() -> None:
    assert parse_nodes("1000,100,300") == [100, 300, 1000]
    with pytest.raises(argparse.ArgumentTypeError, match="separated by commas"):
        parse_nodes("100;300")
    with pytest.raises(argparse.ArgumentTypeError, match="at least 10"):
        parse_nodes("5,100")


def test_a_small_run_prints_a_row_per_size(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--nodes", "10,20", "--repeats", "2"]) == 0  # the goal is at 1,000 nodes: not measured
    out = capsys.readouterr().out
    assert "    10     200" in out and "    20     400" in out  # nodes, pods: 20 per node
    assert "10 -> 20 nodes" in out and "not measured" in out
