"""A sharer whose shadow is gone is killed through its pod cgroup, not only deleted.

Deleting leaves the pod its grace period, which the tenant sets (an hour, say) while the GPU is
no longer held for it; so the node plan kills the pod with the eviction, and again every pass
while the pod terminates with its shadow gone.
"""

from __future__ import annotations

from typing import Any

import pytest

from controller.core.actions import REASON_SHADOW_GONE, Evict, KillPods, PodToKill
from controller.core.mapping import MappingCache
from controller.core.pod_facts import PodRef
from controller.share.solver import plan_node_shares
from gpushare import keys
from gpushare.config import Config
from tests.unit.controller.podmaker import NODE, row, shadow, sharer, snap

CFG = Config(node_name=NODE)
GONE = {"deleted_shadows": [PodRef("gpushare-system", "s", "uid-gpushare-system-s")]}


def held(*names: str, shadow_name: str = "s") -> list[Any]:
    return [
        row(f"default/{n}", "app", "gpushare/share-gpu-4", f"gpushare-system/{shadow_name}-{i}")
        for i, n in enumerate(names)
    ]


def bound(name: str, **kw: Any) -> dict[str, Any]:
    return sharer(name, node=NODE, phase="Running", container_ids={"app": f"c-{name}"}, running=True, **kw)


def plan(pods: list[dict[str, Any]], rows: list[Any], **kw: Any) -> list[Any]:
    s = snap(pods, **kw)
    return plan_node_shares(s, MappingCache.rebuild(rows, s.pods, CFG.real_resources), CFG)


def kills(actions: list[Any]) -> list[KillPods]:
    return [a for a in actions if isinstance(a, KillPods)]


def test_the_eviction_comes_with_a_kill_of_the_pod_first() -> None:
    actions = plan([bound("a"), bound("b")], held("a", "b"), **GONE)
    (kill,) = kills(actions)
    assert kill.reason == REASON_SHADOW_GONE
    assert kill.pods == (
        PodToKill(PodRef("default", "a", "uid-default-a"), 1),
        PodToKill(PodRef("default", "b", "uid-default-b"), 1),
    )
    evicts = [a for a in actions if isinstance(a, Evict)]
    assert [e.ref.name for e in evicts] == ["a", "b"]
    # Killed before the delete: a long grace period never starts with the tasks still running.
    assert actions.index(kill) < actions.index(evicts[0])


@pytest.mark.parametrize(
    ("kw", "killed"),
    [
        (GONE, True),  # a watch said the shadow was deleted
        ({"shadow_list_fresh": True}, True),  # absent from a fresh full LIST
        ({}, False),  # merely absent from a cache that may be stale: nothing is known
    ],
)
def test_a_terminating_sharer_keeps_being_killed_while_its_shadow_is_gone(kw: dict[str, Any], killed: bool) -> None:
    """The pod deleted with a 3600 s grace period: no second eviction, but a kill every pass."""
    actions = plan([bound("a", deleting=True)], held("a"), **kw)
    assert [a for a in actions if isinstance(a, Evict)] == []
    assert [k.refs for k in kills(actions)] == ([(PodRef("default", "a", "uid-default-a"),)] if killed else [])


def test_a_terminating_sharer_of_a_live_shadow_is_left_to_its_grace_period() -> None:
    """Deleted by its tenant while its shadow still holds the GPU: the GPU is still its own to use."""
    assert kills(plan([shadow("s"), bound("a", deleting=True)], held("a"))) == []


def test_a_forged_owner_record_kills_only_the_forgers_pod() -> None:
    """The record sits on the tenant's pod: it may add a reason to kill that pod, never reach another."""
    forged = {keys.ANNOTATION_SHADOW_OWNER: '{"gpushare-system/s":"old"}'}
    actions = plan([shadow("s"), bound("a", annotations=forged, deleting=True), bound("b")], held("a", "b"))
    assert [k.refs for k in kills(actions)] == [(PodRef("default", "a", "uid-default-a"),)]
    assert [a for a in actions if isinstance(a, Evict)] == []


def test_sharers_of_other_shadows_and_nodes_are_untouched() -> None:
    rows = held("a") + held("c", shadow_name="t")
    pods = [shadow("t"), bound("a"), bound("c"), sharer("far", node="node-b", phase="Running", deleting=True)]
    (kill,) = kills(plan(pods, rows, **GONE))
    assert kill.refs == (PodRef("default", "a", "uid-default-a"),)


def test_a_pod_with_nothing_running_is_still_named_with_zero_running() -> None:
    """Its containers already died: the kill finds nothing, and that is not an error (running 0)."""
    pod = sharer("a", node=NODE, phase="Running", deleting=True)
    (kill,) = kills(plan([pod], held("a"), **GONE))
    assert kill.pods == (PodToKill(PodRef("default", "a", "uid-default-a"), 0),)
