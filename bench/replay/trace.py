"""Alibaba's GPU trace as plain data, and the FGD paper's way of drawing a workload from it.

The paper's simulator (its ``TunePodsByNodeTotalResource`` and ``SortClusterPods``) draws trace
tasks uniformly *with replacement* until their GPU requests reach a multiple of the cluster's GPU
capacity (1.3 for its headline table), then shuffles them by seed; tasks are placed one after
another and none leaves. ``draw_workload`` does the same with Python's ``random.Random(seed)``,
so a seed here draws a different sample than the simulator's Go generator does with the same
number: the comparison is between means over seeds, not run for run.
"""

from __future__ import annotations

import csv
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data" / "alibaba-openb"
NODE_FILE = DATA / "openb_node_list_gpu_node.csv"
POD_FILE = DATA / "openb_pod_list_default.csv"
MILLI_PER_GPU = 1000


class TraceError(ValueError):
    """A trace file that cannot be read as the trace: names the file, the row and the field."""


@dataclass(frozen=True)
class TraceNode:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


@dataclass(frozen=True)
class TracePod:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int  # of each of its GPUs; 1000 for a whole GPU, 0 without one

    @property
    def gpu_request(self) -> int:
        """GPU milli the task asks for in all: what the paper's arrival and allocation ratios add up."""
        return self.num_gpu * self.gpu_milli

    @property
    def shares(self) -> bool:
        """Asks for part of one GPU (the trace's GPU-sharing tasks)."""
        return self.num_gpu == 1 and self.gpu_milli < MILLI_PER_GPU


def _int(row: dict[str, str], field: str, where: str, low: int, high: int) -> int:
    raw = row.get(field)
    try:
        value = int(raw or "")
    except ValueError:
        raise TraceError(f"{where}: {field}={raw!r} is not an integer") from None
    if not low <= value <= high:
        raise TraceError(f"{where}: {field}={value} is outside {low}..{high}")
    return value


def _rows(path: Path, columns: Sequence[str]) -> list[tuple[str, dict[str, str]]]:
    try:
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            missing = [c for c in columns if c not in (reader.fieldnames or ())]
            if missing:
                raise TraceError(f"{path}: no column {', '.join(missing)}")
            return [(f"{path.name} line {i}", row) for i, row in enumerate(reader, start=2)]
    except OSError as e:
        raise TraceError(f"{path}: {e.strerror or e}") from None


def load_nodes(path: Path = NODE_FILE) -> list[TraceNode]:
    nodes = []
    for where, row in _rows(path, ("sn", "cpu_milli", "memory_mib", "gpu", "model")):
        nodes.append(
            TraceNode(
                name=row["sn"],
                cpu_milli=_int(row, "cpu_milli", where, 1, 10**7),
                memory_mib=_int(row, "memory_mib", where, 1, 10**9),
                gpus=_int(row, "gpu", where, 1, 64),
                model=row["model"],
            )
        )
    if not nodes:
        raise TraceError(f"{path}: no nodes")
    return nodes


def load_pods(path: Path = POD_FILE) -> list[TracePod]:
    pods = []
    for where, row in _rows(path, ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")):
        pod = TracePod(
            name=row["name"],
            cpu_milli=_int(row, "cpu_milli", where, 0, 10**7),
            memory_mib=_int(row, "memory_mib", where, 0, 10**9),
            num_gpu=_int(row, "num_gpu", where, 0, 64),
            gpu_milli=_int(row, "gpu_milli", where, 0, MILLI_PER_GPU),
        )
        if pod.num_gpu and not pod.gpu_milli:
            raise TraceError(f"{where}: num_gpu={pod.num_gpu} with gpu_milli=0")
        if pod.num_gpu > 1 and pod.gpu_milli != MILLI_PER_GPU:
            raise TraceError(f"{where}: {pod.num_gpu} GPUs of {pod.gpu_milli} milli each (several GPUs are whole)")
        if not pod.num_gpu and pod.gpu_milli:
            pod = TracePod(pod.name, pod.cpu_milli, pod.memory_mib, 0, 0)
        pods.append(pod)
    if not any(p.gpu_request for p in pods):
        raise TraceError(f"{path}: no task asks for a GPU")
    return pods


def gpu_capacity(nodes: Sequence[TraceNode]) -> int:
    """The cluster's GPUs in milli."""
    return sum(n.gpus for n in nodes) * MILLI_PER_GPU


def draw_workload(pods: Sequence[TracePod], capacity_milli: int, *, arrival: float, seed: int) -> list[TracePod]:
    """Tasks drawn with replacement until their GPU requests reach ``arrival`` times the capacity, shuffled.

    The last task drawn is the one whose request reaches the target, as in the simulator: the
    workload's GPU request is at least the target, by less than one task.
    """
    if arrival <= 0:
        raise ValueError(f"arrival must be positive, not {arrival}")
    if not any(p.gpu_request for p in pods):
        raise ValueError("no task asks for a GPU: the target could never be reached")
    rng = random.Random(seed)
    target = arrival * capacity_milli
    drawn: list[TracePod] = []
    total = 0
    while total < target:
        pod = pods[rng.randrange(len(pods))]
        drawn.append(pod)
        total += pod.gpu_request
    rng.shuffle(drawn)
    return drawn


def node_slice(nodes: Sequence[TraceNode], count: int) -> list[TraceNode]:
    """``count`` nodes spread evenly over the list (which is grouped by model), so a small cluster
    keeps the trace's mix of 1-, 2-, 4- and 8-GPU nodes; all of them when ``count`` is no smaller."""
    if count <= 0:
        raise ValueError(f"a slice needs at least one node, not {count}")
    if count >= len(nodes):
        return list(nodes)
    return [nodes[i * len(nodes) // count] for i in range(count)]
