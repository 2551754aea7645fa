"""What a returning owner waits, in the kernel: its first GPU ioctl held by gpukmod until the agent has
killed every borrower and released it. Runs as root where gpukmod.ko loads on cgroup v2: the QEMU
guest of tests/integration/kernel/test_qemu.py (``--cgroup2``) runs it.

    python bench/spot_hold.py --ko PATH [--sizes 1,4,8,16] [--rounds 10] [--json OUT]

Per size N and round: N borrower pods of real runc containers in a kubepods-shaped cgroup v2 tree
(cgroupfs driver, BestEffort), each with a container of sleepers and one forking without end
(tests/integration/kernel/guest/runc_pods.py); the owner is pid 1 of a pid namespace of its own.
The agent's own spot runtime does what the loop does in a pass (tests/integration/spot/world.py):
the owner is idle, the borrowers hold its N GPUs, the pass lends them and arms the return
(``detect`` the owner's pid namespace, the borrowers' pod cgroups found ahead). Then the owner
issues one GPU ioctl (0x46) and times it: gpukmod holds it from the notice until the agent's
return thread has killed every borrower task (``podcgroups.pod_kill``: ``cgroup.kill``, the CPU
boost, the real-time killer) and sent ``release``. Prints per N: the owner's held ioctl (p50,
its 95 % interval, p99 where there are 200 rounds, max) and the agent's own kill time.

The guest is TCG with one vCPU: its times are those of an emulated CPU, many times slower than a
real core, and are only compared with each other (sizes, and runs of other commits).
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import tempfile
import time
from errno import ENOTTY
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.stats import estimate_median, format_percentile
from controller.core.actions import KillPods
from controller.spot.killer import KillOutcome, PodKiller
from controller.spot.kmod_bridge import KmodBridge
from controller.spot.runtime import SpotRuntime
from controller.spot.solver import SpotState
from tests.integration.kernel.guest.common import Worker, module_loaded
from tests.integration.kernel.guest.runc_pods import (
    CGROUP_ROOT,
    FORK_LOOP,
    SLEEPERS,
    Runc,
    container_rel,
    make_cgroup,
    make_qos_tree,
    pod_rel,
    remove_tree,
    tasks_below,
)
from tests.integration.spot.world import agent_pass, spot_world

MAX_BLOCK_MS = 20000  # the module's own bound, far above a TCG kill: a hold this long is a release never sent
SIZES = "1,4,8,16"
ROUNDS = 10
FORKING_WITHIN_S = 60.0
DRIVER = "cgroupfs"


class TimedKiller(PodKiller):
    """The agent's pod killer, keeping the outcome of its last kill for the bench to read."""

    last: KillOutcome | None = None

    def kill(self, action: KillPods, *, first: frozenset[str] = frozenset()) -> KillOutcome:
        self.last = super().kill(action, first=first)
        return self.last


def pod_dir(i: int) -> Path:
    return CGROUP_ROOT / pod_rel(DRIVER, "besteffort", f"uid-spot-job{i}")


def start_borrowers(runc: Runc, n: int) -> list[str]:
    """N BestEffort pods named as spot_world names them; the container ID spot_world gets for each."""
    make_qos_tree(DRIVER)
    ids: list[str] = []
    for i in range(n):
        rel = pod_rel(DRIVER, "besteffort", f"uid-spot-job{i}")
        make_cgroup(CGROUP_ROOT / rel)
        first = secrets.token_hex(32)
        runc.run(first, container_rel(DRIVER, rel, first), FORK_LOOP, own_pidns=True)
        other = secrets.token_hex(32)
        runc.run(other, container_rel(DRIVER, rel, other), SLEEPERS, own_pidns=True)
        ids.append(first)
    runc.open_gate()
    deadline = time.monotonic() + FORKING_WITHIN_S
    pods = [pod_dir(i) for i in range(n)]
    while any(len(tasks_below(p)) < 6 for p in pods):
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: borrowers not running within {FORKING_WITHIN_S:g}s")
        time.sleep(0.1)
    return ids


