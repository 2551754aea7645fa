"""Time from creating a pod to Running, side by side, on the real one-node cluster:

- a plain pod asking the fake vendor GPU directly (the baseline, measured in both phases);
- share-gpu-4 with no shadow (the agent creates one; the seed system paid 5-10 s extra here);
- share-gpu-4 on the shadow the previous sharer's demand made (it has a free slot);
- share-gpu-4 on the warm pool (`warmShadows: 1`): a shadow the agent keeps spare stands Running,
  its devices advertised, before the sharer is created;

and the agent's RSS at rest (goal < 80 MB). Goals: the warm pool under 1 s over plain; the first
sharer with no shadow within 1.5x a plain pod (medians, judged with the no-shadow median's 95 %
interval, at least 30 of each).

    .venv/bin/python bench/share_startup.py [--repeat 10] [--quick]

Two phases, because the warm pool would refill at once what the no-shadow case must empty: first
the agent runs with `warmShadows: 0` (plain, no shadow, previous sharer's shadow, per repeat), then
it is restarted with `warmShadows: 1` (plain and warm pool per repeat, order alternating). Both
phases serve only share-gpu-4 and share-dev-gpu-2 (the warm pool keeps a shadow for every served
spec, each holding a GPU) on 4 fake GPUs. Each mode is compared with the plain pod of its phase:
the ratio of medians, and the extra as the median of per-repeat paired differences with a 95 %
bootstrap interval (bench/stats.py).

Needs root and the cluster binaries (`make kube-deps`). Brings up a private cluster, the fake
vendor plugin and `gpushare agent`, and removes them at the end.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.stats import estimate_median, median, paired_differences  # noqa: E402
from gpushare import keys  # noqa: E402
from localcluster.agent import FAKE_RESOURCE, AgentProcess, FakeGpus, agent_for  # noqa: E402
from localcluster.bringup import running_cluster  # noqa: E402
from localcluster.cluster import Cluster  # noqa: E402
from localcluster.pods import pod_manifest, sharer  # noqa: E402

REPEATS = 10
COLD_GOAL_RATIO = 1.5  # the first sharer with no shadow, against a plain GPU pod (medians)
COLD_GOAL_MIN_N = 30
QUICK_REPEATS = 2
GPUS = 4
SHARE4 = "gpushare/share-gpu-4"
# Every served spec gets a warm shadow holding a GPU: serve few, so 4 fake GPUs hold the warm
# pool, the shadow that replaces a warm one once a sharer takes it, and the plain pod.
SPECS_CONFIG = "shareSpecs: [4]\ndevShareSpecs: [2]\n"
POOL_SETTLE_S = 2.0  # two agent passes (--period 1) with the pool unchanged
PLAIN = "plain"
COLD = "no-shadow"
LEFT = "left-by-previous"
PLAIN_WARM = "plain-warm-phase"
POOL = "warm-pool"
LABELS = {
    PLAIN: f"plain {FAKE_RESOURCE} (warmShadows: 0)",
    COLD: "share-gpu-4, no shadow (agent creates one)",
    LEFT: "share-gpu-4, shadow left by previous sharer",
    PLAIN_WARM: f"plain {FAKE_RESOURCE} (warmShadows: 1)",
    POOL: "share-gpu-4, warm pool (warmShadows: 1)",
}
BASELINE = {COLD: PLAIN, LEFT: PLAIN, POOL: PLAIN_WARM}


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


def allocatable(c: Cluster, resource: str) -> str:
    return str(c.node()["status"]["allocatable"].get(resource, ""))


def no_shadows(c: Cluster) -> None:
    c.kubectl("delete", "pods", "-n", keys.DEFAULT_NAMESPACE, "--all", "--wait=true")
    # The next sharer must not be bound on the stale share-gpu-4 capacity (docs/agent.md).
    wait("share capacity 0", lambda: allocatable(c, SHARE4) == "0", timeout_s=60, step_s=0.5)


def shadows(c: Cluster) -> list[dict[str, Any]]:
    doc = c.request("GET", f"/api/v1/namespaces/{keys.DEFAULT_NAMESPACE}/pods")
    return [p for p in doc.get("items", []) if not p["metadata"].get("deletionTimestamp")]


def pool_ready(c: Cluster) -> int:
    """The number of share-gpu-4 shadows when every shadow runs and all their slots are advertised, else 0."""
    pods = shadows(c)
    if any((p.get("status") or {}).get("phase") != "Running" for p in pods):
        return 0
    labels = [p["metadata"].get("labels") or {} for p in pods]
    share4 = sum(
        1 for lb in labels if lb.get(keys.LABEL_SHARE_KIND) == keys.KIND_SHARE and lb.get(keys.LABEL_SHARE_SPEC) == "4"
    )
    return share4 if share4 and allocatable(c, SHARE4) == str(4 * share4) else 0


def wait_pool_settled(c: Cluster) -> None:
    """A warm shadow stands ready and the agent has stopped changing the pool (it refills it after each sharer)."""
    deadline = time.monotonic() + 120
    seen, since = -1, time.monotonic()
    while True:
        now_ready = pool_ready(c)
        if now_ready != seen:
            seen, since = now_ready, time.monotonic()
        elif now_ready and time.monotonic() - since >= POOL_SETTLE_S:
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: the warm pool did not settle ({len(shadows(c))} shadows)")
        time.sleep(0.2)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def configure(agent: AgentProcess, base: str, warm: int) -> None:
    agent.config_path.write_text(f"{base}{SPECS_CONFIG}warmShadows: {warm}\n")


def restart(c: Cluster, agent: AgentProcess) -> None:
    agent.stop()
    agent.start()
    agent.wait_healthy()
    wait("share-gpu-4", lambda: SHARE4 in c.node()["status"]["allocatable"])


def phase_without_pool(c: Cluster, repeats: int, samples: dict[str, list[float]]) -> None:
    """Per repeat: plain, no shadow, then the shadow that sharer left (plain first or last, alternating)."""
    for i in range(repeats):
        if i % 2 == 0:
            samples[PLAIN].append(time_to_running(c, pod_manifest(f"plain-{i}", resources={FAKE_RESOURCE: "1"})))
            delete(c, f"plain-{i}")
        no_shadows(c)
        samples[COLD].append(time_to_running(c, sharer(f"cold-{i}")))
        # The shadow now has 3 free slots: the next sharer finds it running.
        samples[LEFT].append(time_to_running(c, sharer(f"left-{i}")))
        delete(c, f"cold-{i}", f"left-{i}")
        if i % 2 == 1:
            samples[PLAIN].append(time_to_running(c, pod_manifest(f"plain-{i}", resources={FAKE_RESOURCE: "1"})))
            delete(c, f"plain-{i}")


def phase_with_pool(c: Cluster, repeats: int, samples: dict[str, list[float]]) -> None:
    """Per repeat, with the pool settled: a plain pod and a sharer on a warm shadow, order alternating."""
    for i in range(repeats):
        wait_pool_settled(c)
        order = [PLAIN_WARM, POOL] if i % 2 == 0 else [POOL, PLAIN_WARM]
        for mode in order:
            name = f"{mode}-{i}"
            manifest = pod_manifest(name, resources={FAKE_RESOURCE: "1"}) if mode == PLAIN_WARM else sharer(name)
            samples[mode].append(time_to_running(c, manifest))
            delete(c, name)
            if mode == POOL and order[0] == POOL:
                wait_pool_settled(c)  # the plain pod needs the GPU the refill takes to be settled


def measure(c: Cluster, root: Path, repeats: int) -> tuple[dict[str, list[float]], float]:
    agent = agent_for(root, c, idle_s=600)
    base = agent.config_path.read_text()
    configure(agent, base, warm=0)
    gpus = FakeGpus(root, str(c.device_plugin_dir), count=GPUS)
    gpus.start()
    samples: dict[str, list[float]] = {mode: [] for mode in LABELS}
    try:
        wait("fake GPUs", lambda: allocatable(c, FAKE_RESOURCE) == str(GPUS))
        agent.start()
        agent.wait_healthy()
        wait("share-gpu-4", lambda: SHARE4 in c.node()["status"]["allocatable"])
        phase_without_pool(c, repeats, samples)
        time.sleep(5)  # at rest: no pod events, a few idle passes
        rss = rss_mib(agent.pid)
        no_shadows(c)
        configure(agent, base, warm=1)
        restart(c, agent)
        phase_with_pool(c, repeats, samples)
    finally:
        agent.stop()
        gpus.stop()
    return samples, rss


def report(samples: dict[str, list[float]], repeats: int) -> list[str]:
    rows = [
        f"time from create to Running, {repeats} repeats per mode, 2-core machine; against the plain pod of the "
        "same phase: ratio of medians, extra = median of per-repeat paired differences (95 % bootstrap CI)",
        f"{'mode':<46}{'n':>3}{'median s':>10}{'95% CI s':>16}{'min':>7}{'max':>7}{'x plain':>9}  extra over plain",
    ]
    for mode, label in LABELS.items():
        xs = samples[mode]
        est = estimate_median(xs)
        ci = est.interval(".2f")
        extra, ratio = "-", "1.00"
        if mode in BASELINE:
            base = samples[BASELINE[mode]]
            ratio = f"{est.median / median(base):.2f}"
            extra = estimate_median(paired_differences(xs, base)).describe(unit="s", what="pairs")
        rows.append(
            f"{label:<46}{len(xs):>3}{est.median:>10.2f}{ci:>16}{min(xs):>7.2f}{max(xs):>7.2f}{ratio:>9}  {extra}"
        )
    pool = estimate_median(paired_differences(samples[POOL], samples[PLAIN_WARM]))
    if not pool.has_interval:
        verdict = "not judged (too few repeats for an interval)"
    elif pool.high < 1.0:
        verdict = "met"
    else:
        verdict = "NOT met" if pool.low >= 1.0 else "not decided (the CI spans 1 s)"
    rows.append(f"goal: warm pool under 1 s over plain: {verdict} ({pool.median:+.2f} s, 95 % CI {pool.interval()})")
    rows.append(cold_goal(samples[COLD], samples[PLAIN]))
    return rows


def cold_goal(cold: list[float], plain: list[float]) -> str:
    """The first sharer without a shadow against plain: its median's interval against 1.5x plain's median."""
    bound = COLD_GOAL_RATIO * median(plain)
    est = estimate_median(cold)
    if min(len(cold), len(plain)) < COLD_GOAL_MIN_N or not est.has_interval:
        verdict = f"not judged (fewer than {COLD_GOAL_MIN_N} of each)"
    elif est.high <= bound:
        verdict = "met"
    else:
        verdict = "NOT met" if est.low > bound else "not decided (the CI spans the bound)"
    return (
        f"goal: first sharer with no shadow within {COLD_GOAL_RATIO}x plain: {verdict} (median "
        f"{est.median:.2f} s, 95 % CI {est.interval('.2f')}, against {COLD_GOAL_RATIO} x {median(plain):.2f} s "
        f"= {bound:.2f} s; ratio of medians {est.median / median(plain):.2f})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=None, help=f"repeats per mode (default {REPEATS})")
    parser.add_argument("--quick", action="store_true", help=f"smoke run: {QUICK_REPEATS} repeats per mode")
    args = parser.parse_args()
    repeats = args.repeat or (QUICK_REPEATS if args.quick else REPEATS)
    root = Path(tempfile.mkdtemp(prefix="gs-bench", dir="/tmp"))
    with running_cluster() as c:
        samples, rss = measure(c, root, repeats)
    print("\n".join(report(samples, repeats)))
    print(f"agent RSS at rest after the warmShadows: 0 phase: {rss:.1f} MiB (goal < 80 MB)")
    print(json.dumps({**{f"{mode}_s": xs for mode, xs in samples.items()}, "agent_rss_mib": round(rss, 1)}))


if __name__ == "__main__":
    main()
