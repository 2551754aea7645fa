"""Alibaba's GPU trace on a 50-node slice, in every mode, through the real scheduler and gpushare.

The benchmark (bench/trace_replay.py) measures how much each mode allocates; this tier holds the
same replay to what must be true whatever the figures: no GPU holds more than 1000 milli, every
sharer holds its own shadow's or claim's GPU on its own node, no pod is refused at admission by
its node, and every task is either placed or found unschedulable by the scheduler. No timing or
ratio is asserted.
"""

from __future__ import annotations

from pathlib import Path

from bench.replay.modes import Mode
from bench.replay.report import plot
from bench.replay.trace import draw_workload, gpu_capacity, load_nodes, load_pods, node_slice
from bench.trace_replay import family_scheduler, replay_one
from localcluster.cluster import Cluster
from tests.harness.worlds.replay import replay_world

NODES = 50
SEED = 42
ARRIVAL = 1.3


def test_a_slice_of_the_trace_replays_in_every_mode_and_every_invariant_holds(
    cluster: Cluster, kwok: Path, tmp_path: Path
) -> None:
    nodes = node_slice(load_nodes(), NODES)
    tasks = len(draw_workload(load_pods(), gpu_capacity(nodes), arrival=ARRIVAL, seed=SEED))
    outcomes = []
    try:
        for dra in (False, True):
            cluster.restart_scheduler(family_scheduler("binpack", dra=dra))
            with replay_world(cluster, tmp_path / f"dra-{dra}", nodes, dra=dra) as world:
                for mode in (m for m in Mode if m.dra == dra):
                    outcome = replay_one(world, mode, seed=SEED, profile="binpack", arrival=ARRIVAL)
                    assert outcome.problems == (), (mode, outcome.problems[:20])
                    assert outcome.tasks == tasks, mode
                    assert outcome.arrived >= ARRIVAL * 100
                    # 130 % of the GPUs were asked for: something must be left over, and something placed.
                    assert 0 < outcome.unplaced_gpu_tasks < outcome.gpu_tasks, mode
                    assert 0 < outcome.gpus_in_use <= outcome.gpus, mode
                    outcomes.append(outcome)
                    world.clear()
    finally:
        cluster.restart_scheduler(None)
    assert [o.mode for o in outcomes] == [str(m) for m in Mode]
    # The benchmark draws its picture from its own output: the same code on this tier's runs.
    picture = tmp_path / "replay.png"
    plot(outcomes, picture, profile="binpack", nodes=NODES)
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
