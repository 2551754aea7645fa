"""The applier: actions in order, written once, Events de-duplicated, evictions recorded."""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import Any

import pytest

from controller.applier import EVENT_REPEAT_S, EVENTS_REMEMBERED, EVICTIONS_KEPT, WRITES_IN_FLIGHT, Applier
from controller.core.actions import (
    AnnotatePod,
    CreateShadow,
    DeleteShadow,
    Evict,
    KillPods,
    KmodCommand,
    PodToKill,
    PublishCapacity,
    RecordEvent,
    RecordNodeEvent,
    SetDevices,
    SetSpotHealth,
)
from controller.core.model import Pool, ShareKey
from controller.core.pod_facts import PodRef
from controller.errors import ApiUnavailable
from controller.io.state import StateStore
from controller.spot.hooks import SpotHooks
from controller.spot.solver import KmodView
from gpushare import keys

WEB = PodRef("default", "web", "uid-web")
KEY = ShareKey(Pool("example.com/gpu"), "share", 4)


def stored(manifest: Any) -> dict[str, Any]:
    """A created pod as the API server answers: the manifest with a uid and a resourceVersion."""
    meta = {**manifest["metadata"], "uid": f"uid-{manifest['metadata']['name']}", "resourceVersion": "1"}
    return {**manifest, "metadata": meta}


class Peers:
    """The API client and the device plugins, recording every call in one list (to check order)."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.gone: set[str] = set()  # pods whose delete finds nothing

    def create_pod(self, manifest: Any) -> dict[str, Any] | None:
        self.calls.append(("create", manifest["metadata"]["name"]))
        return stored(manifest)

    def delete_pod(self, ref: PodRef) -> bool:
        self.calls.append(("delete", ref.key))
        return ref.key not in self.gone

    def patch_pod_annotations(self, ref: PodRef, annotations: Any) -> bool:
        self.calls.append(("annotate", ref.key, dict(annotations)))
        return True

    def record_event(self, ref: PodRef, reason: str, message: str, *, type_: str = "Normal") -> None:
        self.calls.append(("event", ref.key, reason, type_))

    def record_node_event(self, node: str, reason: str, message: str, *, type_: str = "Normal") -> None:
        self.calls.append(("node-event", node, reason, type_))

    def lower_node_allocatable(self, node: str, resource: str, count: int) -> bool:
        self.calls.append(("lower", node, resource, count))
        return True

    def set_devices(self, resource: str, devices: Any) -> None:
        self.calls.append(("devices", resource, tuple(d.id for d in devices)))

    def set_spot_health(self, real_id: str, healthy: bool) -> None:
        self.calls.append(("health", real_id, healthy))

    def set_spot_lent(self, real_ids: Any) -> None: ...
    def real_devices(self) -> dict[str, tuple[str, ...]]:
        return {}

    def vendor_unhealthy(self) -> dict[str, str]:
        return {}

    def set_real_devices(self, real_resource: str, devices: Any) -> None:
        return None

    def status(self) -> dict[str, dict[str, Any]]:
        return {}


def applier(peers: Peers, *, leader: bool = True, spot: SpotHooks | None = None, store: Any = None) -> Applier:
    return Applier(
        client=peers,
        plugins=peers,
        spot=spot,
        is_leader=lambda: leader,
        store=lambda: store,
        node_name="n1",
        capacity=lambda resource, count: peers.lower_node_allocatable("n1", resource, count),
    )


def test_a_device_list_or_health_already_pushed_is_not_pushed_again() -> None:
    peers = Peers()
    a = applier(peers)
    for _ in range(2):
        a.apply(SetDevices("gpushare/share-gpu-4", ("s-0", "s-1")), now=1.0)
        a.apply(SetSpotHealth("g0", False, "lent"), now=1.0)
    a.apply(SetDevices("gpushare/share-gpu-4", ("s-0",)), now=2.0)
    a.apply(SetSpotHealth("g0", True, "idle"), now=2.0)
    assert peers.calls == [
        ("devices", "gpushare/share-gpu-4", ("s-0", "s-1")),
        ("health", "g0", False),
        ("devices", "gpushare/share-gpu-4", ("s-0",)),
        # A shorter list is published on the node at once, not at kubelet's next status.
        ("lower", "n1", "gpushare/share-gpu-4", 1),
        ("health", "g0", True),
    ]


def test_shadows_are_created_marked_for_removal_and_deleted_only_by_the_leader() -> None:
    create = CreateShadow(KEY, "shadow-x", {"metadata": {"name": "shadow-x"}})
    mark = AnnotatePod(PodRef("gpushare-system", "shadow-y", "u"), keys.ANNOTATION_SHADOW_DRAINING, "1.000")
    delete = DeleteShadow(PodRef("gpushare-system", "shadow-y", "u"))
    follower, leader = Peers(), Peers()
    for action in (create, mark, delete):
        applier(follower, leader=False).apply(action, now=1.0)
        applier(leader).apply(action, now=1.0)
    assert follower.calls == []
    assert leader.calls == [
        ("create", "shadow-x"),
        ("annotate", "gpushare-system/shadow-y", {keys.ANNOTATION_SHADOW_DRAINING: "1.000"}),
        ("delete", "gpushare-system/shadow-y"),
    ]


class SlowCreates(Peers):
    """Each create blocks until ``WRITES_IN_FLIGHT`` creates are in flight at once (or a timeout)."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self.in_flight = 0
        self.most_in_flight = 0
        self._full = threading.Barrier(WRITES_IN_FLIGHT)

    def create_pod(self, manifest: Any) -> dict[str, Any] | None:
        with self._lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        with contextlib.suppress(threading.BrokenBarrierError):  # a partial last batch: none will join it
            self._full.wait(timeout=5.0)
        with self._lock:
            self.in_flight -= 1
            self.calls.append(("create", manifest["metadata"]["name"]))
        return stored(manifest)


