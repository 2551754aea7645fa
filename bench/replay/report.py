"""Runs to figures: mean and 95 % confidence interval over seeds, GPUs saved against exclusive, the plot.

The interval is Student's t over the seeds' values (the seeds are independent draws of the same
workload distribution); GPUs saved pairs each mode's run with the exclusive run of the same seed
and scheduler profile, which placed the very same tasks in the same order, so the difference
carries no sampling noise of its own.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.replay.modes import Mode
from bench.replay.outcome import RunOutcome

# Two-sided 95 % quantiles of Student's t by degrees of freedom (1..30); beyond, the normal's.
_T95 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
ARRIVALS = (100, 130)
# The paper's GPU allocation ratio (%) by arrival (%), default trace, mean of 10 seeds
# (its artifact's cached results behind Fig. 9a).
PAPER = {
    "Random": {90: 85.02, 100: 86.30, 110: 86.88, 120: 87.28, 130: 87.47},
    "DotProd": {90: 89.98, 100: 90.62, 110: 90.70, 120: 90.77, 130: 90.85},
    "GpuClustering": {90: 89.98, 100: 91.65, 110: 91.73, 120: 91.80, 130: 91.88},
    "GpuPacking": {90: 89.98, 100: 91.78, 110: 91.86, 120: 91.92, 130: 92.00},
    "BestFit": {90: 89.99, 100: 92.86, 110: 92.94, 120: 93.00, 130: 93.08},
    "FGD": {90: 89.98, 100: 95.23, 110: 95.30, 120: 95.35, 130: 95.39},
}
PAPER_GPUS = 6212


@dataclass(frozen=True)
class Estimate:
    mean: float
    low: float
    high: float
    n: int

    def __str__(self) -> str:
        if self.n < 2:
            return f"{self.mean:.2f} (1 seed)"
        return f"{self.mean:.2f} [{self.low:.2f}, {self.high:.2f}]"


def estimate(values: Sequence[float]) -> Estimate:
    """Mean and two-sided 95 % Student-t interval."""
    if not values:
        raise ValueError("no values to estimate from")
    mean = statistics.fmean(values)
    if len(values) < 2:
        return Estimate(mean, mean, mean, 1)
    t = _T95[len(values) - 2] if len(values) - 1 <= len(_T95) else 1.960
    half = t * statistics.stdev(values) / math.sqrt(len(values))
    return Estimate(mean, mean - half, mean + half, len(values))


def read_runs(path: Path) -> list[RunOutcome]:
    """Every run a results file holds (one JSON object a line); a later run of the same mode, profile,
    seed and size replaces an earlier one."""
    runs: dict[tuple[str, str, int, int], RunOutcome] = {}
    for i, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            run = RunOutcome.from_json(json.loads(line))
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path} line {i}: not a replay run ({e})") from None
        runs[(run.mode, run.profile, run.seed, run.nodes)] = run
    return list(runs.values())


@dataclass(frozen=True)
class Row:
    mode: str
    profile: str
    nodes: int
    gpus: int
    seeds: tuple[int, ...]
    ratio: dict[int, Estimate]  # by arrival
    saved: Estimate | None  # GPUs saved against exclusive at 130 %, paired by seed
    unplaced_gpu_tasks: Estimate
    gpus_in_use: Estimate
    idle_shadows: Estimate
    minutes: Estimate
    problems: int


def rows(runs: Iterable[RunOutcome], arrivals: Sequence[int] = ARRIVALS) -> list[Row]:
    """One row per mode, profile and cluster size, in mode order."""
    groups: dict[tuple[str, str, int], list[RunOutcome]] = defaultdict(list)
    for run in runs:
        groups[(run.mode, run.profile, run.nodes)].append(run)
    exclusive = {(r.profile, r.nodes, r.seed): r for r in groups_of(groups, str(Mode.EXCLUSIVE))}
    order = {str(m): i for i, m in enumerate(Mode)}
    out = []
    for (mode, profile, nodes), group in sorted(groups.items(), key=lambda kv: (order.get(kv[0][0], 99), kv[0][1:])):
        group.sort(key=lambda r: r.seed)
        ratio = {}
        for a in arrivals:
            values = [v for r in group if (v := r.ratio_at(a)) is not None]
            if values:
                ratio[a] = estimate(values)
        saved = None
        if mode != str(Mode.EXCLUSIVE):
            diffs = [
                (mine - base) * r.gpus / 100
                for r in group
                if (b := exclusive.get((profile, nodes, r.seed))) is not None
                and (mine := r.ratio_at(arrivals[-1])) is not None
                and (base := b.ratio_at(arrivals[-1])) is not None
            ]
            saved = estimate(diffs) if diffs else None
        out.append(
            Row(
                mode=mode,
                profile=profile,
                nodes=nodes,
                gpus=group[0].gpus,
                seeds=tuple(r.seed for r in group),
                ratio=ratio,
                saved=saved,
                unplaced_gpu_tasks=estimate([r.unplaced_gpu_tasks for r in group]),
                gpus_in_use=estimate([r.gpus_in_use for r in group]),
                idle_shadows=estimate([r.idle_shadows for r in group]),
                minutes=estimate([r.seconds / 60 for r in group]),
                problems=sum(len(r.problems) for r in group),
            )
        )
    return out


def groups_of(groups: Mapping[tuple[str, str, int], list[RunOutcome]], mode: str) -> list[RunOutcome]:
    return [r for (m, _, _), g in groups.items() if m == mode for r in g]


def table(found: Sequence[Row], arrivals: Sequence[int] = ARRIVALS) -> str:
    """The rows as a Markdown table, then the paper's."""
    head = ["mode", "scheduler", "nodes", "seeds"]
    head += [f"allocation % at {a} % arrival" for a in arrivals]
    head += [f"GPUs saved vs exclusive at {arrivals[-1]} %", "GPU tasks unplaced", "GPUs in use", "min / run"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in found:
        cells = [r.mode, r.profile, str(r.nodes), ",".join(map(str, r.seeds))]
        cells += [str(r.ratio[a]) if a in r.ratio else "-" for a in arrivals]
        cells += [str(r.saved) if r.saved else "-", f"{r.unplaced_gpu_tasks.mean:.0f}"]
        cells += [f"{r.gpus_in_use.mean:.0f} of {r.gpus}", f"{r.minutes.mean:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "The paper (mean of 10 seeds, its own simulator, 1,213 nodes, 6,212 GPUs):", ""]
    lines += ["| policy | " + " | ".join(f"{a} %" for a in arrivals) + " |", "|---|" + "---|" * len(arrivals)]
    for name, by_arrival in PAPER.items():
        lines.append(f"| {name} | " + " | ".join(f"{by_arrival[a]:.2f}" for a in arrivals) + " |")
    return "\n".join(lines)


def mean_curve(group: Sequence[RunOutcome]) -> list[tuple[int, float]]:
    """The seeds' mean allocation ratio at each arrival every one of them reached."""
    reached = min(len(r.curve) for r in group)
    return [(group[0].curve[i][0], statistics.fmean(r.curve[i][1] for r in group)) for i in range(reached)]


def plot(runs: Sequence[RunOutcome], path: Path, *, profile: str, nodes: int) -> None:
    """Allocation ratio against arrival, per mode (mean over seeds), with the paper's FGD and BestFit."""
    import matplotlib  # noqa: PLC0415  (only the plot needs it)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    by_mode: dict[str, list[RunOutcome]] = defaultdict(list)
    for r in runs:
        if r.profile == profile and r.nodes == nodes:
            by_mode[r.mode].append(r)
    if not by_mode:
        raise ValueError(f"no runs with scheduler profile {profile!r} on {nodes} nodes to plot")
    fig, ax = plt.subplots(figsize=(7.5, 5), dpi=120)
    ax.plot([0, 100], [0, 100], color="0.85", linewidth=1, label="everything placed")
    for mode in Mode:
        group = by_mode.get(str(mode))
        if not group:
            continue
        xs, ys = zip(*mean_curve(group), strict=True)
        ax.plot(xs, ys, linewidth=1.8, label=f"gpushare {mode} ({len(group)} seeds)")
    for name, style in (("FGD", "--"), ("BestFit", ":")):
        points = sorted(PAPER[name].items())
        ax.plot([p[0] for p in points], [p[1] for p in points], style, color="black", marker="o", markersize=3,
                linewidth=1.2, label=f"paper: {name}")  # fmt: skip
    ax.set_xlim(0, 132)
    ax.set_ylim(0, 100)
    ax.set_xlabel("GPU requests arrived (% of the cluster's GPUs)")
    ax.set_ylabel("GPU allocation ratio (%)")
    ax.set_title(f"Alibaba openb trace on {nodes} simulated nodes, scheduler: {profile}")
    ax.grid(True, color="0.92")
    ax.legend(loc="lower right", fontsize=8)
    inset = ax.inset_axes((0.08, 0.55, 0.38, 0.38))
    for line in ax.get_lines():
        inset.plot(line.get_xdata(), line.get_ydata(), line.get_linestyle(), color=line.get_color(),
                   linewidth=line.get_linewidth(), marker=line.get_marker(), markersize=2)  # fmt: skip
    inset.set_xlim(85, 131)
    inset.set_ylim(70, 100)
    inset.tick_params(labelsize=7)
    inset.grid(True, color="0.92")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
