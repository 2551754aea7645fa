"""`gpushare status` text for spot: a blocked node, kills that went wrong, the last return."""

from __future__ import annotations

from typing import Any

from cli.status import render_text


def doc(spot_runtime: dict[str, Any], gpus: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"source": "agent", "node": "n1", "at": 0, "spot": gpus or [], "spot_runtime": spot_runtime}


def test_a_node_that_lends_nothing_says_why_first() -> None:
    why = "no kubepods cgroup under /sys/fs/cgroup (cgroup v2): kubelet is not running on this host"
    gpu = {"real_id": "g0", "state": "busy", "owner": "team/o/app", "borrowers": [], "reason": f"not lent: {why}"}
    text = render_text(doc({"mode": "kernel module + utilization", "lending_blocked": why}, [gpu]))
    assert f"  LENDING BLOCKED: {why}" in text.splitlines()
    assert f"      not lent: {why}" in text.splitlines()


def test_kill_errors_and_the_bound_are_shown_beside_the_last_return() -> None:
    rt = {
        "mode": "kernel module + utilization",
        "lending_blocked": "",
        "cgroups": "cgroup v1, cgroupfs driver, pods under /sys/fs/cgroup/freezer/kubepods; kill: SIGKILL each task",
        "kill_errors": {"no_tasks": 2},
        "kill_bound_exceeded": 1,
        "kill_bound_s": 2.0,
        "last_return": {
            "owner": "team/o/app",
            "pods": ["spot/a", "spot/b"],
            "borrowers": 2,
            "return_to_dead_ms": 12.5,
            "release_ms": 13.1,
        },
    }
    lines = render_text(doc(rt)).splitlines()
    assert f"  pod cgroups: {rt['cgroups']}" in lines
    assert "  KILL ERRORS: no_tasks=2; tasks alive past the 2.0s bound: 1 (owner released anyway)" in lines
    assert (
        "  last return: owner team/o/app; borrowers spot/a,spot/b; dead 12.5 ms after the owner's signal; "
        "owner released after 13.1 ms" in lines
    )
