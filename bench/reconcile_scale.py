"""One pass of the controller's decision code over a synthetic cluster.

The cluster: 100 nodes with 8 GPUs each and 2,000 pods — shadows of every kind and N,
sharers bound to them (with and without mapping records), pending sharers, lendable
owners, spot borrowers and plain pods — as ``V1Pod.to_dict()``-shaped dicts, the way the
kube I/O layer hands them over.

Measured, each repeated (default 15 times, ``--quick`` 3; median with its 95 % bootstrap
interval from bench/stats.py, min and max printed):

- cluster pass (what the Lease holder runs): ``build_snapshot`` of all 2,000 pods +
  ``plan_shadows``. Goal: < 1 s.
- node pass (what every agent runs, for one node): ``build_snapshot`` of that node's pods
  + ``MappingCache.rebuild`` + ``plan_node_shares`` + ``plan_spot``.

Run: ``.venv/bin/python bench/reconcile_scale.py [--repeats N] [--nodes N] [--pods N] [--quick]``
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.stats import estimate_median
from controller.core.detectors import IdleVerdict
from controller.core.mapping import MappingCache
from controller.core.model import PodResourcesEntry, build_snapshot, encode_owner_annotation, encode_users_annotation
from controller.core.share_solver import plan_node_shares, plan_shadows
from controller.core.spot_solver import KmodView, plan_spot
from gpushare import keys
from gpushare.config import Config
from gpushare.ids import format_spot_id

GPUS_PER_NODE = 8
REPEATS = 15
QUICK_REPEATS = 3
SPECS = [(keys.KIND_SHARE, n) for n in (2, 3, 4, 5)] + [(keys.KIND_SHARE_DEV, n) for n in (2, 4, 8, 16)]


def _pod(name: str, ns: str, node: str, phase: str, requests: dict[str, int], **meta: Any) -> dict[str, Any]:
    res = {k: str(v) for k, v in requests.items()}
    return {
        "metadata": {"name": name, "namespace": ns, "uid": f"uid-{ns}-{name}", **meta},
        "spec": {
            "node_name": node or None,
            "containers": [{"name": "app", "image": "img", "resources": {"requests": res, "limits": dict(res)}}],
        },
        "status": {"phase": phase, "container_statuses": [{"name": "app", "container_id": f"containerd://{name}"}]},
    }


def synthetic_cluster(nodes: int, total_pods: int, seed: int = 7) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Pods, and per node the PodResources rows kubelet would report."""
    rnd = random.Random(seed)
    pods: list[dict[str, Any]] = []
    rows: dict[str, list[PodResourcesEntry]] = {}
    node_names = [f"node-{i:03d}" for i in range(nodes)]
    shadow_count = 0
    for node in node_names:
        rows[node] = []
        for g in range(GPUS_PER_NODE):
            if len(pods) >= total_pods:
                break
            gpu = f"GPU-{node}-{g}"
            if g < 4:  # half the GPUs back shadows
                kind, n = SPECS[(shadow_count + g) % len(SPECS)]
                name = f"shadow-{kind}-{n}-00000000-{shadow_count}"
                shadow_count += 1
                users: dict[str, list[str]] = {}
                sharers: list[dict[str, Any]] = []
                for i in range(rnd.randint(0, n)):
                    sname = f"{name}-u{i}"
                    vid = f"{keys.SHADOW_NAMESPACE}/{name}-{i}"
                    recorded = rnd.random() < 0.8
                    if recorded:
                        users[f"tenant/{sname}/app"] = [vid]
                    ann = {keys.ANNOTATION_SHADOW_OWNER: encode_owner_annotation({f"gpushare-system/{name}": "u"})}
                    sharers.append(
                        _pod(sname, "tenant", node, "Running", {keys.share_resource(kind, n): 1},
                             annotations=ann if recorded else None)
                    )  # fmt: skip
                    rows[node].append(PodResourcesEntry("tenant", sname, "app", keys.share_resource(kind, n), (vid,)))
                labels = {keys.LABEL_ROLE: keys.ROLE_SHADOW, keys.LABEL_SHARE_SPEC: str(n), keys.LABEL_SHARE_KIND: kind}
                record = {keys.ANNOTATION_SHADOW_USERS: encode_users_annotation(users)} if users else None
                pods.append(
                    _pod(name, keys.SHADOW_NAMESPACE, node, "Running", {"nvidia.com/gpu": 1}, labels=labels,
                         annotations=record)
                )  # fmt: skip
                rows[node].append(PodResourcesEntry(keys.SHADOW_NAMESPACE, name, "main", "nvidia.com/gpu", (gpu,)))
                pods.extend(sharers)
            else:  # the rest are owners, half of them lendable, some lent out
                owner = f"owner-{node}-{g}"
                lendable = {keys.LABEL_LENDABLE: "true"} if g % 2 else None
                pods.append(_pod(owner, "team", node, "Running", {"nvidia.com/gpu": 1}, labels=lendable))
                rows[node].append(PodResourcesEntry("team", owner, "app", "nvidia.com/gpu", (gpu,)))
                if g == 5:
                    spot = f"spot-{node}-{g}"
                    pods.append(_pod(spot, "batch", node, "Running", {keys.RESOURCE_SPOT_GPU: 1}))
                    rows[node].append(
                        PodResourcesEntry("batch", spot, "app", keys.RESOURCE_SPOT_GPU, (format_spot_id(gpu),))
                    )
    i = 0
    while len(pods) < total_pods:  # pending sharers and plain pods fill up to the total
        if i % 3 == 0:
            kind, n = SPECS[i % len(SPECS)]
            pods.append(_pod(f"pending-{i}", "tenant", "", "Pending", {keys.share_resource(kind, n): 1}))
        else:
            pods.append(_pod(f"plain-{i}", "web", rnd.choice(node_names), "Running", {}))
        i += 1
    return pods[:total_pods], rows


