"""Sharers against plain GPU pods on simulated nodes: the real control plane, the real agent as leader.

One cluster (localcluster), kwok's simulated nodes with 8 fake GPUs each, ``gpushare agent``
as the only agent (so the leader), and the node side of every simulated node played by
``localcluster/sim_nodes.py`` with the agent's own node-pass code (docs/scale.md). For each
size, on the same cluster, grown from one size to the next:

1. **plain**: 2 pods per node asking the fake GPU directly (the baseline), created at once;
   the time until every one is bound; then deleted;
2. **sharers**: 8 ``share-gpu-4`` pods per node (one shadow per 4: 2 shadows per node),
   created at once; the time until every one is bound, and until the node side has recorded
   every one on its shadow; checked: each sharer on its shadow's node, no shadow over 4
   sharers, no more shadows than needed;
3. **idle GC**: the sharers deleted; the time until the leader has deleted every shadow
   (``shadowIdleTimeout`` is ``--idle`` seconds, part of that time).

Printed per size: seconds per bound pod for both (all pods' wall time over their count)
and their ratio (goal <= 1.5), each pod's time from create to bound (median and p90,
bench/stats.py), the leader's CPU seconds and peak RSS (goal <= 300 MiB), the agent's API
requests per sharer (goal <= 3; counted by the API server, see localcluster/scale.py), the
idle GC time; then the growth of each figure from one size to the next.

    .venv/bin/python bench/cluster_scale.py [--nodes 100,300,1000] [--idle 15] [--json FILE]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import itertools
import json
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.stats import median, percentile
from localcluster.bringup import running_cluster
from localcluster.scale import (
    SHARE_N,
    SHARE_RESOURCE,
    ScaleWorld,
    SchedulerCounts,
    agent_requests,
    api_writes,
    check_sharers,
    plain,
    process_usage,
    scheduler_counts,
    sharer,
    writes_between,
)

DEFAULT_NODES = (100, 300)
PLAIN_PER_NODE = 2
SHARERS_PER_NODE = 8
GOAL_RATIO = 1.5
GOAL_RSS_MIB = 300.0
GOAL_REQUESTS = 3.0
PIPELINE_FRACTIONS = (0.5, 0.9, 1.0)


@dataclass(frozen=True)
class Row:
    nodes: int
    plain: int
    sharers: int
    shadows: int
    plain_s_per_pod: float
    sharer_s_per_pod: float
    plain_median_s: float
    plain_p90_s: float
    sharer_median_s: float
    sharer_p90_s: float
    records_s: float
    leader_cpu_s: float
    leader_peak_rss_mib: float
    requests: int
    gc_s: float
    gc_requests: int
    refused: int
    leader_passes: int
    node_requests: int
    problems: tuple[str, ...]
    # The scheduler's own counts over each phase (its /metrics): attempts, API calls, QPS wait.
    plain_scheduler: SchedulerCounts
    sharer_scheduler: SchedulerCounts
    # Seconds from the first sharer's create until each pipeline stage reached PIPELINE_FRACTIONS
    # of its final count (None: never reached).
    pipeline: dict[str, tuple[float | None, ...]]
    # Every client's writes the API server served while each phase's pods were placed, by kind
    # (localcluster.scale.api_writes): what the phase asked of a control plane short of CPU.
    plain_writes: dict[str, float]
    sharer_writes: dict[str, float]

    @property
    def ratio(self) -> float:
        return self.sharer_s_per_pod / self.plain_s_per_pod

    @property
    def requests_per_sharer(self) -> float:
        return self.requests / self.sharers


# The stages a sharer's burst goes through, in order; ``Timeline`` records when each count grows.
STAGES = (
    "sharers created",
    "shadows created",
    "shadows bound",
    "shadows Running",
    "slots advertised",
    "sharers bound",
)


@dataclass
class Timeline:
    """How far each stage of the shadow pipeline had come at each poll: (seconds since the first
    create, count). Read at the end as the time each stage reached 50 %, 90 % and all of its
    final count, which shows where a burst of sharers waits."""

    samples: dict[str, list[tuple[float, int]]]

    @classmethod
    def empty(cls) -> Timeline:
        return cls({s: [] for s in STAGES})

    def add(self, at: float, counts: dict[str, int]) -> None:
        for stage, n in counts.items():
            self.samples[stage].append((at, n))

    def reached(self, stage: str, fraction: float) -> float | None:
        points = self.samples[stage]
        if not points:
            return None
        goal = fraction * max(n for _, n in points)
        return next((at for at, n in points if n >= goal and n > 0), None)


def _pipeline_counts(world: ScaleWorld, created: int, bound: int) -> dict[str, int]:
    shadows = world.shadows()
    node_side = world.node_side
    slots = 0
    if node_side is not None:
        slots = sum(node_side.capacity_published(n).get(SHARE_RESOURCE, 0) for n in world.nodes)
    return {
        "sharers created": created,
        "shadows created": len(shadows),
        "shadows bound": sum(1 for s in shadows if (s.get("spec") or {}).get("nodeName")),
        "shadows Running": sum(1 for s in shadows if (s.get("status") or {}).get("phase") == "Running"),
        "slots advertised": slots,
        "sharers bound": bound,
    }


def _create_and_bind(
    world: ScaleWorld, manifests: list[dict[str, Any]], timeout_s: float, timeline: Timeline | None = None
) -> tuple[float, list[float]]:
    """Create all, wait until all are bound: (wall seconds, each pod's create-to-bound seconds).

    With a ``timeline``, the pipeline's counts are sampled alongside (a thread, every 0.5 s)."""
    created: dict[str, float] = {}
    bound: dict[str, float] = {}
    t0 = time.monotonic()
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.5):
            assert timeline is not None
            timeline.add(time.monotonic() - t0, _pipeline_counts(world, len(created), len(bound)))

    sampler = threading.Thread(target=sample, name="timeline", daemon=True)
    if timeline is not None:
        sampler.start()

    def make(m: dict[str, Any]) -> None:
        world.client.create_pod(m)
        created[m["metadata"]["name"]] = time.monotonic()

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        for f in [pool.submit(make, m) for m in manifests]:
            f.result()

    def all_bound() -> bool:
        now = time.monotonic()
        for p in world.pods():
            if (p.get("spec") or {}).get("nodeName"):
                bound.setdefault(p["metadata"]["name"], now)
        return len(bound) == len(manifests)

    try:
        world.wait(f"{len(manifests)} pods bound", all_bound, timeout_s, poll_s=0.5)
    finally:
        done.set()
        if timeline is not None:
            sampler.join()
            timeline.add(time.monotonic() - t0, _pipeline_counts(world, len(created), len(bound)))
    wall = max(bound.values()) - t0
    return wall, [bound[n] - created[n] for n in created]


