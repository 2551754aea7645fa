"""The admission-race benchmark counts the agent's drain guards by their log lines: the lines must exist."""

from __future__ import annotations

from pathlib import Path

from bench.admission_race import AGENT_LINES, agent_counts

REPO = Path(__file__).resolve().parents[3]


def test_each_counted_line_is_one_the_agent_logs() -> None:
    source = "".join(p.read_text() for p in (REPO / "controller").rglob("*.py"))
    for line in AGENT_LINES.values():
        assert f'"{line}"' in source, line


def test_the_counts_are_per_line() -> None:
    log = "\n".join(
        [
            "2026-12-03T14:00:00.000Z INFO  controller.share.node_watch: share count written back; "
            "lowered again node=n",
            "2026-12-03T14:00:01.000Z INFO  controller.share.node_watch: share count written back; "
            "lowered again node=n",
            "2026-12-03T14:00:02.000Z INFO  controller.node_pass: a sharer waits for admission; draining devices "
            "kept listed resources=[]",
        ]
    )
    assert agent_counts(log) == {"counts_lowered_again": 2, "withdrawals_held_for_a_sharer": 1}
    assert agent_counts("") == {"counts_lowered_again": 0, "withdrawals_held_for_a_sharer": 0}
