"""Sharers against plain GPU pods on simulated nodes: the real control plane, the real agent as leader.

One cluster (localcluster), kwok's simulated nodes with 8 fake GPUs each, ``gpushare agent``
as the only agent (so the leader), and the node side of every simulated node played by
``tests/harness/worlds/sim_nodes.py`` with the agent's own node-pass code (docs/scale.md). For each
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
requests per sharer (goal <= 3; counted by the API server, see tests/harness/worlds/scale.py), the
idle GC time, and per phase the CPU seconds each process spent (control plane, kwok, the
leader, this process); then the growth of each figure from one size to the next.

The benchmark shares the machine's cores with what it measures, so the timed part asks the
API server nothing beyond the creates: each pod's bound time, and each shadow's stages, are
noted by the node side's own watch when the event arrives (``tests.harness.worlds.scale.StageClock``).

    .venv/bin/python bench/cluster_scale.py [--nodes 100,300,1000] [--idle 15] [--json FILE]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import itertools
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.stats import median, percentile
from localcluster.bringup import running_cluster
from tests.harness.worlds.scale import (
    SHADOW_STAGES,
    SHARE_N,
    THIS_PROCESS,
    ClientLimit,
    ScaleWorld,
    SchedulerCounts,
    StageClock,
    agent_requests,
    api_writes,
    check_sharers,
    cpu_between,
    level_reached_at,
    plain,
    process_usage,
    reached_at,
    scheduler_client_limit,
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
    # The scheduler's client QPS and burst (its /configz): every binding waits on that bucket.
    scheduler_limit: ClientLimit
    # Seconds from the first sharer's create until each pipeline stage reached PIPELINE_FRACTIONS
    # of its final count (None: never reached), from each pod's own time (StageClock).
    pipeline: dict[str, tuple[float | None, ...]]
    # Every client's writes the API server served while each phase's pods were placed, by kind
    # (tests.harness.worlds.scale.api_writes): what the phase asked of a control plane short of CPU.
    plain_writes: dict[str, float]
    sharer_writes: dict[str, float]
    # CPU seconds by process while each phase's pods were placed, and the seconds that took:
    # where the machine's time went, the benchmark's own included.
    plain_cpu: dict[str, float]
    plain_cpu_wall_s: float
    sharer_cpu: dict[str, float]
    sharer_cpu_wall_s: float
    # Pods seen bound before their create returned (plain, sharers); their create-to-bound is 0 s.
    early: tuple[int, int]

    @property
    def ratio(self) -> float:
        return self.sharer_s_per_pod / self.plain_s_per_pod

    @property
    def requests_per_sharer(self) -> float:
        return self.requests / self.sharers


# The stages a sharer's burst goes through, in order; ``StageClock`` records when each pod reached each.
STAGES = (
    "sharers created",
    *SHADOW_STAGES,
    "slots advertised",
    "sharers bound",
)


@dataclass(frozen=True)
class Phase:
    """One burst of pods, created at once and waited for until every one is bound."""

    wall_s: float  # from the first create until the last pod was seen bound
    each: list[float]  # each pod's create-to-bound seconds
    early: int  # pods the watch saw bound before their create returned (counted as 0 s)
    cpu: dict[str, float]  # CPU seconds by process from just before the first create until all were bound
    cpu_wall_s: float  # the seconds those CPU seconds were spent in
    pipeline: dict[str, tuple[float | None, ...]]


def _pipeline(
    stages: StageClock, created: dict[str, float], bound: dict[str, float], t0: float
) -> dict[str, tuple[float | None, ...]]:
    """Seconds from ``t0`` until each stage reached PIPELINE_FRACTIONS of its final count (None: never)."""
    times = {
        "sharers created": sorted(created.values()),
        **stages.shadow_times(),
        "sharers bound": sorted(bound.values()),
    }
    slots = stages.slots()
    out: dict[str, tuple[float | None, ...]] = {}
    for stage in STAGES:
        at = [
            level_reached_at(slots, f) if stage == "slots advertised" else reached_at(times[stage], f)
            for f in PIPELINE_FRACTIONS
        ]
        out[stage] = tuple(None if a is None else a - t0 for a in at)
    return out


def _create_and_bind(world: ScaleWorld, manifests: list[dict[str, Any]], timeout_s: float) -> Phase:
    """Create all at once, wait until all are bound; each stage's time as the node side's watch saw it.

    Nothing here asks the API server how far the burst has come: the wait reads the stage
    clock in this process, so the timed part costs the control plane only the creates."""
    stages = world.stages
    stages.reset()
    created: dict[str, float] = {}
    cpu0 = world.cpu()
    t0 = time.monotonic()

    def make(m: dict[str, Any]) -> None:
        world.client.create_pod(m)
        created[m["metadata"]["name"]] = time.monotonic()

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        for f in [pool.submit(make, m) for m in manifests]:
            f.result()
    world.wait(f"{len(manifests)} pods bound", lambda: len(stages.bound()) >= len(manifests), timeout_s, poll_s=0.5)
    cpu1, t1 = world.cpu(), time.monotonic()
    bound = stages.bound()
    # The watch can report a pod bound before its POST has returned here (the scheduler is quick
    # and this process's create thread slow): that pod's create-to-bound counts as 0 s.
    each = [bound[n] - created[n] for n in created]
    return Phase(
        wall_s=max(bound[n] for n in created) - t0,
        each=[max(0.0, e) for e in each],
        early=sum(1 for e in each if e < 0),
        cpu=cpu_between(cpu0, cpu1),
        cpu_wall_s=t1 - t0,
        pipeline=_pipeline(stages, created, bound, t0),
    )


def run_size(world: ScaleWorld, nodes: int, timeout_s: float) -> Row:
    n_plain, n_sharers = PLAIN_PER_NODE * nodes, SHARERS_PER_NODE * nodes
    sched0, writes0 = scheduler_counts(world.cluster), api_writes(world.cluster)
    plain_phase = _create_and_bind(world, [plain(f"plain-{i}") for i in range(n_plain)], timeout_s)
    sched1, writes1 = scheduler_counts(world.cluster), api_writes(world.cluster)
    world.delete_all(timeout_s)

    requests0, usage0 = agent_requests(world.cluster), process_usage(world.agent.pid)
    passes0 = int(world.agent.status()["passes"])
    node0 = world.node_side.writer.requests if world.node_side is not None else 0
    sched2, writes2 = scheduler_counts(world.cluster), api_writes(world.cluster)
    sharer_phase = _create_and_bind(world, [sharer(f"sharer-{i}") for i in range(n_sharers)], timeout_s)
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
        plain_s_per_pod=plain_phase.wall_s / n_plain,
        sharer_s_per_pod=sharer_phase.wall_s / n_sharers,
        plain_median_s=median(plain_phase.each),
        plain_p90_s=percentile(plain_phase.each, 90),
        sharer_median_s=median(sharer_phase.each),
        sharer_p90_s=percentile(sharer_phase.each, 90),
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
        scheduler_limit=scheduler_client_limit(world.cluster),
        pipeline=sharer_phase.pipeline,
        plain_writes=writes_between(writes0, writes1),
        sharer_writes=writes_between(writes2, writes3),
        plain_cpu=plain_phase.cpu,
        plain_cpu_wall_s=plain_phase.cpu_wall_s,
        sharer_cpu=sharer_phase.cpu,
        sharer_cpu_wall_s=sharer_phase.cpu_wall_s,
        early=(plain_phase.early, sharer_phase.early),
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
        lines.append(_binding_floor_line(r))
        lines.append(_writes_line(r))
        lines.append(cpu_line("plain", r.plain_cpu, r.plain_cpu_wall_s))
        lines.append(cpu_line("sharers", r.sharer_cpu, r.sharer_cpu_wall_s))
        if any(r.early):
            lines.append(
                f"  seen bound before their create returned (create-to-bound counted as 0 s): "
                f"{r.early[0]} plain, {r.early[1]} sharers"
            )
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


def cpu_line(what: str, cpu: dict[str, float], wall_s: float, cores: int | None = None) -> str:
    """CPU seconds by process over one phase, most first, this process last, against what the cores had."""
    cores = cores or os.cpu_count() or 1
    others = sorted(((n, s) for n, s in cpu.items() if n != THIS_PROCESS), key=lambda kv: (-kv[1], kv[0]))
    if THIS_PROCESS in cpu:
        others.append((THIS_PROCESS, cpu[THIS_PROCESS]))
    parts = ", ".join(f"{name} {secs:.1f}" for name, secs in others)
    return f"  CPU s by process, {what}: {parts} (total {sum(cpu.values()):.1f} of {cores} cores x {wall_s:.1f} s wall)"


def binding_floor(r: Row) -> tuple[float, float]:
    """Seconds per bound pod, plain and sharers, that the scheduler's client bucket alone allows.

    Each scheduled attempt is one binding POST through that bucket, full at a phase's start
    (the phases are seconds apart): no phase can end sooner, whatever else is quick."""
    lim = r.scheduler_limit
    return lim.least_s(r.plain_scheduler.scheduled) / r.plain, lim.least_s(r.sharer_scheduler.scheduled) / r.sharers


def _binding_floor_line(r: Row) -> str:
    plain, sharers = binding_floor(r)
    lim = r.scheduler_limit
    ratio = f"{sharers / plain:.2f}" if plain else "n/a (the plain phase fit in the burst)"
    return (
        f"  the scheduler's client (qps {lim.qps:g}, burst {lim.burst:g}) alone lets {r.plain_scheduler.scheduled:.0f} "
        f"plain bindings take no less than {plain:.4f} s per pod and the sharers' {r.sharer_scheduler.scheduled:.0f} "
        f"(their shadows' included) {sharers:.4f} s: ratio at that floor {ratio}"
    )


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