def run_size(world: ScaleWorld, nodes: int, timeout_s: float) -> Row:
    n_plain, n_sharers = PLAIN_PER_NODE * nodes, SHARERS_PER_NODE * nodes
    sched0, writes0 = scheduler_counts(world.cluster), api_writes(world.cluster)
    plain_wall, plain_each = _create_and_bind(world, [plain(f"plain-{i}") for i in range(n_plain)], timeout_s)
    sched1, writes1 = scheduler_counts(world.cluster), api_writes(world.cluster)
    world.delete_all(timeout_s)

    requests0, usage0 = agent_requests(world.cluster), process_usage(world.agent.pid)
    passes0 = int(world.agent.status()["passes"])
    node0 = world.node_side.writer.requests if world.node_side is not None else 0
    sched2, writes2 = scheduler_counts(world.cluster), api_writes(world.cluster)
    timeline = Timeline.empty()
    sharer_wall, sharer_each = _create_and_bind(
        world, [sharer(f"sharer-{i}") for i in range(n_sharers)], timeout_s, timeline
    )
    sched3, writes3 = scheduler_counts(world.cluster), api_writes(world.cluster)
    records_s = world.wait("every sharer recorded", lambda: world.records_written(n_sharers), timeout_s)
    requests1, usage1 = agent_requests(world.cluster), process_usage(world.agent.pid)
    passes1 = int(world.agent.status()["passes"])
    node1 = world.node_side.writer.requests if world.node_side is not None else 0
    shadows = world.shadows()
    problems = check_sharers(world.pods(), shadows)

    world.delete_pods(world.pods())
    gc_s = world.wait("every idle shadow deleted", lambda: not world.shadows(), timeout_s)
    requests2 = agent_requests(world.cluster)
    world.wait("the test pods gone", lambda: not world.pods(), timeout_s)
    return Row(
        nodes=nodes,
        plain=n_plain,
        sharers=n_sharers,
        shadows=len(shadows),
        plain_s_per_pod=plain_wall / n_plain,
        sharer_s_per_pod=sharer_wall / n_sharers,
        plain_median_s=median(plain_each),
        plain_p90_s=percentile(plain_each, 90),
        sharer_median_s=median(sharer_each),
        sharer_p90_s=percentile(sharer_each, 90),
        records_s=records_s,
        leader_cpu_s=usage1.cpu_s - usage0.cpu_s,
        leader_peak_rss_mib=usage1.peak_rss_mib,
        requests=requests1 - requests0,
        gc_s=gc_s,
        gc_requests=requests2 - requests1,
        refused=len(world.node_side.refused) if world.node_side is not None else 0,
        leader_passes=passes1 - passes0,
        node_requests=node1 - node0,
        problems=tuple(problems),
        plain_scheduler=sched1 - sched0,
        sharer_scheduler=sched3 - sched2,
        pipeline={s: tuple(timeline.reached(s, f) for f in PIPELINE_FRACTIONS) for s in STAGES},
        plain_writes=writes_between(writes0, writes1),
        sharer_writes=writes_between(writes2, writes3),
    )


