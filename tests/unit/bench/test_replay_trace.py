"""The trace as the replay reads it, and the FGD paper's way of drawing a workload from it."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from bench.replay.trace import (
    MILLI_PER_GPU,
    TraceError,
    TracePod,
    draw_workload,
    gpu_capacity,
    load_nodes,
    load_pods,
    node_slice,
)


def test_the_repository_holds_the_whole_trace() -> None:
    nodes, pods = load_nodes(), load_pods()
    assert (len(nodes), sum(n.gpus for n in nodes)) == (1213, 6212)
    assert len(pods) == 8152
    kinds = Counter("cpu" if not p.num_gpu else "share" if p.shares else f"{p.num_gpu} whole" for p in pods)
    assert kinds == {"cpu": 1088, "share": 3078, "1 whole": 3911, "2 whole": 16, "4 whole": 15, "8 whole": 44}
    assert sum(p.gpu_request for p in pods) == 6_086_800
    # Half the sharers ask for more than half a GPU: 1/N sharing rounds them up to a whole one.
    assert sum(1 for p in pods if p.shares and p.gpu_milli > 500) == 1478


def test_a_workload_reaches_its_target_by_less_than_one_task_and_a_seed_draws_the_same_one() -> None:
    pods, capacity = load_pods(), gpu_capacity(load_nodes())
    workload = draw_workload(pods, capacity, arrival=1.3, seed=42)
    total = sum(p.gpu_request for p in workload)
    assert 1.3 * capacity <= total < 1.3 * capacity + 8 * MILLI_PER_GPU
    assert workload == draw_workload(pods, capacity, arrival=1.3, seed=42)
    assert workload != draw_workload(pods, capacity, arrival=1.3, seed=43)
    # With replacement: about 10,600 tasks from 8,152, so some come more than once.
    assert len({p.name for p in workload}) < len(workload)


def test_a_slice_spreads_over_the_models_and_all_is_all() -> None:
    nodes = load_nodes()
    sliced = node_slice(nodes, 50)
    assert len(sliced) == 50
    assert {n.model for n in sliced} >= {"G2", "T4", "P100", "V100M16", "V100M32", "G3"}
    assert node_slice(nodes, 5000) == nodes
    with pytest.raises(ValueError, match="at least one node"):
        node_slice(nodes, 0)


def test_a_workload_with_no_gpu_task_is_refused_rather_than_drawn_forever() -> None:
    with pytest.raises(ValueError, match="no task asks for a GPU"):
        draw_workload([TracePod("cpu", 1000, 1024, 0, 0)], 1000, arrival=1.3, seed=1)
    with pytest.raises(ValueError, match="positive"):
        draw_workload(load_pods(), 1000, arrival=0, seed=1)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name,cpu_milli\n", "no column memory_mib, num_gpu, gpu_milli"),
        (
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1000,1024,1,abc\n",
            "line 2: gpu_milli='abc' is not an integer",
        ),
        ("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1000,1024,1,1500\n", "gpu_milli=1500 is outside 0..1000"),
        ("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1000,1024,2,500\n", "2 GPUs of 500 milli each"),
        ("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1000,1024,1,0\n", "num_gpu=1 with gpu_milli=0"),
        ("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1000,1024,0,0\n", "no task asks for a GPU"),
    ],
)
def test_a_bad_pod_file_is_named_with_its_line_and_field(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "pods.csv"
    path.write_text(text)
    with pytest.raises(TraceError, match=re.escape(message)):
        load_pods(path)


def test_a_missing_or_bad_node_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="No such file"):
        load_nodes(tmp_path / "absent.csv")
    path = tmp_path / "nodes.csv"
    path.write_text("sn,cpu_milli,memory_mib,gpu,model\nn,64000,1024,0,T4\n")
    with pytest.raises(TraceError, match=re.escape("line 2: gpu=0 is outside 1..64")):
        load_nodes(path)
