"""A sharer the scheduler has not answered yet keeps its key's idle shadows in service.

The scheduler may bind a pending sharer to any shadow with a free slot, and the leader cannot
see that choice before the binding lands. So while a sharer of a key is pending and the
scheduler has not said it cannot place it, the leader drains none of that key's shadows
(controller/share/shadow_drain.py, "A sharer on its way"). Here the real scheduler is stopped
(SIGSTOP) for longer than the idle timeout, which is the slowest a scheduler can be: the
idle shadows must stay, and once it runs again the sharer binds to one and the spare one goes.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from gpushare import keys
from localcluster.cluster import Cluster
from tests.harness.worlds.scale import check_sharers, scale_world, sharer

IDLE_S = 20.0  # longer than deleting the first sharers takes, so no shadow drains before the test means it to


def _draining(shadows: list[dict[str, Any]]) -> list[str]:
    return [s["metadata"]["name"] for s in shadows if keys.ANNOTATION_SHADOW_DRAINING in _annotations(s)]


def _all_empty(shadows: list[dict[str, Any]]) -> bool:
    """No users record names anyone: the node side has seen the sharers go, and the leader's idle
    clocks can start."""
    return all(not json.loads(_annotations(s).get(keys.ANNOTATION_SHADOW_USERS) or "{}") for s in shadows)


def _annotations(pod: dict[str, Any]) -> dict[str, str]:
    return pod["metadata"].get("annotations") or {}


def test_idle_shadows_stay_while_a_sharer_waits_for_the_scheduler(cluster: Cluster, kwok: Path, tmp_path: Path) -> None:
    with scale_world(cluster, tmp_path, 2, idle_s=IDLE_S) as world:
        world.create([sharer(f"first-{i}") for i in range(5)])  # 4 + 1: two shadows
        world.wait_bound(5, timeout_s=120)
        world.wait("the first sharers recorded", lambda: world.records_written(5), 120)
        before = sorted(s["metadata"]["name"] for s in world.shadows())
        assert len(before) == 2, before

        scheduler = cluster.pids["kube-scheduler"]
        world.delete_all(timeout_s=60)
        # Both shadows idle from here, 8 free slots: the window below starts no earlier than the
        # leader's idle clocks, however slowly a loaded machine clears the records.
        world.wait("the users records cleared", lambda: _all_empty(world.shadows()), 60, poll_s=0.2)
        emptied = time.monotonic()
        os.kill(scheduler, signal.SIGSTOP)
        try:
            world.create([sharer("late")])
            # Past the idle timeout and several passes: with one slot asked for and 8 free, one
            # shadow would drain now, were it not for the sharer the scheduler may be placing.
            while time.monotonic() - emptied < IDLE_S + 15:
                shadows = world.shadows()
                assert sorted(s["metadata"]["name"] for s in shadows) == before
                assert _draining(shadows) == [], "a shadow drained while a sharer of its key was pending"
                time.sleep(1.0)
        finally:
            os.kill(scheduler, signal.SIGCONT)

        world.wait_bound(1, timeout_s=120)
        world.wait("the late sharer recorded", lambda: world.records_written(1), 120)
        world.wait("the spare shadow gone", lambda: len(world.shadows()) == 1, IDLE_S + 120)
        assert check_sharers(world.pods(), world.shadows()) == []
        assert world.node_side is not None and world.node_side.refused == set()
