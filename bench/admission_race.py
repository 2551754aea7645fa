"""Sharers created while their shadows come and go: how many fail kubelet's admission.

A sharer is placed by the node's allocatable share count and admitted by the device list our
share plugin sends kubelet. Each worker below loops: create a sharer, wait until it runs (or
fails), delete it, wait a random time from nothing to past the idle timeout plus the drain, and
create the next. Its shadow therefore goes idle, is marked draining, has its devices withdrawn
and is deleted while the worker's next sharer arrives at every point of that sequence: the race
docs/scale.md ("Shadow removal order") describes. Each worker asks for its own share spec, so
each has its shadow to itself. A failed pod is counted, never re-created.

    .venv/bin/python bench/admission_race.py [--cycles 1000] [--workers 4] [--idle 1] [--seed 1]

Prints a progress line every 50 cycles, then cycles, failures by reason, the time, how often the
agent lowered a count kubelet wrote back and held a withdrawal for a late sharer (from its log),
and one JSON line; exits 1 on any failure. SIGINT or SIGTERM stops it after the cycles in flight, and it
reports what it ran (marked as stopped early). Needs root and the cluster binaries (`make kube-deps`). Brings up
a private cluster, the fake vendor plugin and `gpushare agent`, and removes them at the end;
``run_cycles`` takes any cluster with the agent on it.
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from localcluster.agent import FAKE_RESOURCE, AgentSettings, FakeGpus, process_agent  # noqa: E402
from localcluster.bringup import running_cluster  # noqa: E402
from localcluster.cluster import Cluster  # noqa: E402
from localcluster.errors import ClusterError  # noqa: E402
from localcluster.pods import sharer  # noqa: E402

CYCLES = 1000
WORKERS = 4
SPECS = (2, 3, 4, 5, 6, 7, 8, 9)  # one per worker: each worker's shadow is its own
IDLE_S = 1.0
DRAIN_S = 6.0  # the node notes its publish, then waits DRAIN_SETTLE_S (5 s) before it withdraws
RUN_TIMEOUT_S = 120.0
PROGRESS_EVERY = 50
PODS = "/api/v1/namespaces/default/pods"


@dataclass
class RaceResult:
    cycles: int = 0
    seconds: float = 0.0  # the run's, or so far in a progress line
    started: float = field(default_factory=time.monotonic)
    failures: list[tuple[str, str, str]] = field(default_factory=list)  # pod, reason, message
    stuck: list[str] = field(default_factory=list)  # neither Running nor Failed in time

    @property
    def admission_errors(self) -> int:
        return sum(1 for _, reason, _ in self.failures if reason == "UnexpectedAdmissionError")

    def summary(self) -> dict[str, Any]:
        by_reason = collections.Counter(reason for _, reason, _ in self.failures)
        return {
            "cycles": self.cycles,
            "seconds": round(self.seconds, 1),
            "unexpected_admission_errors": self.admission_errors,
            "failures_by_reason": dict(by_reason),
            "stuck": len(self.stuck),
        }


def _phase(c: Cluster, name: str) -> tuple[str, str, str]:
    pod = c.pod(name) or {}
    status = pod.get("status") or {}
    return str(status.get("phase", "")), str(status.get("reason", "")), str(status.get("message", ""))


def _delete(c: Cluster, name: str) -> None:
    try:
        c.request("DELETE", f"{PODS}/{name}", {"gracePeriodSeconds": 0})
    except ClusterError as exc:
        if "HTTP 404" not in str(exc):
            raise
    deadline = time.monotonic() + 60
    while c.pod(name) is not None:
        if time.monotonic() > deadline:
            raise ClusterError(f"pod {name} not gone after 60 s")
        time.sleep(0.1)


def _worker(
    c: Cluster,
    spec: int,
    count: int,
    *,
    pause_s: float,
    rng: random.Random,
    out: RaceResult,
    lock: Any,
    stop: threading.Event,
) -> None:
    for i in range(count):
        if stop.is_set():
            return
        name = f"race-{spec}-{i}"
        c.request("POST", PODS, sharer(name, spec))
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while True:
            phase, reason, message = _phase(c, name)
            if phase in ("Running", "Failed") or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        with lock:
            out.cycles += 1
            if phase == "Failed":
                out.failures.append((name, reason, message))
            elif phase != "Running":
                out.stuck.append(f"{name}: {phase}")
            if out.cycles % PROGRESS_EVERY == 0:
                out.seconds = time.monotonic() - out.started
                print(f"progress: {json.dumps(out.summary())}", flush=True)
        _delete(c, name)
        time.sleep(rng.uniform(0.0, pause_s))


def run_cycles(
    c: Cluster, *, cycles: int, workers: int, idle_s: float, seed: int = 1, stop: threading.Event | None = None
) -> RaceResult:
    """``cycles`` create/delete cycles over ``workers`` threads, share-gpu-<SPECS[i]> each.

    ``stop``: set it to end early; each worker finishes the cycle it is in.
    """
    stop = stop or threading.Event()
    if not 1 <= workers <= len(SPECS):
        raise ValueError(f"workers must be 1..{len(SPECS)}")
    out, lock = RaceResult(), threading.Lock()
    rng = random.Random(seed)
    # Long enough that the next sharer often arrives after the shadow is gone, short enough to hit the drain.
    pause_s = idle_s + DRAIN_S + 2.0
    shares = [cycles // workers + (1 if w < cycles % workers else 0) for w in range(workers)]
    errors: list[BaseException] = []

    def run(w: int) -> None:
        try:
            rng_w = random.Random(rng.random())
            _worker(c, SPECS[w], shares[w], pause_s=pause_s, rng=rng_w, out=out, lock=lock, stop=stop)
        except BaseException as exc:  # reported after the join: one broken worker fails the run
            errors.append(exc)

    out.started = started = time.monotonic()
    threads = [threading.Thread(target=run, args=(w,), name=f"race-{w}") for w in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():  # join with a timeout: SIGINT reaches the main thread only between waits
            t.join(0.5)
    out.seconds = time.monotonic() - started
    if errors:
        raise errors[0]
    return out


# The agent's log lines for the two guards of the drain (docs/scale.md, "Shadow removal order"):
# how often each closed the race on this run, next to how often the race was still lost.
AGENT_LINES = {
    "counts_lowered_again": "share count written back; lowered again",
    "withdrawals_held_for_a_sharer": "a sharer waits for admission; draining devices kept listed",
}


def agent_counts(log_text: str) -> dict[str, int]:
    return {key: log_text.count(line) for key, line in AGENT_LINES.items()}


def specs_config(workers: int) -> dict[str, Any]:
    return {"shareSpecs": list(SPECS[:workers]), "devShareSpecs": [2]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=CYCLES)
    parser.add_argument("--workers", type=int, default=WORKERS, help=f"1..{len(SPECS)}, one shadow and GPU each")
    parser.add_argument("--idle", type=float, default=IDLE_S, help="shadowIdleTimeout, seconds")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="gs-race", dir="/tmp"))
    stop = threading.Event()

    def stop_early(signum: int, _frame: object) -> None:
        print(f"signal {signum}: stopping after the cycles in flight", flush=True)
        stop.set()

    signal.signal(signal.SIGINT, stop_early)
    signal.signal(signal.SIGTERM, stop_early)
    with running_cluster() as c:
        gpus = FakeGpus(root, str(c.device_plugin_dir), count=args.workers)
        settings = AgentSettings(idle_s=args.idle, spot=False, config=specs_config(args.workers))
        agent = process_agent(c, root, settings)
        gpus.start()
        try:
            c.wait_for("fake GPUs", lambda: c.node()["status"]["allocatable"].get(FAKE_RESOURCE) == str(args.workers))
            agent.start()
            agent.wait_healthy()
            c.wait_for("share plugins", lambda: "gpushare/share-gpu-2" in c.node()["status"]["allocatable"], 60)
            result = run_cycles(
                c, cycles=args.cycles, workers=args.workers, idle_s=args.idle, seed=args.seed, stop=stop
            )
        finally:
            agent.stop()
            gpus.stop()
    s = result.summary()
    s["stopped_early"] = stop.is_set()
    s |= agent_counts(agent.log_text())
    print(
        ("stopped early: " if stop.is_set() else "")
        + f"{s['cycles']} create/delete cycles, {args.workers} workers, shadowIdleTimeout {args.idle:g} s: "
        f"{s['unexpected_admission_errors']} UnexpectedAdmissionError, failures by reason {s['failures_by_reason']}, "
        f"{s['stuck']} not running in {RUN_TIMEOUT_S:g} s; {s['seconds']:.0f} s; the agent lowered a count "
        f"kubelet wrote back {s['counts_lowered_again']} times and held a withdrawal for a late sharer "
        f"{s['withdrawals_held_for_a_sharer']} times"
    )
    for name, reason, message in result.failures[:10]:
        print(f"  {name}: {reason}: {message}")
    print(json.dumps(s))
    sys.exit(1 if result.failures or result.stuck else 0)


if __name__ == "__main__":
    main()