def test_a_run_of_shadow_creations_goes_out_concurrently_and_the_rest_keep_their_order() -> None:
    peers = SlowCreates()
    creates = [CreateShadow(KEY, f"s-{i}", {"metadata": {"name": f"s-{i}"}}) for i in range(WRITES_IN_FLIGHT * 2)]
    before = SetDevices("gpushare/share-gpu-4", ("a",))
    after = RecordEvent(WEB, "Waiting", "no shadow yet")
    applier(peers).apply_all([before, *creates, after], now=1.0)
    assert peers.most_in_flight == WRITES_IN_FLIGHT  # one after another, this would be 1
    assert peers.calls[0] == ("devices", "gpushare/share-gpu-4", ("a",))
    assert sorted(c[1] for c in peers.calls[1:-1]) == sorted(f"s-{i}" for i in range(WRITES_IN_FLIGHT * 2))
    assert peers.calls[-1] == ("event", WEB.key, "Waiting", "Normal")  # only after every create returned


def test_a_failing_create_in_a_concurrent_run_costs_no_other_action() -> None:
    class OneFails(Peers):
        def create_pod(self, manifest: Any) -> dict[str, Any] | None:
            if manifest["metadata"]["name"] == "s-1":
                raise ApiUnavailable("the API server did not answer")
            return super().create_pod(manifest)

    peers = OneFails()
    creates = [CreateShadow(KEY, f"s-{i}", {"metadata": {"name": f"s-{i}"}}) for i in range(3)]
    deletes = [DeleteShadow(PodRef("gpushare-system", f"old-{i}", "u")) for i in range(2)]
    applier(peers).apply_all([*creates, *deletes], now=1.0)
    assert sorted(peers.calls[:2]) == [("create", "s-0"), ("create", "s-2")]
    assert sorted(peers.calls[2:]) == [("delete", "gpushare-system/old-0"), ("delete", "gpushare-system/old-1")]


def test_a_follower_sends_none_of_a_concurrent_run() -> None:
    peers = Peers()
    creates = [CreateShadow(KEY, f"s-{i}", {"metadata": {"name": f"s-{i}"}}) for i in range(4)]
    applier(peers, leader=False).apply_all(creates, now=1.0)
    assert peers.calls == []


