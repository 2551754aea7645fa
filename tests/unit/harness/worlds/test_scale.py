"""The scale world's pieces that need no cluster: the settled-world check, the stage clock and the CPU
accounting (tests/harness/worlds/scale.py)."""

from __future__ import annotations

import json
import os
from typing import Any

from gpushare import keys
from tests.harness.worlds.scale import (
    NAMESPACE,
    THIS_PROCESS,
    StageClock,
    check_sharers,
    cpu_between,
    cpu_by_process,
    level_reached_at,
    reached_at,
)
from tests.unit.controller.loop_pods import pod, shadow

SHARE4 = "gpushare/share-gpu-4"


def _sharer(name: str, node: str) -> dict[str, Any]:
    return pod(name, ns="team", node=node, phase="Running", limits={SHARE4: "1"})


def _settled(name: str, node: str, shadow_key: str) -> dict[str, Any]:
    p = _sharer(name, node)
    p["metadata"]["annotations"] = {keys.ANNOTATION_SHADOW_OWNER: json.dumps({shadow_key: "uid"})}
    return p


def test_the_settled_world_check_names_each_kind_of_fault() -> None:
    shadows = [shadow("s0", node="n1", phase="Running"), shadow("s1", node="n2", phase="Running")]
    good = [_settled(f"a{i}", "n1", "gpushare-system/s0") for i in range(4)]
    assert check_sharers(good, shadows[:1]) == []
    wrong_node = [_settled("b", "n2", "gpushare-system/s0")]
    assert "elsewhere" in check_sharers(wrong_node, shadows[:1])[0]
    over = [*good, _settled("a4", "n1", "gpushare-system/s0")]
    assert any("over its 4" in p for p in check_sharers(over, shadows))
    assert any("at most 1 needed" in p for p in check_sharers(good, shadows))
    unrecorded = [_sharer("c", "n1")]
    assert "recorded on 0 shadows" in check_sharers(unrecorded, shadows[:1])[0]


# -- the stage clock: each pod's stage times from the events of one watch ----------------------------


def _scale_pod(name: str, node: str = "", uid: str = "") -> dict[str, Any]:
    p = pod(name, ns=NAMESPACE, node=node, limits={SHARE4: "1"})
    p["metadata"]["uid"] = uid or f"uid-{name}"
    return p


def test_the_stage_clock_notes_when_each_pod_first_reached_each_stage() -> None:
    stages = StageClock(SHARE4)
    stages.pod_seen("ADDED", _scale_pod("s0"), 1.0)
    stages.pod_seen("MODIFIED", _scale_pod("s0", "n1"), 2.0)
    stages.pod_seen("MODIFIED", _scale_pod("s0", "n1"), 3.0)  # later events do not move it
    stages.pod_seen("ADDED", _sharer("elsewhere", "n1"), 1.5)  # not the test namespace
    stages.pod_seen("DELETED", _scale_pod("s1", "n1"), 1.5)  # a deletion says nothing of binding
    stages.pod_seen("ADDED", shadow("box-0"), 1.0)
    stages.pod_seen("MODIFIED", shadow("box-0", node="n1"), 2.5)
    stages.pod_seen("MODIFIED", shadow("box-0", node="n1", phase="Running"), 4.0)
    stages.pod_seen("LISTED", shadow("box-1", node="n2", phase="Running"), 5.0)  # first seen Running
    assert stages.bound() == {"s0": 2.0}
    assert stages.shadow_times() == {
        "shadows created": [1.0, 5.0],
        "shadows bound": [2.5, 5.0],
        "shadows Running": [4.0, 5.0],
    }
    for node, count, at in (("n1", 4, 4.5), ("n2", 4, 5.5), ("n1", 0, 7.0)):
        stages.capacity_published(node, SHARE4, count, at)
    stages.capacity_published("n1", "example.com/gpu", 8, 6.0)  # another resource
    assert stages.slots() == [(4.5, 4), (5.5, 8), (7.0, 4)]
    assert [level_reached_at(stages.slots(), f) for f in (0.5, 1.0)] == [4.5, 5.5]


def test_after_a_reset_only_pods_new_to_the_clock_count() -> None:
    stages = StageClock(SHARE4)
    stages.pod_seen("MODIFIED", _scale_pod("s0", "n1"), 1.0)
    stages.capacity_published("n1", SHARE4, 4, 1.0)
    stages.reset()
    assert stages.bound() == {} and stages.slots() == []
    stages.pod_seen("MODIFIED", _scale_pod("s0", "n1"), 2.0)  # the last phase's pod, late on the watch
    stages.pod_seen("MODIFIED", _scale_pod("s0", "n2", uid="new"), 3.0)  # this phase's pod of the same name
    stages.capacity_published("n2", SHARE4, 4, 4.0)
    assert stages.bound() == {"s0": 3.0}
    assert stages.slots() == [(4.0, 8)]  # the nodes' counts carry over: the level is the cluster's


def test_a_stage_reaches_a_fraction_of_its_count_at_that_pods_time() -> None:
    times = [1.0, 2.0, 3.0, 4.0, 10.0]
    assert [reached_at(times, f) for f in (0.5, 0.9, 1.0)] == [3.0, 10.0, 10.0]
    assert reached_at([], 0.5) is None and level_reached_at([], 0.5) is None
    assert reached_at([7.0], 0.01) == 7.0


def test_cpu_seconds_are_read_for_live_processes_and_left_out_for_gone_ones() -> None:
    got = cpu_by_process({"me": os.getpid(), "gone": 0, "never": 2**22 + 12345})
    assert set(got) == {"me", THIS_PROCESS} and got["me"] >= 0
    assert cpu_between({"a": 1.0, "b": 2.0}, {"a": 3.5, "c": 1.0}) == {"a": 2.5}
