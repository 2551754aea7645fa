"""Time from creating a pod to Running on a DRA node, side by side with a plain pod:

- a plain pod asking the fake vendor's GPU through its device plugin (the baseline, as in
  bench/share_startup.py);
- a pod asking ``gpushare/share-gpu-4`` on a DRA node: the scheduler makes its claim from the
  DeviceClass that names the resource, allocates a 1/4 slot from the published counters, kubelet
  calls gpushare's DRA driver to prepare it, containerd applies the vendor's CDI device. No
  shadow pod exists at any point.

    .venv/bin/python bench/dra_startup.py [--repeat 30] [--quick]

Per repeat one pod of each, the order alternating, each deleted before the next so the node is
the same for every sample. Reported: the median and its 95 % bootstrap interval per mode, the
ratio of medians, and the extra as the median of per-repeat paired differences with its interval
(bench/stats.py). The shadow-pod path's figures come from bench/share_startup.py, run on the same
machine.

Needs root and the cluster binaries (`make kube-deps`). Brings up a private cluster, the fake
vendor's plugin and CDI spec, gpushare's DRA driver and the chart's DeviceClasses, and removes
them at the end.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.share_startup import delete, time_to_running, wait  # noqa: E402
from bench.stats import estimate_median, median, paired_differences  # noqa: E402
from gpushare import keys  # noqa: E402
from localcluster.agent import FAKE_RESOURCE, FakeGpus  # noqa: E402
from localcluster.bringup import running_cluster  # noqa: E402
from localcluster.cluster import Cluster  # noqa: E402
from localcluster.pods import pod_manifest, sharer  # noqa: E402
from tests.harness.worlds.dra import dra_node  # noqa: E402

REPEATS = 30
QUICK_REPEATS = 3
PLAIN = "plain"
DRA = "dra-share-gpu-4"
LABELS = {
    PLAIN: f"plain {FAKE_RESOURCE} (device plugin)",
    DRA: "share-gpu-4 on a DRA node (no shadow)",
}


def measure(c: Cluster, root: Path, repeats: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {mode: [] for mode in LABELS}
    gpus = FakeGpus(root, str(c.device_plugin_dir), count=2)
    gpus.start()
    try:
        wait("fake GPUs", lambda: c.node()["status"]["allocatable"].get(FAKE_RESOURCE) == "2")
        with dra_node(c):
            for i in range(repeats):
                order = [PLAIN, DRA] if i % 2 == 0 else [DRA, PLAIN]
                for mode in order:
                    name = f"{mode}-{i}"
                    plain = pod_manifest(name, resources={FAKE_RESOURCE: "1"})
                    manifest = plain if mode == PLAIN else sharer(name, 4)
                    samples[mode].append(time_to_running(c, manifest))
                    delete(c, name)
            shadows = c.request("GET", f"/api/v1/pods?labelSelector={keys.LABEL_ROLE}%3D{keys.ROLE_SHADOW}")
            if shadows["items"]:
                raise SystemExit("bench: a shadow pod exists on the DRA node")
    finally:
        gpus.stop()
    return samples


def report(samples: dict[str, list[float]], repeats: int) -> list[str]:
    rows = [
        f"time from create to Running, {repeats} pods per mode, 2-core machine, Kubernetes v1.37.2; against the "
        "plain pod: ratio of medians, extra = median of per-repeat paired differences (95 % bootstrap CI)",
        f"{'mode':<42}{'n':>4}{'median s':>10}{'95% CI s':>16}{'min':>7}{'max':>7}{'x plain':>9}  extra over plain",
    ]
    base = samples[PLAIN]
    for mode, label in LABELS.items():
        xs = samples[mode]
        est = estimate_median(xs)
        ratio, extra = "1.00", "-"
        if mode != PLAIN:
            ratio = f"{est.median / median(base):.2f}"
            extra = estimate_median(paired_differences(xs, base)).describe(unit="s", what="pairs")
        rows.append(
            f"{label:<42}{len(xs):>4}{est.median:>10.2f}{est.interval('.2f'):>16}{min(xs):>7.2f}{max(xs):>7.2f}"
            f"{ratio:>9}  {extra}"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=None, help=f"pods per mode (default {REPEATS})")
    parser.add_argument("--quick", action="store_true", help=f"smoke run: {QUICK_REPEATS} pods per mode")
    args = parser.parse_args()
    repeats = args.repeat or (QUICK_REPEATS if args.quick else REPEATS)
    root = Path(tempfile.mkdtemp(prefix="gs-bench", dir="/tmp"))
    with running_cluster() as c:
        samples = measure(c, root, repeats)
    print("\n".join(report(samples, repeats)))
    print(json.dumps({f"{mode}_s": xs for mode, xs in samples.items()}))


if __name__ == "__main__":
    main()
