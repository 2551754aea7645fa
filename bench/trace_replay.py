"""How many GPUs gpushare's sharing saves on Alibaba's GPU trace, by the FGD paper's method, on the real control plane.

Method (Weng et al., "Beware of Fragmentation", USENIX ATC '23, and its simulator):

- the cluster is the trace's GPU nodes (1,213 nodes, 6,212 GPUs in
  bench/data/alibaba-openb/openb_node_list_gpu_node.csv), each a kwok node with the trace's
  CPU, memory and GPU count; ``--nodes`` takes an even slice of them instead;
- the workload is drawn from the trace's default task list with replacement until its GPU
  requests reach ``--arrival`` (1.3) times the cluster's GPUs, then shuffled by the seed;
- its tasks are created in that order as pods, and none leaves; the real kube-scheduler places
  them first come first served (the queue takes them in creation order), and a pod it cannot
  place stays unplaced;
- the figure is the GPU allocation ratio: the GPU milli asked by the placed tasks over the
  cluster's GPU milli, at 100 % and 130 % of it arrived.

Modes, each with gpushare as it runs there (bench/replay/modes.py):

- ``exclusive``: every GPU task takes whole GPUs of the vendor's resource (the baseline);
- ``share-gpu``: a task of part of a GPU asks for ``gpushare/share-gpu-N``, N the finest of the
  offered 2, 3, 4, 5 that holds it (one over 500 milli takes a whole GPU); the real agent, as
  leader, makes the shadows, and the node side advertises their slots;
- ``dra-share-gpu``: the same request, which gpushare's DRA DeviceClasses back with slots on the
  DRA driver's own published pools;
- ``dra-exact``: a ResourceClaim on the exact device for the task's own milli.

A task that holds its GPUs by a ResourceClaim (every GPU task on DRA but the 1/N sharers, whose
claim the scheduler makes) gets its claim created just before its pod, so it keeps its place.

Scheduler profiles (bench/replay/scheduler.py): ``default`` (kube-scheduler's scoring),
``binpack`` (MostAllocated over CPU, memory and GPU resources, every node scored) and
``gpu-binpack`` (MostAllocated over the GPU resources alone, every node scored).

Each run appends one JSON line to ``--results``; ``--report`` prints the table (mean and 95 %
CI over seeds, GPUs saved against exclusive, the paper's figures) from that file and, with
``--plot``, draws allocation ratio against arrival. A device-plugin mode at full size takes
about 5 minutes a run on a 2-core machine, a 100-node run under a minute; the DRA modes are run
on a slice (docs/trace-replay.md has the measured times and why).

    make kwok helm && .venv/bin/python bench/trace_replay.py --modes exclusive,share-gpu --seeds 42-44
    .venv/bin/python bench/trace_replay.py --report --plot docs/img/trace-replay.png
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.replay.modes import Mode, claim_manifest, pod_manifest
from bench.replay.outcome import RunOutcome, summarize
from bench.replay.report import plot, read_runs, rows, table
from bench.replay.scheduler import PROFILES, scheduler_settings
from bench.replay.trace import TraceError, draw_workload, gpu_capacity, load_nodes, load_pods, node_slice
from localcluster.agent import FAKE_RESOURCE
from localcluster.bringup import running_cluster
from localcluster.cluster import Cluster
from localcluster.images import PAUSE_IMAGE
from tests.harness.worlds.replay import NODE_SELECTOR, ReplayWorld, replay_world

RESULTS = Path(__file__).resolve().parent / "results" / "trace-replay.jsonl"
SHARE_SPECS = (2, 3, 4, 5)  # the agent's default share specs: what the product offers out of the box
FULL = 1213


def parse_seeds(text: str) -> list[int]:
    """``42-51`` or ``42,44,50``."""
    seeds: list[int] = []
    for part in text.split(","):
        low, _, high = part.strip().partition("-")
        try:
            seeds += list(range(int(low), int(high) + 1)) if high else [int(low)]
        except ValueError:
            raise argparse.ArgumentTypeError(f"seeds: {part!r} is neither a number nor a range like 42-51") from None
    if not seeds:
        raise argparse.ArgumentTypeError("seeds: none given")
    return seeds


def parse_modes(text: str) -> list[Mode]:
    try:
        return [Mode(m.strip()) for m in text.split(",") if m.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"modes: {e}; expected some of {', '.join(Mode)}") from None


def replay_one(world: ReplayWorld, mode: Mode, *, seed: int, profile: str, arrival: float) -> RunOutcome:
    """One mode, one seed: the workload drawn, created, settled and read back (``world.clear()`` empties it)."""
    pods = load_pods()
    capacity = gpu_capacity(world.trace_nodes)
    workload = draw_workload(pods, capacity, arrival=arrival, seed=seed)
    tasks = [
        (
            claim_manifest(mode, seq, task, SHARE_SPECS),
            pod_manifest(
                mode,
                seq,
                task,
                specs=SHARE_SPECS,
                vendor_resource=FAKE_RESOURCE,
                node_selector=NODE_SELECTOR,
                image=PAUSE_IMAGE,
            ),
        )
        for seq, task in enumerate(workload)
    ]
    started = time.monotonic()

    def progress(line: str) -> None:
        print(f"  [{mode} seed {seed} {time.monotonic() - started:6.0f}s] {line}", flush=True)

    seconds = world.run(mode, tasks, progress=progress)
    outcome = summarize(
        mode,
        seed=seed,
        profile=profile,
        nodes=world.gpus,
        pods=world.pods(),
        shadows=world.shadows() if mode.shadows else (),
        claims=world.claims() if mode.dra else (),
        refused=world.refused(),
        vendor_resource=FAKE_RESOURCE,
        seconds=seconds,
    )
    return outcome


def family_scheduler(profile: str, *, dra: bool) -> dict[str, object]:
    """The profile's settings for one family of nodes: on DRA nodes the share resources are DRA's and
    are left out of scoring (bench/replay/scheduler.py)."""
    if dra and profile == "gpu-binpack":
        # With the DRA-backed resources left out, it would score a resource DRA nodes do not have.
        raise ValueError("the gpu-binpack profile scores GPU extended resources, which DRA nodes do not carry; "
                         "run the DRA modes with --profile default or binpack")  # fmt: skip
    return scheduler_settings(profile, vendor_resource=FAKE_RESOURCE, share_specs=() if dra else SHARE_SPECS)


def run_modes(cluster: Cluster, args: argparse.Namespace, side: Path) -> list[RunOutcome]:
    nodes = node_slice(load_nodes(), args.nodes)
    out: list[RunOutcome] = []
    done = set()
    if args.resume and args.results.exists():
        done = {(r.mode, r.profile, r.seed, r.nodes) for r in read_runs(args.results)}
    for dra in (False, True):
        family = [m for m in args.modes if m.dra == dra]
        if not family:
            continue
        cluster.restart_scheduler(family_scheduler(args.profile, dra=dra))
        with replay_world(cluster, side / ("dra" if dra else "deviceplugins"), nodes, dra=dra) as world:
            print(f"{len(nodes)} nodes, {sum(world.gpus.values())} GPUs ready; modes {', '.join(family)}", flush=True)
            for seed in args.seeds:
                for mode in family:
                    if (str(mode), args.profile, seed, len(nodes)) in done:
                        print(f"{mode} seed {seed}: in {args.results} already", flush=True)
                        continue
                    outcome = replay_one(world, mode, seed=seed, profile=args.profile, arrival=args.arrival)
                    args.results.parent.mkdir(parents=True, exist_ok=True)
                    with args.results.open("a") as f:
                        f.write(json.dumps(outcome.as_json()) + "\n")
                    at = {a: outcome.ratio_at(a) for a in (100, 130)}
                    print(
                        f"{mode} seed {seed}: allocation {at[100]} % at 100 %, {at[130]} % at 130 %; "
                        f"{outcome.unplaced_gpu_tasks} GPU tasks unplaced, {outcome.gpus_in_use} GPUs in use, "
                        f"{outcome.seconds:.0f} s; problems: {list(outcome.problems[:5]) or 'none'}",
                        flush=True,
                    )
                    out.append(outcome)
                    world.clear()
    return out


def report(args: argparse.Namespace) -> int:
    runs = read_runs(args.results)
    print(table(rows(runs)))
    if args.plot:
        plot(runs, args.plot, profile=args.profile, nodes=args.nodes)
        print(f"plot: {args.plot}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", type=parse_modes, default=list(Mode), help="comma-separated (default: all)")
    parser.add_argument("--seeds", type=parse_seeds, default=parse_seeds("42-51"), help="e.g. 42-51 (default) or 42,43")
    parser.add_argument("--nodes", type=int, default=FULL, help=f"an even slice of the trace's nodes (default {FULL})")
    parser.add_argument("--arrival", type=float, default=1.3, help="GPU requests drawn, times the GPUs (default 1.3)")
    parser.add_argument(
        "--profile",
        choices=PROFILES,
        default="default",
        help="scheduler profile (default: kube-scheduler's own, the best measured)",
    )
    parser.add_argument("--results", type=Path, default=RESULTS, help=f"JSON lines, appended (default {RESULTS})")
    parser.add_argument("--report", action="store_true", help="print the table from --results and run nothing")
    parser.add_argument("--plot", type=Path, help="with --report: draw allocation against arrival here (PNG)")
    parser.add_argument("--resume", action="store_true", help="skip the runs --results holds already")
    parser.add_argument("--keep", action="store_true", help="keep the cluster's directory after the run")
    args = parser.parse_args(argv)
    if args.nodes < 1:
        parser.error("--nodes must be at least 1")
    try:
        for dra in {m.dra for m in args.modes}:
            family_scheduler(args.profile, dra=dra)
    except ValueError as e:
        parser.error(str(e))
    if args.report:
        try:
            return report(args)
        except (OSError, ValueError) as e:
            print(f"trace_replay: {e}", file=sys.stderr)
            return 1
    signal.signal(signal.SIGTERM, _interrupt)
    side = Path(tempfile.mkdtemp(prefix="gs-replay-"))
    try:
        with running_cluster(keep=args.keep) as cluster:
            runs = run_modes(cluster, args, side)
    except TraceError as e:
        print(f"trace_replay: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:
        print(f"stopped ({e or 'SIGINT'}); the cluster is down; finished runs are in {args.results}", file=sys.stderr)
        return 1
    finally:
        print(f"logs (agent, kwok): {side}", flush=True)
    return 1 if any(r.problems for r in runs) else 0


def _interrupt(signum: int, _frame: object) -> None:
    """SIGTERM as Ctrl-C: the cluster, kwok and the agent are torn down by the ``finally`` blocks."""
    raise KeyboardInterrupt(f"signal {signum}")


if __name__ == "__main__":
    sys.exit(main())
