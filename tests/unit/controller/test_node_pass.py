"""The node's share plan withdraws a draining shadow's devices only after a fresh LIST shows nobody waiting."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from controller.core.actions import Action, AnnotatePod, PublishCapacity, SetDevices
from controller.core.mapping import MappingCache
from controller.core.model import PodResourcesEntry
from controller.errors import ApiUnavailable
from controller.node_pass import PassParts, plan_node
from controller.share.shadow_drain import (
    DRAIN_SETTLE_S,
    WITHDRAW_WINDOW_S,
    WRITE_BACK_HOLD_MAX_S,
    WRITE_BACK_SETTLE_S,
)
from gpushare import keys
from gpushare.config import Config
from tests.unit.controller.podmaker import NODE, row, shadow, sharer, snap

NOW = 10_000.0
CFG = Config(node_name=NODE)
RESOURCE = "gpushare/share-gpu-4"
TOKEN = f"{NOW - 100:.3f}"
IDS = tuple(f"gpushare-system/s-{i}" for i in range(4))
SETTLED = {
    keys.ANNOTATION_SHADOW_DRAINING: TOKEN,
    keys.ANNOTATION_SHADOW_DRAINED: f"{TOKEN} published {NOW - DRAIN_SETTLE_S - 1:.3f}",
}


class Lister:
    """A fresh LIST of the node's pods, counted."""

    def __init__(self, pods: Sequence[Mapping[str, Any]] = (), fail: bool = False) -> None:
        self.pods, self.fail, self.calls = list(pods), fail, 0

    def __call__(self) -> Sequence[Mapping[str, Any]]:
        self.calls += 1
        if self.fail:
            raise ApiUnavailable("gpushare: GET /api/v1/pods answered 503 (etcd); retrying in 1s")
        return self.pods


def shares(
    cached: list[dict[str, Any]],
    lister: Lister,
    rows: Sequence[PodResourcesEntry] = (),
    lowered: Mapping[str, float] | None = None,
) -> list[Action]:
    s = snap(cached, pod_resources=rows)
    mapping = MappingCache.rebuild(s.pod_resources, s.pods, CFG.real_resources)
    parts = PassParts()
    node = plan_node(
        CFG,
        s,
        mapping,
        NOW,
        parts=parts,
        spot=None,
        load=lambda _k: {},
        save=lambda *_: None,
        list_node_pods=lister,
        write_backs=None if lowered is None else (lambda: lowered),
    )
    assert parts.failures == []
    # This spec's list, count and answers only: the other specs' lists and the records are not the point here.
    return [
        a
        for a in node.actions
        if getattr(a, "resource", RESOURCE) == RESOURCE
        and not (isinstance(a, AnnotatePod) and a.key != keys.ANNOTATION_SHADOW_DRAINED)
    ]


def withdrawn(actions: list[Action]) -> bool:
    return SetDevices(RESOURCE, ()) in actions and any(isinstance(a, AnnotatePod) and a.value == TOKEN for a in actions)


def kept(actions: list[Action]) -> bool:
    return actions == [SetDevices(RESOURCE, IDS), PublishCapacity(RESOURCE, 0)]


def test_a_sharer_only_the_fresh_list_shows_keeps_the_devices_listed_and_the_answer_back() -> None:
    draining = shadow("s", annotations=SETTLED)
    lister = Lister([draining, sharer("late", node=NODE, phase="Pending")])
    assert kept(shares([draining], lister))
    assert lister.calls == 1


