"""docs/nvidia.md's table, written from the NVIDIA tier's measurements (test_gpu_parts.py)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from cli.doctor.nvidia_modes import nvidia_verdict
from tests.harness.gpu_part import diff
from tests.integration.nvidia.gpu_parts import RUNTIMES, STRATEGIES, Measurement

DOCS = Path(__file__).resolve().parents[3] / "docs" / "nvidia.md"
TABLE_BEGIN = "<!-- table: written by tests/integration/nvidia/test_gpu_parts.py; do not edit -->"
TABLE_END = "<!-- end of table -->"


def render_table(measurements: Iterable[Measurement], releases: Mapping[str, str]) -> str:
    """One row per (strategy, runtime, containerd); ``releases`` names each install's real release."""
    by_key = {(m.strategy, m.runtime, m.containerd): m for m in measurements}
    versions = sorted({v for _, _, v in by_key})
    lines = [
        "| strategy | runtime | containerd | exclusive pod | DinD target, sharer, spot borrower | how | note, fix |",
        "|---|---|---|---|---|---|---|",
    ]
    for strategy in STRATEGIES:
        for runtime in (r.name for r in RUNTIMES):
            for version in versions:
                m = by_key.get((strategy, runtime, version))
                if m is None:
                    continue
                verdict = nvidia_verdict(strategy, runtime, int(version.split(".")[0]))
                exclusive = "gets the GPU" if verdict.exclusive else "**no GPU**"
                parts = [part for part, _ in m.recipients().values()]
                if any(part is None for part in parts):
                    target = "refused"
                elif all(part == m.exclusive for part in parts):
                    target = "same part"
                else:
                    lines_off = max(len(diff(m.exclusive, part)) for part in parts if part is not None)
                    target = f"same part but {lines_off} line(s), see note"
                note = "; ".join(x for x in (verdict.note, f"fix: {verdict.fix}" if verdict.fix else "") if x)
                lines.append(
                    f"| `{strategy}` | {runtime} | {releases.get(version, version)} | {exclusive} | {target} "
                    f"| {verdict.how} | {note} |"
                )
    return "\n".join(lines) + "\n"
