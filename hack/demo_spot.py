"""The demo's spot act: a lendable dev machine goes idle, a spot job takes its GPU, the
owner "returns", the job is gone, and ``gpushare status`` says why.

    .venv/bin/python hack/demo_spot.py            # its own one-node cluster (~1 min, root)
    from hack.demo_spot import spot_act           # from another demo: spot_act(cluster)

No GPU is needed: the fake vendor plugin serves two fake GPUs and the agent reads fake
dcgm-exporter metrics from a file this script rewrites (gpumetrics/fake_exporter.py), through
the real scrape and adapter path. Both are installed as in `make demo` (the agent is the
DaemonSet's pod, installed with helm; ``tests/harness/worlds/spot.py``). The agent started here runs with
spot on; a calling demo must have removed its own agent and fake GPU plugin first (one agent per
node).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from localcluster.bringup import running_cluster
from localcluster.cluster import Cluster
from tests.harness.worlds.spot import (
    GPUS,
    IDLE_WINDOW_S,
    SpotEnv,
    owner_gpu,
    owner_manifest,
    spot_environment,
    spot_manifest,
)

SPOT = "gpushare/spot-gpu"


def _spot_lines(text: str) -> str:
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("SPOT")), len(lines))
    return "\n".join(lines[start:])


def run_act(env: SpotEnv, say: Callable[[str], None] = print) -> None:
    say("== spot: lend an idle owner's GPU, give it back the moment the owner returns")
    env.apply(owner_manifest("dev"))
    env.cluster.wait_pod_phase("dev", ["Running"], namespace="team", timeout_s=60)
    gpu = owner_gpu(env, "dev")
    say(f"-- team/dev holds {gpu} and opted in (label gpushare.k8s.io/lendable=true)")
    env.write_metrics({g: 0.0 for g in GPUS})
    say(
        f"-- the metrics say {gpu} is at 0% utilization; idleWindow is {IDLE_WINDOW_S:g}s in this demo (10m by default)"
    )
    env.wait(f"{SPOT} allocatable 1", lambda: env.allocatable(SPOT) == "1", 30)
    say(f"-- node allocatable {SPOT} = 1: the dev machine is away, its GPU is lendable")
    env.apply(spot_manifest("batch"))
    env.cluster.wait_pod_phase("batch", ["Running"], namespace="spot", timeout_s=60)
    devs = env.cluster.kubectl("exec", "-n", "spot", "batch", "--", "cat", "/tmp/devs").stdout.split()
    say(f"-- spot/batch is running on the borrowed GPU (sees /dev/{gpu}: {gpu in devs})")
    say(_spot_lines(env.status_text()))
    say("-- the owner comes back: its pod uses the GPU again (utilization 60% by team/dev)")
    started = time.monotonic()
    env.write_metrics({g: 0.0 for g in GPUS} | {gpu: 60.0}, {gpu: ("team/dev",)})
    env.wait("spot/batch gone", lambda: env.cluster.pod("batch", "spot") is None, 30)
    say(f"-- spot/batch was killed and deleted {time.monotonic() - started:.2f}s after the metrics changed")
    say(f"-- team/dev is untouched: {env.cluster.pod('dev', 'team')['status']['phase']}")  # type: ignore[index]
    env.wait(f"{SPOT} allocatable 0", lambda: env.allocatable(SPOT) == "0", 30)
    say(f"-- {SPOT} allocatable is 0 again. gpushare status says why:")
    say(_spot_lines(env.status_text()))


def spot_act(cluster: Cluster, *, start_fake_gpus: bool = True) -> None:
    """The act on an existing cluster (its own agent and, unless told otherwise, fake GPU plugin)."""
    with spot_environment(cluster, start_fake_gpus=start_fake_gpus) as env:
        run_act(env)


def main() -> int:
    with running_cluster() as cluster:
        spot_act(cluster)
    return 0


if __name__ == "__main__":
    sys.exit(main())
