"""How the cost of the controller's decision code grows with the cluster, sizes side by side.

For each size in ``--nodes`` (default 100, 300 and 1,000 nodes), a synthetic cluster of 8 GPUs
and 20 pods per node: shadows of every kind and N (one in ten nodes' worth unschedulable),
sharers bound to them (with and without mapping records), pending sharers, lendable owners,
spot borrowers and plain pods, as the API's JSON that ``controller.io.kube_client`` hands the
core. No API server: only the decision code runs. Timed per size:

- **leader, cold**: ``controller.share.cluster_pass.plan_cluster`` over the caches the leader has
  (its node's pods, every unscheduled pod, every shadow; "leader reads" in the table): merge,
  snapshot, ``plan_shadows`` and the unschedulable-shadow Warnings, every pod read afresh.
- **leader, 1 pod changed**: the same, with the ``SnapshotMemo`` kept from the previous pass,
  after one pod changed (a new resourceVersion): a pass on a pod event.
- **every pod**: ``build_snapshot`` of all the cluster's pods + ``plan_shadows``; no agent
  reads bound pods of other nodes, so this bounds what reading pods can cost.
- **node pass** (every agent, its own node): snapshot of the node's pods + mapping + node
  shares + spot. It does not depend on the cluster's size.

Goal: both leader passes within 150 ms at 1,000 nodes / 20,000 pods, and growth close to 10x
per 10x nodes. Sizes are timed round-robin (one pass of each size, then the next round), so
drift of a shared machine hits every size alike; each figure is the median of the rounds with
its 95 % bootstrap interval (bench/stats.py). Times are the process's CPU time: the code is
single-threaded, so on an idle core CPU and wall time agree, and on a busy machine CPU time
still measures the code rather than the wait for a core (wall-clock medians follow). The
synthetic pods stand for the agent's watch caches and are frozen out of the garbage
collector (``gc.freeze``); what a pass allocates is collected as usual.

Run: ``.venv/bin/python bench/reconcile_scale.py [--nodes 100,300,1000] [--repeats N] [--quick]``
"""

from __future__ import annotations

import argparse
import gc
import itertools
import math
import os
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.stats import Estimate, estimate_median
from controller.core.detectors import IdleVerdict
from controller.core.mapping import MappingCache
from controller.core.model import (
    PodResourcesEntry,
    SnapshotMemo,
    build_snapshot,
    encode_owner_annotation,
    encode_users_annotation,
)
from controller.share.cluster_pass import plan_cluster
from controller.share.solver import plan_node_shares, plan_shadows
from controller.spot.solver import KmodView, plan_spot
from gpushare import keys
from gpushare.config import Config
from gpushare.ids import format_spot_id

GPUS_PER_NODE = 8
PODS_PER_NODE = 20
DEFAULT_NODES = (100, 300, 1000)
GOAL_NODES = 1000
GOAL_S = 0.150
REPEATS = 15
QUICK_REPEATS = 3
LEADER_NODE = "node-0000"
NOW = 1_000_000.0
# One shadow per this many nodes waits unschedulable, so the Warning path runs too.
NODES_PER_UNSCHEDULABLE_SHADOW = 10
SPECS = [(keys.KIND_SHARE, n) for n in (2, 3, 4, 5)] + [(keys.KIND_SHARE_DEV, n) for n in (2, 4, 8, 16)]


def _pod(name: str, ns: str, node: str, phase: str, requests: dict[str, int], **meta: Any) -> dict[str, Any]:
    res = {k: str(v) for k, v in requests.items()}
    spec: dict[str, Any] = {
        "containers": [{"name": "app", "image": "img", "resources": {"requests": res, "limits": dict(res)}}]
    }
    status: dict[str, Any] = {"phase": phase}
    if node:
        spec["nodeName"] = node
        status["containerStatuses"] = [
            {"name": "app", "containerID": f"containerd://{name}", "state": {"running": {"startedAt": "t"}}}
        ]
    metadata = {"name": name, "namespace": ns, "uid": f"uid-{ns}-{name}", "resourceVersion": "1"}
    metadata.update({k: v for k, v in meta.items() if v is not None})
    return {"metadata": metadata, "spec": spec, "status": status}