def test_a_publish_lowers_the_node_count_through_the_capacity_callable() -> None:
    peers = Peers()
    applier(peers).apply(PublishCapacity("gpushare/share-gpu-4", 4), now=1.0)
    assert peers.calls == [("lower", "n1", "gpushare/share-gpu-4", 4)]
    # Nothing wired in to write with (no Node watch): no write at all, and no GET in its place.
    bare = Applier(client=peers, plugins=peers, spot=None, is_leader=lambda: True, node_name="n1")
    bare.apply(PublishCapacity("gpushare/share-gpu-4", 2), now=2.0)
    bare.apply(SetDevices("gpushare/share-gpu-4", ("s-0", "s-1")), now=2.0)
    bare.apply(SetDevices("gpushare/share-gpu-4", ("s-0",)), now=3.0)
    assert [c for c in peers.calls if c[0] == "lower"] == [("lower", "n1", "gpushare/share-gpu-4", 4)]


def test_every_share_list_tells_the_catch_up_its_healthy_count_before_a_lower_goes_out() -> None:
    peers = Peers()
    offered: list[tuple[str, int]] = []

    def lower(resource: str, count: int) -> bool:
        offered.append(("lower", count))
        return True

    a = Applier(
        client=peers,
        plugins=peers,
        spot=None,
        is_leader=lambda: True,
        node_name="n1",
        capacity=lower,
        offered=lambda resource, healthy: offered.append((resource, healthy)),
    )
    a.apply(SetDevices("gpushare/share-gpu-4", ("s-0", "s-1", "s-2"), ("s-2",)), now=1.0)
    a.apply(SetDevices("gpushare/share-gpu-4", ("s-0", "s-1", "s-2"), ("s-2",)), now=2.0)  # unchanged: not told
    a.apply(SetDevices("gpushare/share-gpu-4", ("s-0",)), now=3.0)
    # The catch-up learns of the shorter list before the lower count is written.
    assert offered == [("gpushare/share-gpu-4", 2), ("gpushare/share-gpu-4", 1), ("lower", 1)]


def test_the_same_event_is_written_again_only_after_the_repeat_interval() -> None:
    peers = Peers()
    a = applier(peers)
    event = RecordEvent(WEB, "UnknownShareSpec", "no such spec", "Warning")
    a.apply(event, now=100.0)
    a.apply(event, now=100.0 + EVENT_REPEAT_S - 1)
    a.apply(RecordEvent(WEB, "UnknownShareSpec", "another message", "Warning"), now=101.0)
    a.apply(event, now=100.0 + EVENT_REPEAT_S)
    assert peers.calls == [("event", "default/web", "UnknownShareSpec", "Warning")] * 3


def test_remembered_events_are_bounded() -> None:
    a = applier(Peers())
    for i in range(EVENTS_REMEMBERED + 1):
        a.apply(RecordEvent(PodRef("default", f"p{i}", f"u{i}"), "R", "m"), now=float(i))
    assert len(a._events_written) <= EVENTS_REMEMBERED
    assert ("u0", "R", "m") not in a._events_written  # the oldest went first


def test_an_eviction_deletes_then_warns_and_is_recorded(tmp_path: Path) -> None:
    peers = Peers()
    store = StateStore(str(tmp_path))
    try:
        a = applier(peers, store=store)
        a.apply(Evict(WEB, "ShadowGone", "its shadow is gone"), now=5.0)
        assert peers.calls == [("delete", "default/web"), ("event", "default/web", "ShadowGone", "Warning")]
        assert [(e.at, e.pod, e.reason) for e in a.evictions()] == [(5.0, "default/web", "ShadowGone")]
        assert a.evictions_total() == {"ShadowGone": 1}
        assert store.counters() == {("evictions", "ShadowGone"): 1}
    finally:
        store.close()


def test_a_pod_already_gone_is_not_counted_as_evicted() -> None:
    peers = Peers()
    peers.gone.add("default/web")
    a = applier(peers)
    a.apply(Evict(WEB, "ShadowGone", "m"), now=1.0)
    assert peers.calls == [("delete", "default/web")]
    assert a.evictions() == () and a.evictions_total() == {}


def test_the_eviction_log_keeps_the_latest() -> None:
    a = applier(Peers())
    for i in range(EVICTIONS_KEPT + 5):
        a.apply(Evict(PodRef("spot", f"job{i}", f"u{i}"), "OwnerBack", "m"), now=float(i))
    assert len(a.evictions()) == EVICTIONS_KEPT and a.evictions()[-1].pod == f"spot/job{EVICTIONS_KEPT + 4}"
    assert a.evictions_total() == {"OwnerBack": EVICTIONS_KEPT + 5}