def _growth(rows: Sequence[Row], of: Callable[[Row], float]) -> str:
    parts = [f"{of(b) / of(a):.1f}x" if of(a) else "n/a" for a, b in itertools.pairwise(rows)]
    return " -> ".join(parts)


def render(rows: Sequence[Row], idle_s: float) -> str:
    head = (
        "| nodes | plain pods | sharers | shadows | s/bound pod plain | s/bound pod sharers | ratio | "
        "create-to-bound median / p90, plain | same, sharers | leader CPU s | leader peak RSS MiB | "
        "agent requests / sharer | idle GC of all shadows s |"
    )
    lines = [head, "|" + "---:|" * 13]
    for r in rows:
        lines.append(
            f"| {r.nodes:,} | {r.plain:,} | {r.sharers:,} | {r.shadows:,} | {r.plain_s_per_pod:.4f} | "
            f"{r.sharer_s_per_pod:.4f} | {r.ratio:.2f} | {r.plain_median_s:.1f} / {r.plain_p90_s:.1f} | "
            f"{r.sharer_median_s:.1f} / {r.sharer_p90_s:.1f} | {r.leader_cpu_s:.1f} | {r.leader_peak_rss_mib:.0f} | "
            f"{r.requests_per_sharer:.2f} | {r.gc_s:.1f} |"
        )
    lines.append(f"(idle GC includes shadowIdleTimeout = {idle_s:g} s; sharers share-gpu-{SHARE_N})")
    if len(rows) > 1:
        lines.append("growth per step " + " -> ".join(f"{r.nodes}" for r in rows) + ":")
        lines.append(f"  nodes                 {_growth(rows, lambda r: r.nodes)}")
        lines.append(f"  s/bound pod, plain    {_growth(rows, lambda r: r.plain_s_per_pod)}")
        lines.append(f"  s/bound pod, sharers  {_growth(rows, lambda r: r.sharer_s_per_pod)}")
        lines.append(f"  leader CPU s          {_growth(rows, lambda r: r.leader_cpu_s)}")
        lines.append(f"  leader peak RSS       {_growth(rows, lambda r: r.leader_peak_rss_mib)}")
        lines.append(f"  requests per sharer   {_growth(rows, lambda r: r.requests_per_sharer)}")
        lines.append(f"  idle GC s             {_growth(rows, lambda r: r.gc_s)}")
    for r in rows:
        verdicts = [
            f"ratio {r.ratio:.2f} {'<=' if r.ratio <= GOAL_RATIO else '>'} {GOAL_RATIO}",
            f"RSS {r.leader_peak_rss_mib:.0f} MiB {'<=' if r.leader_peak_rss_mib <= GOAL_RSS_MIB else '>'} "
            f"{GOAL_RSS_MIB:.0f}",
            f"requests/sharer {r.requests_per_sharer:.2f} {'<=' if r.requests_per_sharer <= GOAL_REQUESTS else '>'} "
            f"{GOAL_REQUESTS:g}",
        ]
        verdicts.append(f"{r.refused} sharers bound where no slot was free (kubelet would refuse them)")
        verdicts.append(f"agent requests during idle GC {r.gc_requests}")
        verdicts.append(
            f"the node agents' requests per sharer {r.node_requests / r.sharers:.2f} (all agents together: "
            f"{(r.requests + r.node_requests) / r.sharers:.2f})"
        )
        verdicts.append(f"leader passes while the sharers were placed {r.leader_passes} (events coalesce)")
        lines.append(f"{r.nodes} nodes: " + "; ".join(verdicts))
        for what, pods, c in (("plain", r.plain, r.plain_scheduler), ("sharers", r.sharers, r.sharer_scheduler)):
            lines.append(
                f"  scheduler, {what}: {c.scheduled:.0f} scheduled, {c.unschedulable:.0f} unschedulable, "
                f"{c.errors:.0f} error attempts ({(c.scheduled + c.unschedulable + c.errors) / pods:.2f} per pod); "
                f"{c.requests:.0f} API requests ({c.requests / pods:.2f} per pod), {c.throttled_s:.1f} s waiting "
                "for its client's QPS"
            )
        lines.append(_writes_line(r))
        lines.append(
            "  sharers' pipeline, seconds from the first create until each stage reached "
            + " / ".join(f"{f:.0%}" for f in PIPELINE_FRACTIONS)
            + " of its final count:"
        )
        for stage, times in r.pipeline.items():
            shown = " / ".join("-" if t is None else f"{t:.1f}" for t in times)
            lines.append(f"    {stage:<17} {shown}")
        lines += [f"  PROBLEM: {p}" for p in r.problems[:20]]
    return "\n".join(lines)