@dataclass
class SyntheticCluster:
    nodes: int
    pods: list[dict[str, Any]] = field(default_factory=list)
    rows: dict[str, list[PodResourcesEntry]] = field(default_factory=dict)  # PodResources per node

    def add(self, pod: dict[str, Any]) -> None:
        self.pods.append(pod)

    def pods_on(self, node: str) -> list[dict[str, Any]]:
        """What a node agent's watch holds: the pods bound to its node."""
        return [p for p in self.pods if p["spec"].get("nodeName") == node]

    def leader_caches(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
        """What the leader's watches hold: its node's pods, unscheduled pods, every shadow."""
        pending = [p for p in self.pods if not p["spec"].get("nodeName") and p["status"]["phase"] == "Pending"]
        shadows = [p for p in self.pods if p["metadata"]["namespace"] == keys.DEFAULT_NAMESPACE]
        return self.pods_on(LEADER_NODE), pending, shadows


def _shadow_with_sharers(c: SyntheticCluster, rnd: random.Random, node: str, *, gpu: int, ordinal: int) -> None:
    kind, n = SPECS[(ordinal + gpu) % len(SPECS)]  # every node gets a mix of kinds and N
    name = f"shadow-{kind}-{n}-00000000-{ordinal}"
    users: dict[str, list[str]] = {}
    sharers: list[dict[str, Any]] = []
    for i in range(rnd.randint(0, n)):
        sname = f"{name}-u{i}"
        vid = f"{keys.DEFAULT_NAMESPACE}/{name}-{i}"
        recorded = rnd.random() < 0.8
        if recorded:
            users[f"tenant/{sname}/app"] = [vid]
        owner = {keys.ANNOTATION_SHADOW_OWNER: encode_owner_annotation({f"{keys.DEFAULT_NAMESPACE}/{name}": "u"})}
        sharers.append(
            _pod(sname, "tenant", node, "Running", {keys.share_resource(kind, n): 1},
                 annotations=owner if recorded else None)
        )  # fmt: skip
        c.rows[node].append(PodResourcesEntry("tenant", sname, "app", keys.share_resource(kind, n), (vid,)))
    labels = {keys.LABEL_ROLE: keys.ROLE_SHADOW, keys.LABEL_SHARE_SPEC: str(n), keys.LABEL_SHARE_KIND: kind}
    record = {keys.ANNOTATION_SHADOW_USERS: encode_users_annotation(users)} if users else None
    c.add(_pod(name, keys.DEFAULT_NAMESPACE, node, "Running", {"nvidia.com/gpu": 1}, labels=labels, annotations=record))
    real = (f"GPU-{node}-{gpu}",)
    c.rows[node].append(PodResourcesEntry(keys.DEFAULT_NAMESPACE, name, keys.SHADOW_CONTAINER, "nvidia.com/gpu", real))
    for s in sharers:
        c.add(s)


def _owner(c: SyntheticCluster, node: str, gpu: str, g: int) -> None:
    """An owner on ``gpu``, lendable on odd GPUs; one spot borrower per node."""
    owner = f"owner-{node}-{g}"
    lendable = {keys.LABEL_LENDABLE: "true"} if g % 2 else None
    c.add(_pod(owner, "team", node, "Running", {"nvidia.com/gpu": 1}, labels=lendable))
    c.rows[node].append(PodResourcesEntry("team", owner, "app", "nvidia.com/gpu", (gpu,)))
    if g == 5:
        spot = f"spot-{node}-{g}"
        c.add(_pod(spot, "batch", node, "Running", {keys.RESOURCE_SPOT_GPU: 1}))
        c.rows[node].append(PodResourcesEntry("batch", spot, "app", keys.RESOURCE_SPOT_GPU, (format_spot_id(gpu),)))


def _unschedulable_shadow(ordinal: int, nodes: int) -> dict[str, Any]:
    kind, n = SPECS[ordinal % len(SPECS)]
    labels = {keys.LABEL_ROLE: keys.ROLE_SHADOW, keys.LABEL_SHARE_SPEC: str(n), keys.LABEL_SHARE_KIND: kind}
    pod = _pod(f"shadow-{kind}-{n}-00000000-{ordinal}", keys.DEFAULT_NAMESPACE, "", "Pending", {"nvidia.com/gpu": 1},
               labels=labels)  # fmt: skip
    message = f"0/{nodes} nodes are available: {nodes} Insufficient nvidia.com/gpu."
    pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "message": message}]
    return pod


