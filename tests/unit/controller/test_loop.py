"""One reconcile pass with in-memory peers: what the loop applies, in which order, and what it refuses to do."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

from controller.core.detectors import IdleVerdict
from controller.core.pod_facts import PodRef
from controller.errors import ApiUnavailable
from controller.io.kube_client import WatchEvent
from controller.loop import ReconcileLoop
from controller.spot.hooks import SpotHooks
from controller.spot.solver import KmodView, ReturnTarget
from gpushare import keys
from gpushare.config import load_config
from gpushare.errors import GpushareError
from tests.unit.controller.loop_pods import pod, shadow

CFG = load_config(text="version: v1\nnodeName: n1\nrealResources: [example.com/gpu]\nshareSpecs: [4]\n")


def stored(manifest: Any) -> dict[str, Any]:
    """A created pod as the API server answers: the manifest with a uid and a resourceVersion."""
    meta = {**manifest["metadata"], "uid": f"uid-{manifest['metadata']['name']}", "resourceVersion": "1"}
    return {**manifest, "metadata": meta}


class FakeClient:
    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods
        self.calls: list[tuple[Any, ...]] = []

    def list_pods(self, **sel: Any) -> tuple[list[dict[str, Any]], str]:
        field = sel.get("field_selector") or ""
        out = self.pods
        if field.startswith("spec.nodeName=n1"):
            out = [p for p in out if p["spec"]["nodeName"] == "n1"]
        elif field.startswith("spec.nodeName=,"):
            out = [p for p in out if not p["spec"]["nodeName"]]
        if sel.get("namespace"):
            out = [p for p in out if p["metadata"]["namespace"] == sel["namespace"]]
        return list(out), "1"

    def lower_node_allocatable(self, node: str, resource: str, count: int) -> bool:
        self.calls.append(("lower", node, resource, count))
        return True

    def create_pod(self, manifest: Any) -> dict[str, Any] | None:
        self.calls.append(("create", manifest["metadata"]["name"]))
        return stored(manifest)

    def delete_pod(self, ref: PodRef, **_: Any) -> bool:
        self.calls.append(("delete", ref.key))
        return True

    def patch_pod_annotations(self, ref: PodRef, ann: Any) -> bool:
        self.calls.append(("annotate", ref.key, tuple(ann)))
        return True

    def record_event(self, ref: PodRef, reason: str, message: str, **_: Any) -> None:
        self.calls.append(("event", ref.key, reason))

    def record_node_event(self, node: str, reason: str, message: str, **_: Any) -> None:
        self.calls.append(("node-event", node, reason))

    def namespaces_with_label(self, _sel: str) -> list[str]:
        return []


class FakePlugins:
    def __init__(self) -> None:
        self.set: list[tuple[str, tuple[str, ...]]] = []

    def set_devices(self, resource: str, devices: Any) -> None:
        self.set.append((resource, tuple(d.id for d in devices)))

    def set_spot_health(self, real_id: str, healthy: bool) -> None: ...
    def set_spot_lent(self, real_ids: Any) -> None: ...

    def real_devices(self) -> dict[str, tuple[str, ...]]:
        return {}

    def vendor_unhealthy(self) -> dict[str, str]:
        return {}

    def set_real_devices(self, real_resource: str, devices: Any) -> None:
        return None

    def status(self) -> dict[str, dict[str, Any]]:
        return {r: {"devices": len(ids), "healthy": len(ids), "registered": True} for r, ids in self.set}


class FakePodResources:
    def __init__(self, rows: list[tuple[str, str, str, str, list[str]]], fail: bool = False) -> None:
        self.rows, self.fail = rows, fail

    def allocatable(self) -> dict[str, tuple[str, ...]]:
        if self.fail:
            raise GpushareError("gpushare: kubelet pod-resources GetAllocatableResources failed (UNAVAILABLE)")
        return {r: tuple(ids) for _, _, _, r, ids in self.rows if "/" in r and not r.startswith("gpushare/")}

    def list(self) -> list[Any]:
        if self.fail:
            raise GpushareError("gpushare: kubelet pod-resources List failed (UNAVAILABLE)")
        dev = SimpleNamespace
        return [
            dev(namespace=ns, name=name, containers=[dev(name=c, devices=[dev(resource_name=r, device_ids=ids)])])
            for ns, name, c, r, ids in self.rows
        ]


class NotLeader:
    duration_s = 15

    def is_leader(self) -> bool:
        return False


def make_loop(
    pods: list[dict[str, Any]],
    rows: list[Any] | None = None,
    *,
    leader: bool = True,
    pr_fail: bool = False,
    spot: SpotHooks | None = None,
    listed: bool = True,
) -> tuple[ReconcileLoop, FakeClient, FakePlugins]:
    client, plugins = FakeClient(pods), FakePlugins()
    loop = ReconcileLoop(
        CFG,
        client=client,  # type: ignore[arg-type]
        plugins=plugins,
        podresources=FakePodResources(rows or [], fail=pr_fail),
        elector=None if leader else NotLeader(),  # type: ignore[arg-type]
        spot=spot,
        clock=lambda: 1000.0,
    )
    # What start() would do, without threads: one LIST per cache.
    if listed:
        for cache in (loop._node, loop._pending, loop._shadows):
            cache.relist()
    loop._cluster_started = True
    return loop, client, plugins


SHARER = {"gpushare/share-gpu-4": "1"}


def test_a_pending_sharer_gets_a_shadow_only_from_the_leader() -> None:
    loop, client, _ = make_loop([pod("web", limits=SHARER)])
    report = loop.tick()
    assert [c for c in client.calls if c[0] == "create"] == [("create", "shadow-share-4-eec9fd00-0")]
    assert report.is_leader and [(d.pending, d.create) for d in report.demand] == [(1, 1)]

    loop, client, _ = make_loop([pod("web", limits=SHARER)], leader=False)
    assert not loop.tick().is_leader
    assert not [c for c in client.calls if c[0] == "create"]


def test_devices_are_pushed_once_and_records_written() -> None:
    pods = [
        shadow("s", node="n1", phase="Running"),
        pod("web", node="n1", phase="Running", limits=SHARER),
    ]
    rows = [
        ("gpushare-system", "s", "main", "example.com/gpu", ["g0"]),
        ("default", "web", "main", "gpushare/share-gpu-4", ["gpushare-system/s-0"]),
    ]
    loop, client, plugins = make_loop(pods, rows)
    report = loop.tick()
    pushed = dict(plugins.set)
    assert pushed["gpushare/share-gpu-4"] == tuple(f"gpushare-system/s-{i}" for i in range(4))
    assert all(ids == () for r, ids in pushed.items() if r != "gpushare/share-gpu-4")  # every served list, once
    assert ("annotate", "gpushare-system/s", ("gpushare.k8s.io/shadow-users",)) in client.calls
    assert ("annotate", "default/web", ("gpushare.k8s.io/shadow-owner",)) in client.calls
    assert [(s.pod, s.gpu, s.users) for s in report.shadows] == [("gpushare-system/s", ("g0",), ("default/web/main",))]
    before = len(plugins.set)
    loop.tick()
    assert len(plugins.set) == before  # level-triggered, applied idempotently


def test_a_deleted_shadow_evicts_its_sharer_with_an_event() -> None:
    pods = [shadow("s", node="n1", phase="Running"), pod("web", node="n1", phase="Running", limits=SHARER)]
    rows = [("default", "web", "main", "gpushare/share-gpu-4", ["gpushare-system/s-0"])]
    loop, client, _ = make_loop(pods, rows)
    loop.tick()
    loop._node.apply(WatchEvent("DELETED", pods[0]))
    report = loop.tick()
    assert ("delete", "default/web") in client.calls and ("event", "default/web", "ShadowGone") in client.calls
    assert client.calls.index(("delete", "default/web")) < client.calls.index(("event", "default/web", "ShadowGone"))
    assert report.evictions_total == {"ShadowGone": 1} and report.evictions[0].pod == "default/web"


def test_without_pod_resources_nothing_on_the_node_is_touched() -> None:
    pods = [shadow("s", node="n1", phase="Running"), pod("web", node="n1", phase="Running", limits=SHARER)]
    loop, client, plugins = make_loop(pods, pr_fail=True)
    loop._node.apply(WatchEvent("DELETED", pods[0]))
    report = loop.tick()
    assert not report.pod_resources_ok and "pod-resources" in report.error
    assert plugins.set == [] and not [c for c in client.calls if c[0] in ("delete", "annotate")]


def test_a_failing_action_does_not_stop_the_pass() -> None:
    loop, client, _ = make_loop([pod("a", limits=SHARER), pod("b", limits={"gpushare/share-gpu-7": "1"})])

    def refuse(_manifest: Any) -> bool:
        raise ApiUnavailable("gpushare: the API server did not answer")

    client.create_pod = refuse  # type: ignore[method-assign,assignment]
    loop.tick()
    # The create failed; the Warning for the unserved spec still went out.
    assert ("event", "default/b", "UnknownShareSpec") in client.calls


def test_no_pass_before_the_first_pod_list() -> None:
    loop, client, plugins = make_loop([pod("web", limits=SHARER)], listed=False)
    report = loop.tick()
    assert report.error == "waiting for the first pod LIST" and report.passes == 0 and not report.synced
    assert client.calls == [] and plugins.set == []


def test_the_report_counts_passes_and_what_kubelet_allocated() -> None:
    pods = [pod("web", node="n1", phase="Running", limits=SHARER)]
    rows = [("default", "web", "main", "gpushare/share-gpu-4", ["gpushare-system/s-0", "gpushare-system/s-1"])]
    loop, _, _ = make_loop(pods, rows)
    loop.tick()
    report = loop.tick()
    assert report.passes == 2 and report.at == 1000.0 and report.synced and report.pod_resources_ok
    assert report.allocated == {"gpushare/share-gpu-4": 2}
    assert loop.last_report() is report


def test_spot_is_asked_once_per_pass_in_order_with_the_pass_clock() -> None:
    asked: list[Any] = []

    def verdicts(now: float) -> dict[str, Any]:
        asked.append(("verdicts", now))
        return {}

    def notices() -> list[int]:
        asked.append("notices")
        return []

    def kmod_view() -> KmodView:
        asked.append("kmod_view")
        return KmodView(False)

    spot = SpotHooks(verdicts=verdicts, notices=notices, kmod_view=kmod_view, kmod=asked.append, killer=asked.append)
    loop, _, _ = make_loop([pod("web", limits=SHARER)], spot=spot)
    loop.tick()
    assert asked == [("verdicts", 1000.0), "notices", "kmod_view"]
    # Without PodResources the node is not planned, spot included.
    loop._podres = FakePodResources([], fail=True)
    loop.tick()
    assert asked == [("verdicts", 1000.0), "notices", "kmod_view"]


def _lendable_owner() -> dict[str, Any]:
    owner = pod(
        "owner",
        ns="team",
        node="n1",
        phase="Running",
        limits={"example.com/gpu": "1"},
        labels={"gpushare.k8s.io/lendable": "true"},
    )
    owner["status"]["containerStatuses"] = [
        {"name": "main", "containerID": "containerd://c-owner", "state": {"running": {}}}
    ]
    return owner


def _spot(order: list[Any], *, idle_since: float, blocked: str = "") -> SpotHooks:
    return SpotHooks(
        verdicts=lambda now: {"g0": IdleVerdict("g0", "idle", idle_since)},
        notices=lambda: [],
        kmod_view=lambda: KmodView(True),
        kmod=lambda cmd: order.append(("kmod", cmd.op)),
        killer=order.append,
        pidns_of=lambda cid: 77 if cid == "c-owner" else None,
        arm=lambda table: order.append(("arm", dict(table))),
        blocked=lambda: blocked,
    )


ROWS = [("team", "owner", "main", "example.com/gpu", ["g0"])]


def test_spot_gets_the_return_table_before_any_action_of_the_pass() -> None:
    order: list[Any] = []
    loop, _, _ = make_loop([_lendable_owner()], ROWS, spot=_spot(order, idle_since=0.0))
    loop.tick()
    assert order[0] == ("arm", {77: ReturnTarget(77, "team/owner/main", ("g0",), None)})
    assert order[1:] == [("kmod", "add"), ("kmod", "detect")]  # the owner is away: watched, then lent
    assert loop.last_report().spot[0].state == "away"


def test_a_node_without_pod_cgroups_lends_nothing_and_says_so_on_the_node() -> None:
    order: list[Any] = []
    why = "no kubepods cgroup under /empty (cgroup v2)"
    loop, client, _ = make_loop([_lendable_owner()], ROWS, spot=_spot(order, idle_since=0.0, blocked=why))
    report = loop.tick()
    assert order[0] == ("arm", {}) and ("kmod", "detect") not in order
    assert report.spot[0].state == "busy" and why in report.spot[0].reason
    assert ("node-event", "n1", "SpotLendingBlocked") in client.calls


def test_the_loop_waits_for_an_idle_window_to_end_not_for_the_period() -> None:
    loop, _, _ = make_loop([_lendable_owner()], ROWS, spot=_spot([], idle_since=1000.0 - 600.0 + 30.0))
    loop.period_s = 300.0
    assert loop.wait_s() == 300.0
    assert loop.tick().spot[0].state == "busy"
    assert loop.wait_s() == 30.0  # the clock stands at 1000: the window ends at 1030
    loop._podres = FakePodResources([], fail=True)
    loop.tick()
    assert loop.wait_s() == 300.0  # a pass that planned nothing leaves no deadline behind


@contextlib.contextmanager
def running_passes(loop: ReconcileLoop, tick: Callable[[], Any]) -> Iterator[threading.Event]:
    """The loop's own pass thread with ``tick`` for a pass, woken once; stopped and joined after."""
    loop.tick = tick  # type: ignore[method-assign]
    loop._wake.clear()  # the first LIST already asked for a pass
    stop = threading.Event()
    thread = threading.Thread(target=loop._run_passes, args=(stop,))
    thread.start()
    try:
        loop.wake()
        yield stop
    finally:
        stop.set()
        loop.wake()
        thread.join(5)
    assert not thread.is_alive()


