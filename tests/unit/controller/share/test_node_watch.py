"""The node's own Node, watched: a share count written back while a shadow drains is lowered again at once."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from controller.errors import ApiUnavailable, KubeError
from controller.io.kube_client import WatchEvent
from controller.share.node_watch import NodeWatch

R = "gpushare/share-gpu-4"
OTHER = "gpushare/share-gpu-2"


def node(name: str = "node-a", rv: str = "1", **counts: str) -> dict[str, Any]:
    """A Node whose capacity and allocatable show ``counts`` (keyword ``r`` for R, ``o`` for OTHER)."""
    status = {{"r": R, "o": OTHER}[k]: v for k, v in counts.items()} | {"cpu": "2"}
    return {"metadata": {"name": name, "resourceVersion": rv}, "status": {"capacity": status, "allocatable": status}}


class Api:
    def __init__(self, items: list[dict[str, Any]] | None = None, events: list[WatchEvent] | None = None) -> None:
        self.items, self.events = items or [], list(events or [])
        self.calls: list[tuple[Any, ...]] = []
        self.fail_patch: KubeError | None = None
        self.fail_list = 0

    def list_node(self, name: str) -> tuple[list[dict[str, Any]], str]:
        self.calls.append(("list", name))
        if self.fail_list:
            self.fail_list -= 1
            raise ApiUnavailable("gpushare: GET /api/v1/nodes answered 503 (etcd); retrying in 1s")
        return list(self.items), "10"

    def watch_node(self, name: str, rv: str, *, timeout_s: int | None = None) -> Iterator[WatchEvent]:
        self.calls.append(("watch", name, rv))
        yield from self.events

    def patch_node_status(self, name: str, status: Mapping[str, Any]) -> None:
        self.calls.append(("patch", name, dict(status)))
        if self.fail_patch is not None:
            raise self.fail_patch

    def patches(self) -> list[tuple[Any, ...]]:
        return [c for c in self.calls if c[0] == "patch"]


def lowered(**counts: int) -> tuple[str, str, dict[str, Any]]:
    fields = {{"r": R, "o": OTHER}[k]: str(v) for k, v in counts.items()}
    return ("patch", "node-a", {"capacity": fields, "allocatable": fields})


def watch(api: Api) -> NodeWatch:
    return NodeWatch(api, "node-a")  # type: ignore[arg-type]


def test_kubelet_writing_the_full_count_back_during_a_drain_is_lowered_with_one_patch() -> None:
    api = Api([node(r="4")])
    w = watch(api)
    w.relist()
    w.hold({R: 0})
    w.apply(WatchEvent("MODIFIED", node(rv="11", r="8")))  # kubelet's node status: the full count
    assert api.patches() == [lowered(r=0)]
    w.apply(WatchEvent("MODIFIED", node(rv="12", r="0")))  # our own patch coming back: nothing to do
    assert api.patches() == [lowered(r=0)]


def test_without_a_drain_nothing_is_written() -> None:
    api = Api([node(r="8")])
    w = watch(api)
    w.relist()
    w.apply(WatchEvent("MODIFIED", node(rv="11", r="8")))
    w.hold({R: 0})
    w.hold({})  # the drain is over: the count is kubelet's again
    w.apply(WatchEvent("MODIFIED", node(rv="12", r="8")))
    assert api.patches() == []


@pytest.mark.parametrize(
    ("shows", "held"),
    [
        ("2", 4),  # lower than held: a count is never raised
        ("4", 4),  # already there
    ],
)
def test_a_higher_count_is_never_written(shows: str, held: int) -> None:
    api = Api()
    w = watch(api)
    w.relist()
    w.hold({R: held})
    w.apply(WatchEvent("MODIFIED", node(r=shows)))
    assert api.patches() == []
    assert not w.lower(R, held)


def test_only_the_held_resources_that_show_more_are_patched_in_one_write() -> None:
    api = Api()
    w = watch(api)
    w.relist()
    w.hold({R: 4, OTHER: 3})
    w.apply(WatchEvent("ADDED", node(r="8", o="2")))
    assert api.patches() == [lowered(r=4)]


def test_the_list_shows_a_count_written_back_before_the_watch_started() -> None:
    api = Api([node(r="8")])
    w = watch(api)
    w.hold({R: 4})
    w.relist()
    assert api.patches() == [lowered(r=4)]


def test_lower_reads_the_watched_node_not_a_get_and_writes_nothing_before_the_first_list() -> None:
    api = Api([node(r="8")])
    w = watch(api)
    assert not w.lower(R, 4)  # no Node seen yet: the held counts are written when the LIST shows it
    assert api.calls == []
    w.relist()
    assert w.lower(R, 4)
    assert api.calls == [("list", "node-a"), lowered(r=4)]


def test_another_nodes_object_or_a_deleted_node_writes_nothing(caplog: pytest.LogCaptureFixture) -> None:
    api = Api([node("node-b", r="8")])
    w = watch(api)
    w.hold({R: 0})
    w.relist()  # the field selector should have left node-b out: it is not ours
    assert not w.lower(R, 0)
    with caplog.at_level(logging.WARNING, logger="controller.share.node_watch"):
        w.apply(WatchEvent("MODIFIED", node("node-b", r="8")))
    assert "node watch sent another object; ignored" in caplog.text
    w.apply(WatchEvent("ADDED", node(r="0")))
    w.apply(WatchEvent("DELETED", node(r="8")))
    assert not w.lower(R, 0)
    assert api.patches() == []


@pytest.mark.parametrize(
    ("doc", "problem"),
    [
        ({"metadata": {"name": "node-a"}}, "the Node has no status"),
        ({"metadata": {"name": "node-a"}, "status": "odd"}, "the Node has no status"),
        (node(r="1k"), "is '1k', not a whole count"),
        (node(r="-3"), "is '-3', not a whole count"),
    ],
)
def test_an_odd_node_is_left_alone_with_one_log_line(
    doc: dict[str, Any], problem: str, caplog: pytest.LogCaptureFixture
) -> None:
    api = Api()
    w = watch(api)
    w.hold({R: 0})
    with caplog.at_level(logging.WARNING, logger="controller.share.node_watch"):
        for _ in range(3):  # a Node event every few seconds repeats none of the lines
            w.apply(WatchEvent("MODIFIED", doc))
    assert api.patches() == []
    lines = [r.kv["problem"] for r in caplog.records if "node status not readable" in r.getMessage()]  # type: ignore[attr-defined]
    assert len(lines) == len(set(lines)) >= 1 and all(problem in line for line in lines), lines


def test_a_refused_patch_is_logged_and_the_watch_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    api = Api()
    api.fail_patch = KubeError("gpushare: PATCH /api/v1/nodes/node-a/status was refused with 403: denied")
    w = watch(api)
    w.hold({R: 0})
    with caplog.at_level(logging.WARNING, logger="controller.share.node_watch"):
        w.apply(WatchEvent("MODIFIED", node(r="8")))  # does not raise into the watch loop
    assert "cannot lower the share count" in caplog.text
    api.fail_patch = None
    w.apply(WatchEvent("MODIFIED", node(rv="2", r="8")))
    assert api.patches()[-1] == lowered(r=0)


def test_the_thread_lists_then_watches_from_the_list_and_a_failed_list_is_retried() -> None:
    events = [WatchEvent("BOOKMARK", {"metadata": {"resourceVersion": "12"}}), WatchEvent("MODIFIED", node(r="8"))]
    api = Api([node(r="4")], events)
    api.fail_list = 1
    w = watch(api)
    w.hold({R: 2})
    stop = threading.Event()
    original = api.watch_node

    def watch_then_stop(name: str, rv: str, *, timeout_s: int | None = None) -> Iterator[WatchEvent]:
        yield from original(name, rv, timeout_s=timeout_s)
        stop.set()

    api.watch_node = watch_then_stop  # type: ignore[method-assign]
    thread = threading.Thread(target=w.run, args=(stop,))
    thread.start()
    thread.join(30)
    assert not thread.is_alive()
    assert [c[0] for c in api.calls] == ["list", "list", "patch", "watch", "patch"]
    assert ("watch", "node-a", "10") in api.calls


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_when_a_held_count_was_last_lowered_is_kept_even_if_the_patch_failed() -> None:
    api, clock = Api([node(r="0")]), Clock()
    w = NodeWatch(api, "node-a", clock=clock)  # type: ignore[arg-type]
    w.relist()
    w.hold({R: 0, OTHER: 0})
    assert w.lowered_at() == {}
    api.fail_patch = ApiUnavailable("gpushare: PATCH answered 503; retrying")
    w.apply(WatchEvent("MODIFIED", node(rv="11", r="8", o="0")))  # kubelet wrote R back up
    assert w.lowered_at() == {R: 100.0}
    api.fail_patch = None
    clock.now += 4.0
    w.apply(WatchEvent("MODIFIED", node(rv="12", r="8", o="0")))  # and again, 4 s later
    assert w.lowered_at() == {R: 104.0}
    clock.now += 1.0
    w.apply(WatchEvent("MODIFIED", node(rv="13", r="0", o="0")))  # our own patch echoed: nothing lowered
    assert w.lowered_at() == {R: 104.0}
    w.hold({OTHER: 0})  # R's drain is over: its count is kubelet's, nothing of it is held back
    assert w.lowered_at() == {}


def test_the_time_kept_is_when_the_lowering_returned_not_when_the_event_came() -> None:
    """The scheduler may place a sharer on the full count until the patch lands, however slow it is."""
    clock = Clock()

    class SlowApi(Api):
        def patch_node_status(self, name: str, status: Mapping[str, Any]) -> None:
            super().patch_node_status(name, status)
            clock.now += 1.5

    api = SlowApi([node(r="0")])
    w = NodeWatch(api, "node-a", clock=clock)  # type: ignore[arg-type]
    w.relist()
    w.hold({R: 0})
    arrived = clock.now
    w.apply(WatchEvent("MODIFIED", node(rv="11", r="8")))
    assert w.lowered_at() == {R: arrived + 1.5}


def raised(**counts: int) -> tuple[str, str, dict[str, Any]]:
    fields = {{"r": R, "o": OTHER}[k]: str(v) for k, v in counts.items()}
    return ("patch", "node-a", {"allocatable": fields, "capacity": fields})


def test_a_catch_up_raises_only_what_the_node_shows_lower_and_never_a_held_count() -> None:
    api = Api([node(r="0", o="0")])
    w = watch(api)
    assert w.catch_up(lambda: {R: 4}) == {}  # no Node seen yet: nothing written
    w.relist()
    w.hold({OTHER: 0})  # OTHER's shadow drains: its count stays down
    assert w.catch_up(lambda: {R: 4, OTHER: 2}) == {R: 4}
    assert api.patches() == [raised(r=4)]
    assert w.catch_up(lambda: {R: 4}) == {}  # the watch has not shown the patch yet; the agent's write is laid over
    assert api.patches() == [raised(r=4)]


def test_a_lower_after_a_catch_up_sees_the_raised_count_before_the_watch_shows_it() -> None:
    api = Api([node(r="0")])
    w = watch(api)
    w.relist()
    w.catch_up(lambda: {R: 4})
    assert w.lower(R, 0)  # slots withdrawn right after: the raised count must come down
    assert api.patches() == [raised(r=4), lowered(r=0)]


def test_a_refused_catch_up_is_logged_and_writes_nothing_else(caplog: pytest.LogCaptureFixture) -> None:
    api = Api([node(r="0")])
    w = watch(api)
    w.relist()
    api.fail_patch = ApiUnavailable("gpushare: PATCH answered 503; retrying in 1s")
    assert w.catch_up(lambda: {R: 4}) == {}
    assert "cannot publish the share count" in caplog.text
    api.fail_patch = None
    assert w.catch_up(lambda: {R: 4}) == {R: 4}  # the Node still shows 0: the next try writes