def test_kills_and_kmod_commands_go_to_spot_and_are_dropped_without_it(caplog: pytest.LogCaptureFixture) -> None:
    kill = KillPods((PodToKill(PodRef("spot", "job", "u"), 1),), "OwnerBack")
    release = KmodCommand("release", 4242)
    done: list[Any] = []
    spot = SpotHooks(
        verdicts=lambda _now: {},
        notices=lambda: [],
        kmod_view=lambda: KmodView(True),
        kmod=done.append,
        killer=done.append,
    )
    applier(Peers(), spot=spot).apply(kill, now=1.0)
    applier(Peers(), spot=spot).apply(release, now=1.0)
    assert done == [kill, release]
    with caplog.at_level("WARNING"):
        applier(Peers()).apply(kill, now=1.0)
        applier(Peers()).apply(release, now=1.0)
    assert "no killer wired in" in caplog.text


def test_a_failing_action_is_logged_and_the_next_one_still_applies(caplog: pytest.LogCaptureFixture) -> None:
    peers = Peers()

    def refuse(_ref: PodRef, _annotations: Any) -> bool:
        raise ApiUnavailable("gpushare: the API server did not answer")

    peers.patch_pod_annotations = refuse  # type: ignore[method-assign]
    a = applier(peers)
    with caplog.at_level("WARNING"):
        a.apply(AnnotatePod(WEB, "gpushare.k8s.io/shadow-owner", "{}"), now=1.0)
        a.apply(RecordEvent(WEB, "R", "m"), now=1.0)
    assert "action failed; retried next pass" in caplog.text
    assert peers.calls == [("event", "default/web", "R", "Normal")]


def test_a_node_event_is_written_on_the_agents_node_once_per_repeat_interval() -> None:
    peers = Peers()
    a = applier(peers)
    event = RecordNodeEvent("SpotLendingBlocked", "gpushare: spot lends no GPU on this node: no kubepods cgroup")
    a.apply(event, now=1.0)
    a.apply(event, now=2.0)
    a.apply(event, now=1.0 + EVENT_REPEAT_S)
    assert peers.calls == [("node-event", "n1", "SpotLendingBlocked", "Warning")] * 2


def test_a_created_shadow_is_handed_on_as_stored_and_an_existing_one_is_not() -> None:
    class Exists(Peers):
        def create_pod(self, manifest: Any) -> dict[str, Any] | None:
            super().create_pod(manifest)
            return None if manifest["metadata"]["name"] == "s-1" else stored(manifest)

    peers = Exists()
    handed: list[Any] = []
    a = Applier(client=peers, plugins=peers, spot=None, is_leader=lambda: True, created=handed.append)
    a.apply_all([CreateShadow(KEY, f"s-{i}", {"metadata": {"name": f"s-{i}"}}) for i in range(2)], now=1.0)
    assert sorted(c[1] for c in peers.calls) == ["s-0", "s-1"]  # a run of creates goes out concurrently
    assert [(p["metadata"]["name"], p["metadata"]["uid"]) for p in handed] == [("s-0", "uid-s-0")]


def test_unhealthy_slots_are_advertised_unhealthy_and_a_health_change_alone_is_applied() -> None:
    class Recording(Peers):
        def set_devices(self, resource: str, devices: Any) -> None:
            self.calls.append(("devices", resource, tuple((d.id, d.healthy) for d in devices)))

    peers = Recording()
    a = applier(peers)
    a.apply(SetDevices("gpushare/share-gpu-2", ("s-0", "s-1")), now=1.0)
    a.apply(SetDevices("gpushare/share-gpu-2", ("s-0", "s-1"), unhealthy=("s-0", "s-1")), now=2.0)
    a.apply(SetDevices("gpushare/share-gpu-2", ("s-0", "s-1"), unhealthy=("s-0", "s-1")), now=3.0)
    assert peers.calls == [
        ("devices", "gpushare/share-gpu-2", (("s-0", True), ("s-1", True))),
        ("devices", "gpushare/share-gpu-2", (("s-0", False), ("s-1", False))),
    ]