def wait_for(done: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done() and time.monotonic() < deadline:
        time.sleep(0.005)


def test_events_during_a_pass_ask_for_exactly_one_more_and_nothing_sleeps_in_between() -> None:
    loop, _, _ = make_loop([])
    loop.period_s = 60.0
    passes: list[float] = []

    def tick() -> Any:
        passes.append(time.monotonic())
        if len(passes) == 1:
            for _ in range(3):  # a burst of watch events while the pass runs
                loop.wake()
        return loop.last_report()

    with running_passes(loop, tick):
        wait_for(lambda: len(passes) >= 2)
        time.sleep(0.3)
        assert len(passes) == 2  # the burst cost one pass; then the loop waits for the next event


def test_a_withdrawal_waits_for_a_sharer_only_a_fresh_list_shows_and_the_node_watch_holds_the_count() -> None:
    # Published 40 s ago: past the time kubelet's write-backs govern a withdrawal (test_node_pass
    # has those), so only the fresh LIST decides here.
    marks = {keys.ANNOTATION_SHADOW_DRAINING: "900.000", keys.ANNOTATION_SHADOW_DRAINED: "900.000 published 960.000"}
    settled = shadow("s", node="n1", phase="Running", annotations=marks)
    loop, client, plugins = make_loop([settled], leader=False)
    # Bound after the watch's copy was taken: only a LIST made now shows it.
    client.pods.append(pod("late", node="n1", limits=SHARER))
    loop.tick()
    share_lists = [ids for r, ids in plugins.set if r == "gpushare/share-gpu-4"]
    assert len(share_lists[-1]) == 4  # still listed: the late sharer is admitted on them
    assert not [c for c in client.calls if c[0] == "annotate"]  # no answer: the leader may not delete yet
    assert loop._node_status.held() == {"gpushare/share-gpu-4": 0}  # what the watch keeps lowered meanwhile

    client.pods.pop()  # the late sharer is gone: nobody waits any more
    loop.tick()
    assert [ids for r, ids in plugins.set if r == "gpushare/share-gpu-4"][-1] == ()
    assert ("annotate", "gpushare-system/s", (keys.ANNOTATION_SHADOW_DRAINED,)) in client.calls