def _writes_line(r: Row) -> str:
    """API writes per bound pod, both phases, with the kinds that differ most."""
    plain_total, sharer_total = sum(r.plain_writes.values()) / r.plain, sum(r.sharer_writes.values()) / r.sharers
    kinds = set(r.plain_writes) | set(r.sharer_writes)
    per = {k: (r.plain_writes.get(k, 0.0) / r.plain, r.sharer_writes.get(k, 0.0) / r.sharers) for k in kinds}
    top = sorted(per.items(), key=lambda kv: -max(kv[1]))[:8]
    detail = ", ".join(f"{k} {p:.2f}/{s:.2f}" for k, (p, s) in top)
    return (
        f"  API writes per bound pod (everyone's), plain / sharers: {plain_total:.2f} / {sharer_total:.2f} "
        f"({sharer_total / plain_total if plain_total else float('nan'):.2f}x); {detail}"
    )


def parse_nodes(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--nodes takes node counts separated by commas, got {text!r}") from None
    if not sizes or any(s < 1 for s in sizes) or sizes != sorted(set(sizes)):
        raise argparse.ArgumentTypeError(f"--nodes: increasing node counts of at least 1, got {text!r}")
    return sizes


def _interrupt(signum: int, _frame: object) -> None:
    """SIGTERM as Ctrl-C: the cluster, kwok and the agents are torn down by the ``finally`` blocks."""
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _interrupt)
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--nodes", type=parse_nodes, default=list(DEFAULT_NODES), help="sizes, e.g. 100,300,1000")
    ap.add_argument("--idle", type=float, default=15.0, help="shadowIdleTimeout in seconds (default 15)")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds each wait may take (default 1800)")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows as JSON here")
    args = ap.parse_args(argv)
    rows: list[Row] = []
    interrupted = False
    try:
        with running_cluster() as cluster:
            world = ScaleWorld(cluster, Path(tempfile.mkdtemp(prefix="gs-scale-")), idle_s=args.idle)
            try:
                world.start(args.nodes[0])
                for nodes in args.nodes:
                    if nodes != len(world.nodes):
                        world.grow(nodes)
                    row = run_size(world, nodes, args.timeout)
                    rows.append(row)
                    print(render([row], args.idle), flush=True)
            finally:
                world.close()
    except KeyboardInterrupt as exc:
        interrupted = True
        print(f"stopped ({exc or 'SIGINT'}); the cluster is down; the sizes finished:", flush=True)
    print(render(rows, args.idle))
    print(f"logs (agent, kwok): {world.side}")
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=2))
    return 1 if interrupted or any(r.problems for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