def synthetic_cluster(nodes: int, pods_per_node: int = PODS_PER_NODE, seed: int = 7) -> SyntheticCluster:
    """``nodes`` x ``pods_per_node`` pods, and per node the PodResources rows kubelet would report."""
    total = nodes * pods_per_node
    rnd = random.Random(seed)
    c = SyntheticCluster(nodes)
    ordinal = 0
    for node in (f"node-{i:04d}" for i in range(nodes)):
        c.rows[node] = []
        for g in range(GPUS_PER_NODE):
            if len(c.pods) >= total:
                break
            if g < 4:  # half the GPUs back shadows
                _shadow_with_sharers(c, rnd, node, gpu=g, ordinal=ordinal)
                ordinal += 1
            else:  # the rest are owners
                _owner(c, node, f"GPU-{node}-{g}", g)
    for _ in range(nodes // NODES_PER_UNSCHEDULABLE_SHADOW):
        c.add(_unschedulable_shadow(ordinal, nodes))
        ordinal += 1
    node_names = list(c.rows)
    i = 0
    while len(c.pods) < total:  # pending sharers and plain pods fill up to the total
        if i % 3 == 0:
            kind, n = SPECS[i % len(SPECS)]
            c.add(_pod(f"pending-{i}", "tenant", "", "Pending", {keys.share_resource(kind, n): 1}))
        else:
            c.add(_pod(f"plain-{i}", "web", rnd.choice(node_names), "Running", {}))
        i += 1
    del c.pods[total:]
    return c


class NoApiServer:
    """``plan_cluster`` LISTs only to confirm a deletion, and with no idle timers none is planned."""

    def list_pods(
        self, *, namespace: str | None = None, label_selector: str | None = None, field_selector: str | None = None
    ) -> tuple[list[dict[str, Any]], str]:
        raise AssertionError("the bench planned a shadow deletion; it has no API server to confirm it")


LEADER_COLD = "leader, cold"
LEADER_EVENT = "leader, 1 pod changed"
EVERY_POD = "every pod"
NODE_PASS = "node pass"


@dataclass
class Pass:
    """One pass to time; ``before`` runs untimed ahead of each sample (the pod event)."""

    run: Callable[[], object]
    before: Callable[[], None] = lambda: None


def _pod_event(pods: list[dict[str, Any]]) -> Callable[[], None]:
    """Each call, one pod of ``pods`` changes (a new resourceVersion), round the list."""
    turn = [0]

    def change() -> None:
        i = turn[0] % len(pods)
        turn[0] += 1
        pod = pods[i]
        pods[i] = {**pod, "metadata": {**pod["metadata"], "resourceVersion": str(turn[0] + 1)}}

    return change


def passes(c: SyntheticCluster, cfg: Config) -> dict[str, Pass]:
    """The passes to time for one cluster, by the column they are printed in."""
    caches = c.leader_caches()
    node_pods = c.pods_on(LEADER_NODE)
    rows = c.rows[LEADER_NODE]
    gpus = [r.device_ids[0] for r in rows if r.resource == "nvidia.com/gpu"]
    verdicts = {gpu: IdleVerdict(gpu, "idle", NOW - 3600) for gpu in gpus}
    memo = SnapshotMemo()

    def node() -> object:
        snapshot = build_snapshot(node_pods, cfg, pod_resources=rows, shadow_list_fresh=True)
        mapping = MappingCache.rebuild(snapshot.pod_resources, snapshot.pods, cfg.real_resources)
        shares = plan_node_shares(snapshot, mapping, cfg)
        spot = plan_spot(
            snapshot, mapping, real_resources=cfg.real_resources, verdicts=verdicts, notices=(),
            kmod=KmodView(False), back_at={}, now=NOW, idle_window_s=cfg.idle_window_s,
        )  # fmt: skip
        return shares, spot

    return {
        LEADER_COLD: Pass(lambda: plan_cluster(cfg, NoApiServer(), caches, {}, NOW)),
        LEADER_EVENT: Pass(lambda: plan_cluster(cfg, NoApiServer(), caches, {}, NOW, memo=memo), _pod_event(caches[1])),
        EVERY_POD: Pass(lambda: plan_shadows(build_snapshot(c.pods, cfg, shadow_list_fresh=True), cfg, NOW, {})),
        NODE_PASS: Pass(node),
    }


@dataclass
class Samples:
    cpu_ms: list[float] = field(default_factory=list)
    wall_ms: list[float] = field(default_factory=list)

    def take(self, p: Pass) -> None:
        p.before()
        w0, c0 = time.perf_counter(), time.process_time()
        p.run()
        c1, w1 = time.process_time(), time.perf_counter()
        self.cpu_ms.append((c1 - c0) * 1000)
        self.wall_ms.append((w1 - w0) * 1000)


def measure(sizes: dict[int, dict[str, Pass]], repeats: int) -> dict[int, dict[str, Samples]]:
    """Round-robin over sizes and passes, after one untimed warm-up round (it also fills the memo)."""
    for by_pass in sizes.values():
        for p in by_pass.values():
            p.run()
    out = {n: {name: Samples() for name in by_pass} for n, by_pass in sizes.items()}
    for _ in range(repeats):
        for n, by_pass in sizes.items():
            for name, p in by_pass.items():
                out[n][name].take(p)
    return out


def growth_per_10x(small: tuple[int, float], large: tuple[int, float]) -> float:
    """The factor per 10x nodes that takes ``small`` (nodes, time) to ``large``: 10.0 is linear."""
    (n1, t1), (n2, t2) = small, large
    return float(10 ** (math.log(t2 / t1) / math.log(n2 / n1)))


def print_table(results: dict[int, dict[str, Samples]], inputs: dict[int, int]) -> dict[int, dict[str, Estimate]]:
    """CPU ms per pass (median and 95 % CI), wall-clock medians, and the growth between sizes."""
    names = list(next(iter(results.values())))
    est = {n: {name: estimate_median(s.cpu_ms) for name, s in r.items()} for n, r in results.items()}
    head = f"{'nodes':>6} {'pods':>7} {'leader reads':>13}"
    print("\nCPU ms per pass, median [95 % CI]")
    print(head + "".join(f"{name:>28}" for name in names))
    for n, r in results.items():
        cells = "".join(f"{est[n][x].median:>10.1f} {est[n][x].interval('.1f'):>17}" for x in r)
        print(f"{n:>6} {n * PODS_PER_NODE:>7,} {inputs[n]:>13,}{cells}")
    print("\nwall-clock ms per pass, median")
    print(head + "".join(f"{name:>28}" for name in names))
    for n, r in results.items():
        cells = "".join(f"{estimate_median(r[x].wall_ms).median:>28.1f}" for x in r)
        print(f"{n:>6} {n * PODS_PER_NODE:>7,} {inputs[n]:>13,}{cells}")
    print("\ngrowth of the CPU median per 10x nodes (linear: 10x)")
    for a, b in itertools.pairwise(sorted(results)):
        ratios = "".join(f"{growth_per_10x((a, est[a][x].median), (b, est[b][x].median)):>27.1f}x" for x in names)
        print(f"{f'{a:,} -> {b:,} nodes':>28}{ratios}")
    return est


def verdict(est: dict[int, dict[str, Estimate]]) -> bool:
    """The goal: a leader pass at 1,000 nodes within 150 ms of CPU, both cold and after a pod event."""
    goal = f"leader pass <= {GOAL_S * 1000:.0f} ms CPU at {GOAL_NODES:,} nodes / {GOAL_NODES * PODS_PER_NODE:,} pods"
    if GOAL_NODES not in est:
        print(f"\ngoal: {goal}: not measured (add {GOAL_NODES} to --nodes)")
        return True
    ok = True
    for name in (LEADER_COLD, LEADER_EVENT):
        median = est[GOAL_NODES][name].median
        met = median <= GOAL_S * 1000
        ok &= met
        print(f"goal: {goal}, {name}: {'met' if met else 'MISSED'} (median {median:.1f} ms)")
    return ok


def parse_nodes(text: str) -> list[int]:
    try:
        sizes = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"--nodes takes node counts separated by commas, got {text!r}") from None
    if not sizes or sizes[0] < NODES_PER_UNSCHEDULABLE_SHADOW:
        least = NODES_PER_UNSCHEDULABLE_SHADOW
        raise argparse.ArgumentTypeError(f"--nodes: each size must be at least {least}, got {text!r}")
    return sizes


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--nodes", type=parse_nodes, default=list(DEFAULT_NODES), help="sizes, e.g. 100,300,1000")
    ap.add_argument("--repeats", type=int, default=None, help=f"timed passes of each kind (default {REPEATS})")
    ap.add_argument("--quick", action="store_true", help=f"smoke run: {QUICK_REPEATS} passes of each kind")
    args = ap.parse_args(argv)
    repeats = args.repeats or (QUICK_REPEATS if args.quick else REPEATS)
    cfg = Config(node_name=LEADER_NODE)
    sizes: dict[int, dict[str, Pass]] = {}
    inputs: dict[int, int] = {}
    for n in args.nodes:
        c = synthetic_cluster(n)
        snap = build_snapshot(c.pods, cfg, shadow_list_fresh=True)
        leader_input = len({(p["metadata"]["namespace"], p["metadata"]["name"]) for v in c.leader_caches() for p in v})
        inputs[n] = leader_input
        print(
            f"{n:,} nodes: {len(c.pods):,} pods = {len(snap.shadows):,} shadows, {len(snap.sharers):,} sharers "
            f"({sum(s.is_pending for s in snap.sharers):,} pending), {len(snap.spot_pods):,} spot pods, "
            f"problems={len(snap.problems)}; the leader's caches hold {leader_input:,} of them"
        )
        sizes[n] = passes(c, cfg)
    # The pods stand for the watch caches, which live as long as the agent: out of the
    # collector's way, so one size's pods do not slow another size's collections.
    gc.collect()
    gc.freeze()
    print(f"{repeats} rounds, sizes round-robin; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    est = print_table(measure(sizes, repeats), inputs)
    return 0 if verdict(est) else 1


if __name__ == "__main__":
    raise SystemExit(main())
