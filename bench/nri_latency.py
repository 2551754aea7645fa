#!/usr/bin/env python3
"""CRI CreateContainer latency on real containerd: no plugin vs gpushare's NRI plugin vs a Go plugin.

    .venv/bin/python bench/nri_latency.py [--containerd 2.x|1.7.24] [--pairs 200] [--quick]

One private containerd (the harness's containerd) and one pod whose `main` holds a fake GPU.
Each measured call creates container `t` again (a new kubelet-style attempt number; the previous
one is removed first, so the runtime's state stays the same size) and the active plugin adjusts it
with that one device: gpushare through the same-pod pod annotation, the Go device-injector (built
on the upstream nri stub next to containerd 2.x; it serves 1.7.24 too) through its
`devices.nri.io/container.<name>` annotation. Every container carries both annotations, so the
CRI request is the same size in every mode.

The added latency of a plugin is the median of paired differences: each pair is one container
created with the plugin connected and one with no plugin connected, back to back, the order
alternating from pair to pair, so the drift of a shared 2-core machine falls on both halves. Only
one plugin may be connected at a time (NRI calls them all), so the plugin is connected and
disconnected between the two halves; after every switch unmeasured calls run until the new state
is in effect (a plugin may log that it started a moment before the runtime lists it). The 95 %
interval is a bootstrap (bench/stats.py); when it spans 0 the plugin's cost is printed as not
distinguishable from 0. Also printed: median and p99 (nearest rank; refused below 200 samples)
per mode, each plugin's own handler p50/p99 (its `took_ms=`/`took_us=` log field: wall time) and,
where logged (gpushare's `cpu_ms=`), the handler thread's CPU time, which the scheduling delays of
a loaded machine do not inflate.
Goals: gpushare handler p99 < 1 ms; gpushare's added median <= the Go plugin's + 1 ms.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.stats import (
    BOOTSTRAP_RESAMPLES,
    estimate_median,
    estimate_median_difference,
    format_percentile,
    median,
    paired_differences,
    percentile,
    tail_percentile,
)
from gpushare import keys
from localcluster.containerd import Containerd, InstallMissing, find_install
from localcluster.cri import CriClient, DeviceSpec, Pod
from tests.harness.devices import FakeDevice, make_fake_device
from tests.harness.plugin_process import PluginProcess

GPU_PATH = "/dev/fakegpu0"
VISIBLE = "NVIDIA_VISIBLE_DEVICES"
PROBES = 10
TARGET = "t"
PAIRS = 200
QUICK_PAIRS = 20
NONE = "none"


@dataclass
class Mode:
    name: str
    start: Callable[[], PluginProcess | None]
    create_ms: list[float] = field(default_factory=list)
    handler_ms: list[float] = field(default_factory=list)
    handler_cpu_ms: list[float] = field(default_factory=list)
    adjusted: int = 0
    # One (with this plugin, with no plugin) pair of CreateContainer times per pair measured.
    pairs: list[tuple[float, float]] = field(default_factory=list)


def go_injector_path() -> Path | None:
    """The Go plugin is built with containerd 2.x (same nri module); it also serves 1.7.24."""
    try:
        return find_install("2.x").device_injector
    except InstallMissing:
        return None


def _go_injector(cd: Containerd, path: Path) -> PluginProcess:
    # The nri stub logs "Started plugin" once registered, configured and synchronized.
    return PluginProcess([str(path), "-socket", cd.nri_socket, "-idx", "20"], ready_line="Started plugin")


def _annotations(dev: FakeDevice, names: list[str]) -> dict[str, str]:
    device = json.dumps([{"path": GPU_PATH, "type": "c", "major": dev.major, "minor": dev.minor, "file_mode": 0o666}])
    out: dict[str, str] = {}
    for name in names:
        out[f"{keys.POD_ANNOTATION_DEVICES_FROM_PREFIX}{name}"] = "main"
        out[f"devices.nri.io/container.{name}"] = device
    return out


def _create(cri: CriClient, pod: Pod, attempts: Iterator[int]) -> float:
    """Create the target container once more (new attempt); return the CreateContainer time in ms."""
    if TARGET in pod.containers:
        cri.remove_container(pod.containers.pop(TARGET))
    attempt = next(attempts)
    t0 = time.perf_counter()
    cri.create_container(pod, TARGET, command=["true"], attempt=attempt)
    return (time.perf_counter() - t0) * 1000


def _has_handler_lines(plugin: PluginProcess, since: int, n: int, timeout_s: float) -> bool:
    """A plugin logs its handler time just after answering; wait for the lines of the calls made."""
    deadline = time.monotonic() + timeout_s
    while len(plugin.handler_times_ms(since)) < n:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


class Switchboard:
    """Keeps exactly one mode in effect: its plugin connected (or none), switching only when asked."""

    def __init__(self, cri: CriClient, pod: Pod) -> None:
        self.cri = cri
        self.pod = pod
        self.attempts = itertools.count()
        self.active: Mode | None = None
        self.plugin: PluginProcess | None = None
        self.mark = 0
        self.measured = 0

    def measure(self, mode: Mode) -> float:
        """One measured CreateContainer with ``mode`` in effect."""
        if mode is not self.active:
            self._switch(mode)
        ms = _create(self.cri, self.pod, self.attempts)
        mode.create_ms.append(ms)
        self.measured += 1
        return ms

    def _switch(self, mode: Mode) -> None:
        self.close()
        plugin = mode.start()
        if plugin is not None:
            plugin.start()
        self.active, self.plugin = mode, plugin
        # Unmeasured calls until one reaches the plugin (or, with none, one call that meets no
        # plugin): this also keeps the first call after a connect or disconnect out of the figures.
        for attempt in range(PROBES):
            _create(self.cri, self.pod, self.attempts)
            if plugin is None or _has_handler_lines(plugin, 0, 1, timeout_s=1.0):
                break
            if attempt == PROBES - 1:
                raise RuntimeError(f"{plugin.argv[0]} never handled a CreateContainer; output: {plugin.lines[-5:]}")
        self.mark = plugin.mark() if plugin is not None else 0
        self.measured = 0

    def close(self) -> None:
        """Collect the active plugin's handler times for the calls measured, then disconnect it."""
        mode, plugin, n = self.active, self.plugin, self.measured
        self.active, self.plugin = None, None
        if plugin is None or mode is None:
            return
        try:
            if not _has_handler_lines(plugin, self.mark, n, timeout_s=5.0):
                raise RuntimeError(f"{plugin.argv[0]} logged {len(plugin.handler_times_ms(self.mark))} of {n} times")
            mode.handler_ms.extend(plugin.handler_times_ms(self.mark)[:n])
            mode.handler_cpu_ms.extend(plugin.handler_times_ms(self.mark, field="cpu")[:n])
            lines = [ln for ln in plugin.lines[self.mark :] if "took_" in ln][:n]
            mode.adjusted += sum(1 for ln in lines if "devices=1" in ln)
        finally:
            plugin.stop()


