"""The parts of a pass fail on their own, and a pod no reader can read costs that pod only.

The leader's cluster plan, spot's plan and the share plugins' plan each run guarded: an
exception in one is logged, named in the report, and costs that part's actions only.
"""

from __future__ import annotations

from typing import Any

import pytest

from controller.applier import EVENTS_PER_PASS
from controller.core.actions import RecordEvent, SetDevices
from controller.core.pod_facts import PodRef
from controller.io.kube_client import WatchEvent
from tests.unit.controller.loop_pods import pod, shadow
from tests.unit.controller.test_loop import ROWS, SHARER, _lendable_owner, _spot, make_loop

NODE_PODS = [shadow("s", node="n1", phase="Running"), pod("web", node="n1", phase="Running", limits=SHARER)]
NODE_ROWS = [
    ("gpushare-system", "s", "main", "example.com/gpu", ["g0"]),
    ("default", "web", "main", "gpushare/share-gpu-4", ["gpushare-system/s-0"]),
]
# Asks more than the shadow on n1 has free: the leader creates one.
PENDING = pod("pending", limits={"gpushare/share-gpu-4": "4"})


def _boom(*_: Any, **__: Any) -> Any:
    raise ZeroDivisionError("a bug in one part")


def test_a_failing_cluster_plan_costs_no_node_action(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("controller.loop.plan_cluster", _boom)
    loop, client, plugins = make_loop([*NODE_PODS, PENDING], NODE_ROWS)
    report = loop.tick()
    assert dict(plugins.set)["gpushare/share-gpu-4"] == tuple(f"gpushare-system/s-{i}" for i in range(4))
    assert ("annotate", "default/web", ("gpushare.k8s.io/shadow-owner",)) in client.calls
    assert not [c for c in client.calls if c[0] == "create"]
    assert "cluster failed: ZeroDivisionError" in report.error and report.passes == 1


def test_a_failing_node_plan_costs_no_cluster_action(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("controller.node_pass.plan_node_shares", _boom)
    loop, client, plugins = make_loop([*NODE_PODS, PENDING], NODE_ROWS)
    report = loop.tick()
    assert [c[0] for c in client.calls if c[0] == "create"] == ["create"]
    assert plugins.set == [] and "shares failed: ZeroDivisionError" in report.error


def test_a_failing_spot_plan_closes_every_spot_device_and_keeps_the_share_lists(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("controller.node_pass.plan_spot", _boom)
    order: list[Any] = []
    loop, _, plugins = make_loop(
        [_lendable_owner(), *NODE_PODS], [*ROWS, *NODE_ROWS[1:]], spot=_spot(order, idle_since=0)
    )
    health: list[tuple[str, bool]] = []
    plugins.real_devices = lambda: {"example.com/gpu": ("g0", "g1")}  # type: ignore[method-assign]
    plugins.set_spot_health = lambda rid, ok: health.append((rid, ok))  # type: ignore[method-assign]
    report = loop.tick()
    assert health == [("g0", False), ("g1", False)]
    assert "gpushare/share-gpu-4" in dict(plugins.set) and "spot failed" in report.error
    assert not [o for o in order if o[0] == "arm"]  # no plan, no return table handed on


def test_an_unreadable_pod_gets_a_warning_and_a_count_and_the_rest_goes_on() -> None:
    bad = pod("bad", node="n1", phase="Running", limits={"gpushare/share-gpu-4": "\u0661"})  # Arabic-Indic one
    loop, client, plugins = make_loop([bad, *NODE_PODS], NODE_ROWS)
    report = loop.tick()
    assert ("event", "default/bad", "GpushareInvalidPod") in client.calls
    assert report.pod_input_errors_total == {"resources": 1}
    assert any("default/bad" in p for p in report.problems)
    assert dict(plugins.set)["gpushare/share-gpu-4"]  # the well-formed pods were planned as ever
    loop.tick()
    assert client.calls.count(("event", "default/bad", "GpushareInvalidPod")) == 1
    assert loop.last_report().pod_input_errors_total == {"resources": 1}  # counted once, not per pass


def test_the_holding_binding_outlives_the_tenants_record(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pass 1 binds web's slots to shadow s (uid-s). The tenant then removes its record and a namesake
    takes the name: the binding, kept by the agent, still says web's GPU is gone."""
    loop, client, _ = make_loop(NODE_PODS, NODE_ROWS)
    loop.tick()
    assert loop._load("sharer-shadow") == {"uid-web gpushare-system/s uid-s": 1000.0}
    namesake = shadow("s", node="n1", phase="Running", rv="2")
    namesake["metadata"]["uid"] = "uid-namesake"
    loop._node.apply(WatchEvent("MODIFIED", namesake))
    loop.tick()
    assert ("delete", "default/web") in client.calls and ("event", "default/web", "ShadowGone") in client.calls


def test_an_action_that_raises_anything_costs_only_itself() -> None:
    loop, client, plugins = make_loop(NODE_PODS, NODE_ROWS)

    def broken_set_devices(resource: str, devices: Any) -> None:
        raise KeyError(resource)

    plugins.set_devices = broken_set_devices  # type: ignore[method-assign]
    ref = PodRef("default", "web", "uid-web")
    loop._applier.apply(SetDevices("gpushare/share-gpu-4", ("x",)), 1.0)
    loop._applier.apply(RecordEvent(ref, "Why", "because", "Warning"), 1.0)
    assert ("event", "default/web", "Why") in client.calls


def test_a_pass_writes_a_bounded_number_of_new_events_and_the_rest_later() -> None:
    loop, client, _ = make_loop([], [])
    events = [RecordEvent(PodRef("t", f"p{i}", f"u{i}"), "R", "m", "Warning") for i in range(EVENTS_PER_PASS + 5)]
    for e in events:
        loop._applier.apply(e, 1.0)
    assert len(client.calls) == EVENTS_PER_PASS
    for e in events:  # the next pass asks for all of them again
        loop._applier.apply(e, 2.0)
    assert len(client.calls) == EVENTS_PER_PASS + 5
