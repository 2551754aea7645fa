"""Time from creating a pod to Running (issue 7 benchmark), side by side, on the real one-node cluster:

- share-gpu-4 with a warm shadow (a shadow with a free slot is already Running);
- share-gpu-4 with no shadow (the agent creates one; the seed system paid 5-10 s extra here);
- a plain pod asking the fake vendor GPU directly (the baseline);

and the agent's RSS at rest (goal < 80 MB). Goal for the warm case: under 1 s.

    .venv/bin/python bench/share_startup.py [--repeat 3]

Needs root and the cluster binaries (`make kube-deps`). Brings up a private cluster, the fake
vendor plugin (2 GPUs) and `gpushare agent`, and removes them at the end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.harness.cluster import Cluster, running_cluster  # noqa: E402
from tests.integration.e2e.agent_process import (  # noqa: E402
    FAKE_RESOURCE,
    FakeGpus,
    agent_for,
    pod_manifest,
    sharer,
)


def wait(what: str, ok: Callable[[], bool], timeout_s: float = 90.0, step_s: float = 0.05) -> None:
    deadline = time.monotonic() + timeout_s
    while not ok():
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: timed out waiting for {what}")
        time.sleep(step_s)


def phase(c: Cluster, name: str) -> str:
    pod = c.pod(name)
    return str(((pod or {}).get("status") or {}).get("phase", ""))


def time_to_running(c: Cluster, manifest: dict[str, Any]) -> float:
    name = manifest["metadata"]["name"]
    started = time.monotonic()
    c.request("POST", "/api/v1/namespaces/default/pods", manifest)
    wait(f"{name} Running", lambda: phase(c, name) == "Running", step_s=0.02)
    return time.monotonic() - started


def delete(c: Cluster, *names: str) -> None:
    c.kubectl("delete", "pod", *names, "--wait=true", "--ignore-not-found")


def no_shadows(c: Cluster) -> None:
    c.kubectl("delete", "pods", "-n", "gpushare-system", "--all", "--wait=true")
    # The next sharer must not be bound on the stale share-gpu-4 capacity (docs/agent.md).
    wait(
        "share capacity 0",
        lambda: c.node()["status"]["allocatable"].get("gpushare/share-gpu-4") == "0",
        timeout_s=60,
        step_s=0.5,
    )


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def fmt(xs: list[float]) -> str:
    return f"median {statistics.median(xs):.2f} s  (min {min(xs):.2f}, max {max(xs):.2f}, n={len(xs)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="gs-bench", dir="/tmp"))
    with running_cluster() as c:
        agent = agent_for(root, c, idle_s=600)
        gpus = FakeGpus(root, str(c.device_plugin_dir))
        gpus.start()
        try:
            wait("fake GPUs", lambda: c.node()["status"]["allocatable"].get(FAKE_RESOURCE) == "2")
            agent.start()
            agent.wait_healthy()
            wait("share-gpu-4", lambda: "gpushare/share-gpu-4" in c.node()["status"]["allocatable"])

            plain, cold, warm = [], [], []
            for i in range(args.repeat):
                plain.append(time_to_running(c, pod_manifest(f"plain-{i}", resources={FAKE_RESOURCE: "1"})))
                delete(c, f"plain-{i}")
            for i in range(args.repeat):
                no_shadows(c)
                cold.append(time_to_running(c, sharer(f"cold-{i}")))
                # The shadow now has 3 free slots: the next sharer finds it warm.
                warm.append(time_to_running(c, sharer(f"warm-{i}")))
                delete(c, f"cold-{i}", f"warm-{i}")
            time.sleep(5)  # at rest: no pod events, a few idle passes
            rss = rss_mib(agent.pid)
            print(f"time from create to Running (share-gpu-4 vs plain {FAKE_RESOURCE}), 2-core machine:")
            print(f"  share-gpu-4, warm shadow : {fmt(warm)}")
            print(f"  share-gpu-4, no shadow   : {fmt(cold)}")
            print(f"  plain {FAKE_RESOURCE:18}: {fmt(plain)}")
            extra = statistics.median(warm) - statistics.median(plain)
            print(f"  warm extra over plain    : {extra:+.2f} s (goal < 1 s)")
            print(f"agent RSS at rest: {rss:.1f} MiB (goal < 80 MB)")
            print(json.dumps({"warm_s": warm, "cold_s": cold, "plain_s": plain, "agent_rss_mib": round(rss, 1)}))
        finally:
            agent.stop()
            gpus.stop()


if __name__ == "__main__":
    main()
