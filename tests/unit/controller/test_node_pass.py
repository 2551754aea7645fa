"""The node's share plan withdraws a draining shadow's devices only after a fresh LIST shows nobody waiting."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from controller.core.actions import Action, AnnotatePod, PublishCapacity, SetDevices
from controller.core.mapping import MappingCache
from controller.core.model import PodResourcesEntry
from controller.core.shadow_drain import DRAIN_SETTLE_S, WRITE_BACK_HOLD_MAX_S
from controller.errors import ApiUnavailable
from controller.node_pass import PassParts, plan_node
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
    exposed: frozenset[str] = frozenset(),
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
        recently_exposed=lambda: exposed,
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


def test_a_count_kubelet_wrote_back_within_the_settle_time_keeps_the_devices_listed_without_a_list() -> None:
    """The scheduler may have placed a sharer on the full count while it showed: its binding can
    reach this node up to the settle time later, and it needs the devices then."""
    draining = shadow("s", annotations=SETTLED)
    lister = Lister([draining])
    assert kept(shares([draining], lister, exposed=frozenset({RESOURCE})))
    assert lister.calls == 0
    # Another spec's count shown again changes nothing for this one.
    assert withdrawn(shares([draining], lister, exposed=frozenset({"gpushare/share-gpu-2"})))


def test_write_backs_hold_a_drain_only_so_long_after_its_publish() -> None:
    """A kubelet whose status period is shorter than the write-back settle time shows the full
    count again before every hold ends: past the cap the fresh LIST alone decides, so an idle
    shadow still goes."""
    late = {
        keys.ANNOTATION_SHADOW_DRAINING: TOKEN,
        keys.ANNOTATION_SHADOW_DRAINED: f"{TOKEN} published {NOW - WRITE_BACK_HOLD_MAX_S - 0.1:.3f}",
    }
    draining = shadow("s", annotations=late)
    lister = Lister([draining])
    assert withdrawn(shares([draining], lister, exposed=frozenset({RESOURCE})))
    assert lister.calls == 1
    # Just inside the cap the write-back still holds it.
    inside = {**late, keys.ANNOTATION_SHADOW_DRAINED: f"{TOKEN} published {NOW - WRITE_BACK_HOLD_MAX_S + 0.1:.3f}"}
    assert kept(shares([shadow("s", annotations=inside)], lister, exposed=frozenset({RESOURCE})))