def measure_pairs(board: Switchboard, none: Mode, plugins: list[Mode], pairs: int) -> None:
    """Round after round, one pair per plugin; a pair's order and the plugins' order alternate.

    Round 0 runs gpushare/none, none/Go; round 1 Go/none, none/gpushare: consecutive pairs meet in
    the same state, so each round needs about one plugin start, not four.
    """
    for r in range(pairs):
        order = list(enumerate(plugins)) if r % 2 == 0 else list(reversed(list(enumerate(plugins))))
        for index, plugin in order:
            if (r + index) % 2 == 0:
                with_ms, without_ms = board.measure(plugin), board.measure(none)
            else:
                without_ms = board.measure(none)
                with_ms = board.measure(plugin)
            plugin.pairs.append((with_ms, without_ms))


def run(version: str, pairs: int, go_plugin: Path | None) -> dict[str, object]:
    inst = find_install(version)
    with (
        Containerd(inst, nri=True) as cd,
        make_fake_device() as dev,
        CriClient(cd.address, cgroup_parent=cd.cgroup_parent) as cri,
    ):
        none = Mode(NONE, lambda: None)
        plugins = [Mode("gpushare", lambda: PluginProcess.gpushare(cd))]
        if go_plugin is not None:
            plugins.append(Mode("go-device-injector", lambda: _go_injector(cd, go_plugin)))
        pod = cri.run_pod("nri-bench", annotations=_annotations(dev, [TARGET]))
        cri.run_container(pod, "main", devices=[DeviceSpec(GPU_PATH, str(dev.path))], envs={VISIBLE: "0"})
        board = Switchboard(cri, pod)
        try:
            measure_pairs(board, none, plugins, pairs)
        finally:
            board.close()
        cri.remove_pod(pod.id)
    return {"containerd": f"{version} ({inst.bin_dir})", "pairs": pairs, "modes": [none, *plugins]}


