"""Benchmark: our Prometheus text parser vs prometheus_client's, on one generated scrape.

    .venv/bin/python bench/metrics_parse.py [--gpus 16] [--lines 3000] [--repeats 31] [--quick]

The scrape looks like dcgm-exporter in Kubernetes mode on a 16-GPU node: HELP and TYPE per
family, one series per GPU with dcgm's label set, pod labels on half of the GPUs, padded
with more DCGM-style families until it has exactly ``--lines`` lines. Both parsers read the
same text; each round runs both (alternating which goes first). Printed: each parser's median
with its 95 % bootstrap interval (bench/stats.py), and the speed-up as the median of the
per-round ratios (both parsers timed in the same round), with its interval.
``prometheus_client`` is a test dependency only; the agent never imports it.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.stats import estimate_median
from gpumetrics import parse_metrics, parse_text

REPEATS = 31
QUICK_REPEATS = 5

FAMILIES = [
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_ENC_UTIL",
    "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_RESERVED",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
    "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_PCIE_RX_BYTES",
]


def labels(gpu: int) -> str:
    base = (
        f'gpu="{gpu}",UUID="GPU-{gpu:08x}-0000-1111-2222-3333{gpu:08x}",pci_bus_id="00000000:{16 + gpu:02X}:00.0",'
        f'device="nvidia{gpu}",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-a",'
        'DCGM_FI_DRIVER_VERSION="550.90.07"'
    )
    if gpu % 2 == 0:
        base += f',container="trainer",namespace="team-ml",pod="llm-train-{gpu}"'
    return base


def value(family_index: int, gpu: int) -> str:
    if "PROF" in FAMILIES[family_index % len(FAMILIES)]:
        return f"{(gpu * 37 + family_index) % 100 / 100:.6f}"
    return str((gpu * 131 + family_index * 7) % 90000)


def generate(gpus: int, lines: int, unique_labels: bool = False) -> str:
    """``unique_labels``: every series gets its own label text (defeats our per-label-text cache)."""
    out: list[str] = []
    family = 0
    while len(out) < lines:
        base = FAMILIES[family % len(FAMILIES)]
        name = base if family < len(FAMILIES) else f"{base}_X{family}"
        out.append(f"# HELP {name} {base.lower()} (generated).")
        out.append(f"# TYPE {name} gauge")
        for gpu in range(gpus):
            if len(out) >= lines:
                break
            extra = f',series="{len(out)}"' if unique_labels else ""
            out.append(f"{name}{{{labels(gpu)}{extra}}} {value(family, gpu)}")
        family += 1
    return "\n".join(out[:lines]) + "\n"


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def measure(text: str, gpus: int, repeats: int) -> dict[str, float]:
    """Median seconds per parser on ``text``, after checking both read the same samples."""
    ours = parse_text(text)
    their_samples = sum(len(f.samples) for f in text_string_to_metric_families(text))
    if ours.bad_lines or len(ours.samples) != their_samples:
        raise SystemExit(f"parsers disagree: ours {len(ours.samples)} samples, theirs {their_samples}")
    if len(parse_metrics(text).devices) != gpus:
        raise SystemExit(f"expected {gpus} devices from the adapter")
    candidates: dict[str, Callable[[], object]] = {
        OURS: lambda: parse_text(text),
        OURS_FULL: lambda: parse_metrics(text),
        THEIRS: lambda: list(text_string_to_metric_families(text)),
    }
    times: dict[str, list[float]] = {name: [] for name in candidates}
    order = list(candidates)
    for round_no in range(repeats):
        # Interleaved, alternating order: drift (CPU frequency, other load) hits every parser alike.
        for name in order if round_no % 2 == 0 else reversed(order):
            times[name].append(timed(candidates[name]))
    print(
        f"scrape: {gpus} GPUs, {text.count(chr(10))} lines, {len(ours.samples)} samples, "
        f"{len(text)} bytes; {repeats} interleaved rounds"
    )
    medians: dict[str, float] = {}
    for name, t in times.items():
        est = estimate_median([v * 1000 for v in t])
        medians[name] = est.median / 1000
        print(f"  {name:<50} median {est.median:8.2f} ms  95 % CI {est.interval('.2f')}  min {min(t) * 1000:8.2f} ms")
    for label, ours_name in (("parse_text", OURS), ("parse_metrics", OURS_FULL)):
        ratios = [theirs / mine for theirs, mine in zip(times[THEIRS], times[ours_name], strict=True)]
        est = estimate_median(ratios)
        print(
            f"  prometheus_client / {label + ':':<15} {est.median:.1f}x "
            f"(median of {est.n} per-round ratios, 95 % CI {est.interval('.1f')})"
        )
    return medians


OURS = "ours: parse_text"
OURS_FULL = "ours: parse_metrics (parser + adapter)"
THEIRS = "prometheus_client: text_string_to_metric_families"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--gpus", type=int, default=16)
    parser.add_argument("--lines", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=None, help=f"interleaved rounds (default {REPEATS})")
    parser.add_argument("--quick", action="store_true", help=f"smoke run: {QUICK_REPEATS} rounds")
    args = parser.parse_args()
    repeats = args.repeats or (QUICK_REPEATS if args.quick else REPEATS)
    print("== exporter-shaped text (each GPU's label set repeats across families, as real exporters write)")
    measure(generate(args.gpus, args.lines), args.gpus, repeats)
    print("== worst case for us: every series has a distinct label set (no label-text reuse)")
    measure(generate(args.gpus, args.lines, unique_labels=True), args.gpus, repeats)


if __name__ == "__main__":
    main()