def measure(fn: Callable[[], object], repeats: int) -> list[float]:
    fn()  # warm-up: imports, caches
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def report(label: str, samples: list[float], goal_s: float | None = None) -> bool:
    est = estimate_median([s * 1000 for s in samples])
    med = est.median / 1000
    line = f"{label}: median {est.median:.1f} ms (95 % CI {est.interval('.1f')})"
    line += f"  min {min(samples) * 1000:.1f} ms  max {max(samples) * 1000:.1f} ms"
    line += f"  (n={len(samples)})"
    ok = True
    if goal_s is not None:
        ok = med < goal_s
        line += f"  goal < {goal_s * 1000:.0f} ms: {'met' if ok else 'MISSED'}"
    print(line)
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--pods", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=None, help=f"timed passes of each kind (default {REPEATS})")
    ap.add_argument("--quick", action="store_true", help=f"smoke run: {QUICK_REPEATS} passes of each kind")
    args = ap.parse_args()
    repeats = args.repeats or (QUICK_REPEATS if args.quick else REPEATS)

    pods, rows = synthetic_cluster(args.nodes, args.pods)
    cfg = Config(node_name="node-000")
    now = 1_000_000.0
    first = build_snapshot(pods, cfg, shadow_list_fresh=True)
    print(
        f"synthetic cluster: {args.nodes} nodes, {len(pods)} pods = {len(first.shadows)} shadows, "
        f"{len(first.sharers)} sharers ({sum(s.is_pending for s in first.sharers)} pending), "
        f"{len(first.spot_pods)} spot pods; problems={len(first.problems)}"
    )

    def cluster_pass() -> object:
        snapshot = build_snapshot(pods, cfg, shadow_list_fresh=True)
        return plan_shadows(snapshot, cfg, now, {})

    plan = plan_shadows(first, cfg, now, {})
    print(f"cluster pass decides: {len(plan.actions)} actions over {len(plan.demand)} pool x kind x N keys")

    node = "node-000"
    node_pods = [p for p in pods if p["spec"]["node_name"] == node or p["metadata"]["name"].startswith("pending")]
    verdicts = {
        r.device_ids[0]: IdleVerdict(r.device_ids[0], "idle", now - 3600)
        for r in rows[node]
        if r.resource == "nvidia.com/gpu"
    }

    def node_pass() -> object:
        snapshot = build_snapshot(node_pods, cfg, pod_resources=rows[node], shadow_list_fresh=True)
        mapping = MappingCache.rebuild(snapshot.pod_resources, snapshot.pods, cfg.real_resources)
        shares = plan_node_shares(snapshot, mapping, cfg)
        spot = plan_spot(
            snapshot, mapping, real_resources=cfg.real_resources, verdicts=verdicts, notices=(),
            kmod=KmodView(False), back_at={}, now=now, idle_window_s=cfg.idle_window_s,
        )  # fmt: skip
        return shares, spot

    ok = report("cluster pass (build_snapshot + plan_shadows, 2,000 pods)", measure(cluster_pass, repeats), 1.0)
    report(f"node pass ({len(node_pods)} pods: snapshot + mapping + shares + spot)", measure(node_pass, repeats))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