def test_with_nobody_waiting_in_the_fresh_list_the_devices_are_withdrawn_and_answered() -> None:
    draining = shadow("s", annotations=SETTLED)
    # A sharer of another spec waiting, one admitted (PodResources shows its device), one failed: none waits here.
    others = [
        sharer("two", spec=2, node=NODE, phase="Pending"),
        sharer("in", node=NODE, phase="Running"),
        sharer("gone", node=NODE, phase="Failed"),
    ]
    rows = [row("default/in", "app", RESOURCE, "gpushare-system/t-0")]
    lister = Lister([draining, shadow("t"), *others])
    actions = shares([draining, shadow("t"), *others], lister, rows)
    assert SetDevices(RESOURCE, tuple(f"gpushare-system/t-{i}" for i in range(4))) in actions
    assert any(isinstance(a, AnnotatePod) and a.value == TOKEN for a in actions)
    assert lister.calls == 1


def test_a_failed_list_keeps_the_devices_listed_and_says_why(caplog: pytest.LogCaptureFixture) -> None:
    draining = shadow("s", annotations=SETTLED)
    with caplog.at_level(logging.WARNING, logger="controller.node_pass"):
        assert kept(shares([draining], Lister(fail=True)))
    (line,) = [r for r in caplog.records if "devices kept listed this pass" in r.getMessage()]
    assert "503" in line.kv["reason"]  # type: ignore[attr-defined]


def test_no_list_is_taken_unless_the_plan_withdraws() -> None:
    settling = shadow("s", annotations={keys.ANNOTATION_SHADOW_DRAINING: TOKEN})  # first sight: publish, note
    lister = Lister()
    actions = shares([settling], lister)
    assert actions[:2] == [SetDevices(RESOURCE, IDS), PublishCapacity(RESOURCE, 0)]
    assert lister.calls == 0
    assert shares([shadow("s")], lister) == [SetDevices(RESOURCE, IDS)] and lister.calls == 0


def test_an_empty_fresh_list_confirms_the_withdrawal() -> None:
    draining = shadow("s", annotations=SETTLED)
    assert withdrawn(shares([draining], Lister([draining])))


def test_a_withdrawal_waits_for_the_gap_after_a_write_back() -> None:
    """Too soon after the agent lowered a written-back count, a sharer placed on it may not be
    bound yet; too late, kubelet's next status may show the full count after the devices left.
    Only in between does the withdrawal go (and only then is the fresh LIST taken)."""
    draining = shadow("s", annotations=SETTLED)
    lister = Lister([draining])
    for ago in (0.0, WRITE_BACK_SETTLE_S - 0.1, WRITE_BACK_SETTLE_S + WITHDRAW_WINDOW_S, 9.0):
        assert kept(shares([draining], lister, lowered={RESOURCE: NOW - ago})), ago
    assert kept(shares([draining], lister, lowered={}))  # none seen yet: wait for one
    assert lister.calls == 0
    assert withdrawn(shares([draining], lister, lowered={RESOURCE: NOW - WRITE_BACK_SETTLE_S}))
    assert withdrawn(shares([draining], lister, lowered={RESOURCE: NOW - WRITE_BACK_SETTLE_S - 0.9}))
    # Another spec's write-back says nothing about this one's.
    assert kept(shares([draining], lister, lowered={"gpushare/share-gpu-2": NOW - WRITE_BACK_SETTLE_S}))


def test_write_backs_govern_a_drain_only_so_long_after_its_publish() -> None:
    """A kubelet that writes back too often for the gap, or never, cannot keep an idle shadow:
    past the cap the fresh LIST alone decides."""
    late = {
        keys.ANNOTATION_SHADOW_DRAINING: TOKEN,
        keys.ANNOTATION_SHADOW_DRAINED: f"{TOKEN} published {NOW - WRITE_BACK_HOLD_MAX_S - 0.1:.3f}",
    }
    draining = shadow("s", annotations=late)
    lister = Lister([draining])
    assert withdrawn(shares([draining], lister, lowered={RESOURCE: NOW}))
    assert lister.calls == 1
    inside = {**late, keys.ANNOTATION_SHADOW_DRAINED: f"{TOKEN} published {NOW - WRITE_BACK_HOLD_MAX_S + 0.1:.3f}"}
    assert kept(shares([shadow("s", annotations=inside)], lister, lowered={RESOURCE: NOW}))