def _p50_p99(values: list[float]) -> str:
    return f"{percentile(values, 50):.3f}/{format_percentile(values, 99, '.3f')}" if values else "-"


def _table(modes: list[Mode]) -> list[str]:
    base = median(modes[0].create_ms)
    rows = [
        f"{'mode':<20}{'n':>5}{'median ms':>11}{'p99 ms':>14}{'x none':>8}"
        f"{'handler p50/p99 ms':>24}{'cpu p50/p99 ms':>24}{'adjusted':>10}"
    ]
    for m in modes:
        med = median(m.create_ms)
        adjusted = f"{m.adjusted}/{len(m.create_ms)}" if m.name != NONE else "-"
        rows.append(
            f"{m.name:<20}{len(m.create_ms):>5}{med:>11.2f}{format_percentile(m.create_ms, 99):>14}"
            f"{med / base:>8.2f}{_p50_p99(m.handler_ms):>24}{_p50_p99(m.handler_cpu_ms):>24}{adjusted:>10}"
        )
    return rows


def _added(m: Mode) -> list[float]:
    return paired_differences([w for w, _ in m.pairs], [wo for _, wo in m.pairs])


def _goals(by_name: dict[str, Mode]) -> list[str]:
    rows = []
    gs = by_name["gpushare"]
    p99 = tail_percentile(gs.handler_ms, 99)
    if p99 is None:
        rows.append(f"goal: gpushare handler p99 < 1 ms: not judged (p99 n/a, n={len(gs.handler_ms)}<200)")
    else:
        rows.append(f"goal: gpushare handler p99 < 1 ms: {'met' if p99 < 1.0 else 'NOT met'} ({p99:.3f} ms)")
    go = by_name.get("go-device-injector")
    if go is None:
        rows.append("Go device-injector baseline: not built (it is built with containerd 2.x: make containerd-deps)")
        return rows
    # gpushare's added ms minus Go's: two independent sets of pairs, so a two-sample bootstrap.
    diff = estimate_median_difference(_added(gs), _added(go))
    if not diff.has_interval:
        verdict = "not judged (too few pairs for an interval)"
    elif diff.high <= 1.0:
        verdict = "met"
    else:
        verdict = "NOT met" if diff.low > 1.0 else "not decided (the CI spans +1 ms)"
    rows.append(
        f"goal: gpushare added median <= Go plugin's + 1 ms: {verdict} "
        f"(gpushare minus Go: {diff.describe(what='pairs each')})"
    )
    return rows


def report(result: dict[str, object]) -> str:
    modes: list[Mode] = result["modes"]  # type: ignore[assignment]
    rows = [
        f"CRI CreateContainer latency, containerd {result['containerd']}: {result['pairs']} pairs per plugin, "
        "each one container with the plugin and one with none, back to back, order alternating "
        "(after each plugin switch, unmeasured calls until the new state answers)",
        *_table(modes),
        "added by the plugin: median of paired differences (with - without), 95 % bootstrap CI "
        f"({BOOTSTRAP_RESAMPLES} resamples, fixed seed):",
    ]
    for m in modes[1:]:
        rows.append(f"  {m.name:<20}{estimate_median(_added(m)).describe()}")
    rows += _goals({m.name: m for m in modes})
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog=f"p99 figures need >= 200 samples; --quick ({QUICK_PAIRS} pairs) prints them as n/a.",
    )
    parser.add_argument("--containerd", default="2.x", choices=["2.x", "1.7.24"])
    parser.add_argument(
        "--pairs", "--count", dest="pairs", type=int, default=None, help=f"pairs per plugin (default {PAIRS})"
    )
    parser.add_argument("--quick", action="store_true", help=f"smoke run: {QUICK_PAIRS} pairs per plugin")
    parser.add_argument("--go-plugin", type=Path, default=None, help="Go NRI plugin binary (default: the built one)")
    args = parser.parse_args(argv)
    pairs = args.pairs or (QUICK_PAIRS if args.quick else PAIRS)
    try:
        result = run(args.containerd, pairs, args.go_plugin or go_injector_path())
    except InstallMissing as exc:
        print(f"nri_latency: {exc}", file=sys.stderr)
        return 2
    print(report(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