def one_return(rt: SpotRuntime, owner: Worker, runc: Runc, n: int) -> tuple[float, float, int]:
    """(owner's held ioctl ms, the agent's kill ms, tasks before) for one return of N borrowers."""
    killer = TimedKiller()  # a fresh cache of pod cgroups: each round's pods are new
    rt.pod_killer = killer
    ids = start_borrowers(runc, n)
    try:
        world = spot_world(ids, owner_pidns=owner.pidns)
        plan = agent_pass(rt, world)
        rt.arm(plan.returns)
        if [g.state for g in plan.gpus] != [SpotState.STOLEN] * n:
            raise SystemExit(f"bench: the pass did not lend all {n} GPUs: {[g.state for g in plan.gpus]}")
        before = sum(
            len(tasks_below(CGROUP_ROOT / pod_rel(DRIVER, "besteffort", f"uid-spot-job{i}"))) for i in range(n)
        )
        # The worker's ioctl goes to a file that is no GPU: after the hold it answers ENOTTY.
        (errno, held_s), *_ = owner.ioctl()
        if errno not in (0, ENOTTY):
            raise SystemExit(f"bench: the owner's ioctl failed with errno {errno}")
        rt.wait_dead(10.0)
        kill_ms = killer.last.took_s * 1000 if killer.last is not None else float("nan")
        rt.arm({})
        agent_pass(rt, world)  # the pass after the return: undetect, the owner back
        return held_s * 1000, kill_ms, before
    finally:
        runc.delete_all()
        for i in range(n):  # kubepods stays: the killer's layout is looked for once
            remove_tree(pod_dir(i))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ko", type=Path, required=True, help="gpukmod.ko built for the running kernel")
    ap.add_argument("--sizes", default=SIZES, help=f"borrower counts (default {SIZES})")
    ap.add_argument("--rounds", type=int, default=ROUNDS, help=f"returns per size (default {ROUNDS})")
    ap.add_argument("--json", type=Path, default=None, help="write the samples here")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    results: dict[int, dict[str, list[float]]] = {}
    work = Path(tempfile.mkdtemp(prefix="gs-hold-"))
    with module_loaded(MAX_BLOCK_MS, ko=args.ko):
        owner = Worker.start()
        rt = SpotRuntime(None, KmodBridge(), PodKiller())
        try:
            if not rt.bridge.start():
                raise SystemExit(f"bench: the agent's kernel client did not start: {rt.bridge.reason}")
            for n in sizes:
                held, kill, tasks = [], [], []
                for r in range(args.rounds):
                    round_dir = work / f"n{n}-r{r}"
                    round_dir.mkdir()
                    h, k, t = one_return(rt, owner, Runc(round_dir), n)
                    held.append(h)
                    kill.append(k)
                    tasks.append(t)
                    print(
                        f"  n={n:2d} round {r + 1:3d}: owner held {h:8.2f} ms, kill {k:8.2f} ms, {t} tasks", flush=True
                    )
                results[n] = {"held_ms": held, "kill_ms": kill, "tasks": [float(t) for t in tasks]}
        finally:
            rt.close()
            owner.stop()
            remove_tree(CGROUP_ROOT / "kubepods")
    print(f"\n{'N':>3} {'rounds':>6} {'held p50 ms [95 % CI]':>28} {'p99':>10} {'max':>9} {'kill p50':>9} tasks")
    for n, r in results.items():
        est = estimate_median(r["held_ms"])
        p99 = format_percentile(r["held_ms"], 99)
        kill = estimate_median(r["kill_ms"]).median
        print(
            f"{n:3d} {len(r['held_ms']):6d} {est.median:10.2f} {est.interval('.2f'):>17} {p99:>10} "
            f"{max(r['held_ms']):9.2f} {kill:9.2f} {int(sum(r['tasks']) / len(r['tasks']))}"
        )
    if args.json is not None:
        args.json.write_text(json.dumps({str(n): r for n, r in results.items()}))


if __name__ == "__main__":
    main()
