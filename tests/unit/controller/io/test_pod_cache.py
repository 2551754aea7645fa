"""The pod cache's bookkeeping: fresh once per LIST, deletions kept until the next, resync on schedule."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from controller.core.pod_facts import PodRef
from controller.errors import ResourceExpired
from controller.io.kube_client import WatchEvent
from controller.io.pod_cache import ASSUME_S, PodCache


def pod(name: str, uid: str = "", rv: str = "1") -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": name, "uid": uid or f"u-{name}", "resourceVersion": rv}}


class ListOnly:
    """Our own client's list/watch surface, answering from memory (the cache logic is under test)."""

    def __init__(self, items: list[dict[str, Any]], events: list[WatchEvent] = ()) -> None:  # type: ignore[assignment]
        self.items, self.events, self.lists, self.watched_from = items, list(events), 0, ""

    def list_pods(self, **_: Any) -> tuple[list[dict[str, Any]], str]:
        self.lists += 1
        return list(self.items), "10"

    def watch_pods(self, rv: str, **_: Any) -> Iterator[WatchEvent]:
        self.watched_from = rv
        yield from self.events


def test_cache_is_fresh_once_per_list_and_remembers_deletions_until_the_next() -> None:
    client = ListOnly([pod("a"), pod("b")])
    cache = PodCache(client, resync_s=300)  # type: ignore[arg-type]
    assert not cache.view().is_synced
    cache.relist()
    first = cache.view()
    assert first.is_fresh and first.is_synced and len(first.pods) == 2
    assert not cache.view().is_fresh  # fresh only for the first pass after a LIST
    cache.apply(WatchEvent("DELETED", pod("a", rv="11")))
    cache.apply(WatchEvent("ADDED", pod("c", rv="12")))
    cache.apply(WatchEvent("BOOKMARK", {"metadata": {"resourceVersion": "13"}}))
    v = cache.view()
    assert sorted(p["metadata"]["name"] for p in v.pods) == ["b", "c"]
    assert v.deleted == frozenset({PodRef("ns", "a", "u-a")}) and not v.is_fresh
    assert cache.view().deleted == v.deleted  # kept until the next full LIST...
    cache.relist()
    assert cache.view().deleted == frozenset()  # ...which is then the proof of absence


def test_cache_watches_from_the_last_resource_version_and_resyncs_on_schedule() -> None:
    now = [0.0]
    client = ListOnly([pod("a")], [WatchEvent("MODIFIED", pod("a", rv="42"))])
    changes: list[int] = []
    cache = PodCache(client, resync_s=60, on_change=lambda: changes.append(1), clock=lambda: now[0])  # type: ignore[arg-type]
    stop = threading.Event()
    cache.relist()
    cache.watch_once(stop)
    assert client.watched_from == "10" and len(changes) == 2
    cache.watch_once(stop)
    assert client.watched_from == "42"

    # run(): lists when due, and a failing watch makes it list again.
    class Failing(ListOnly):
        def watch_pods(self, rv: str, **_: Any) -> Iterator[WatchEvent]:
            if self.lists >= 2:
                stop.set()
            raise ResourceExpired("gpushare: expired")
            yield  # pragma: no cover

    failing = Failing([pod("a")])
    PodCache(failing, resync_s=60, clock=lambda: now[0]).run(stop)  # type: ignore[arg-type]
    assert failing.lists == 2


def test_an_object_with_odd_metadata_neither_stops_the_watch_nor_hides_the_others() -> None:
    cache = PodCache(ListOnly([pod("a")]), resync_s=300)  # type: ignore[arg-type]
    cache.relist()
    cache.apply(WatchEvent("ADDED", {"metadata": "not an object"}))
    cache.apply(WatchEvent("MODIFIED", pod("b", rv="11")))
    names = sorted(
        str((p.get("metadata") or {}).get("name", "?"))
        for p in cache.view().pods
        if p.get("metadata") != "not an object"
    )
    assert names == ["a", "b"] and len(cache.view().pods) == 3


def names(cache: PodCache) -> list[str]:
    return sorted(p["metadata"]["name"] for p in cache.view().pods)


def test_a_pod_the_agent_created_counts_before_its_watch_event_and_the_watch_then_owns_it() -> None:
    now = [0.0]
    cache = PodCache(ListOnly([pod("a")]), clock=lambda: now[0])  # type: ignore[arg-type]
    cache.assume(pod("s0"))
    assert names(cache) == []  # not synced: nothing to stand in for yet
    cache.relist()
    cache.assume(pod("s0"))
    assert names(cache) == ["a", "s0"]  # the next pass does not create s0 again
    cache.apply(WatchEvent("MODIFIED", pod("s0", rv="20")))
    now[0] = ASSUME_S + 1
    v = cache.view()
    assert [p["metadata"]["resourceVersion"] for p in v.pods if p["metadata"]["name"] == "s0"] == ["20"]


def test_an_assumed_pod_never_overrides_the_watch_and_lapses_unconfirmed() -> None:
    now = [0.0]
    cache = PodCache(ListOnly([pod("a")]), clock=lambda: now[0])  # type: ignore[arg-type]
    cache.relist()
    cache.apply(WatchEvent("ADDED", pod("s0", rv="21")))
    cache.assume(pod("s0", rv="20"))  # the create's answer came after the watch's newer event
    cache.apply(WatchEvent("DELETED", pod("s1", rv="23")))
    cache.assume(pod("s1", rv="22"))  # created and already deleted: not brought back
    cache.assume({"metadata": {"namespace": "ns", "name": "odd"}})  # no uid: not a stored pod
    assert names(cache) == ["a", "s0"]
    assert [p["metadata"]["resourceVersion"] for p in cache.view().pods if p["metadata"]["name"] == "s0"] == ["21"]
    cache.assume(pod("s2"))
    now[0] = ASSUME_S - 1
    assert names(cache) == ["a", "s0", "s2"]
    now[0] = ASSUME_S + 1
    assert names(cache) == ["a", "s0"]  # no event ever spoke for it: the watch missed it, a LIST decides
    cache.assume(pod("s3"))
    cache.relist()
    assert names(cache) == ["a"]  # a LIST is the truth


def test_the_cache_keeps_only_what_the_agent_reads_of_each_pod() -> None:
    def heavy(name: str, rv: str = "1") -> dict[str, Any]:
        p = pod(name, rv=rv)
        p["spec"] = {"containers": [{"name": "c", "env": [{"name": "E", "value": "x" * 10_000}]}]}
        return p

    class Trimming(ListOnly):
        def list_pods(self, **sel: Any) -> tuple[list[dict[str, Any]], str]:
            items, rv = super().list_pods()
            return [sel["each"](p) for p in items], rv  # as KubeClient does, page by page

    cache = PodCache(Trimming([heavy("a")]), resync_s=300)  # type: ignore[arg-type]
    cache.relist()
    cache.apply(WatchEvent("ADDED", heavy("b", rv="12")))
    for p in cache.view().pods:
        assert p["spec"]["containers"] == [{"name": "c"}], p
