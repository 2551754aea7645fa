"""The lendable-namespace cache's bookkeeping: names from one LIST, then watch events; a wake only on a change."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from controller.errors import ApiUnavailable
from controller.io.kube_client import WatchEvent
from controller.io.namespace_cache import NamespaceCache


def ns(name: str, rv: str = "1") -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": rv}}


class Namespaces:
    def __init__(self, items: list[dict[str, Any]], events: list[WatchEvent] | None = None) -> None:
        self.items, self.events = items, list(events or [])
        self.lists: list[str | None] = []
        self.watched_from = ""
        self.fail_watch = False

    def list_namespaces(self, *, label_selector: str | None = None) -> tuple[list[dict[str, Any]], str]:
        self.lists.append(label_selector)
        return list(self.items), "10"

    def watch_namespaces(self, rv: str, **_: Any) -> Iterator[WatchEvent]:
        self.watched_from = rv
        if self.fail_watch:
            raise ApiUnavailable("gpushare: WATCH /api/v1/namespaces broke off; listing again")
        yield from self.events


def test_names_come_from_the_list_then_from_watch_events() -> None:
    client = Namespaces([ns("b"), ns("a")])
    woke: list[int] = []
    cache = NamespaceCache(client, label_selector="l=true", on_change=lambda: woke.append(1))  # type: ignore[arg-type]
    assert cache.names() == [] and not cache.is_synced  # before the first LIST: nothing lendable
    cache.relist()
    assert cache.names() == ["a", "b"] and cache.is_synced and client.lists == ["l=true"]
    assert len(woke) == 1
    cache.apply(WatchEvent("ADDED", ns("c", "11")))
    cache.apply(WatchEvent("DELETED", ns("a", "12")))
    assert cache.names() == ["b", "c"] and len(woke) == 3
    cache.apply(WatchEvent("MODIFIED", ns("b", "13")))  # an edit that keeps the label changes nothing
    cache.apply(WatchEvent("BOOKMARK", {"metadata": {"resourceVersion": "14"}}))
    cache.apply(WatchEvent("ADDED", {"metadata": "not an object"}))  # ignored, and the thread lives on
    assert len(woke) == 3 and cache.names() == ["b", "c"]
    client.items = [ns("c"), ns("b")]
    cache.relist()  # the same names again: no wake
    assert len(woke) == 3
    client.items = [ns("c")]
    cache.relist()  # a deletion the watch missed: a wake
    assert cache.names() == ["c"] and len(woke) == 4


def test_the_watch_starts_from_the_last_resource_version_and_a_failure_lists_again() -> None:
    client = Namespaces([ns("a")], [WatchEvent("ADDED", ns("b", "42"))])
    cache = NamespaceCache(client, label_selector="l=true")  # type: ignore[arg-type]
    stop = threading.Event()
    cache.relist()
    cache.watch_once(stop)
    assert client.watched_from == "10" and cache.names() == ["a", "b"]
    cache.watch_once(stop)
    assert client.watched_from == "42"

    client.fail_watch = True
    client.items = [ns("z")]

    def stop_after_relist() -> None:
        if len(client.lists) >= 2:
            stop.set()

    original = cache.relist

    def relist() -> None:
        original()
        stop_after_relist()

    cache.relist = relist  # type: ignore[method-assign]
    cache.run(stop)  # watch fails -> backs off -> lists again -> stops
    assert cache.names() == ["z"] and len(client.lists) == 2
