"""The lendable-namespace cache against a real API server: a label added shows up, a label removed
goes, through one watch and no LIST after the first."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from controller.io.kube_client import KubeClient
from controller.io.namespace_cache import NamespaceCache

SELECTOR = "gpushare.k8s.io/lendable=true"


def wait_for(what: str, predicate: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _label(client: KubeClient, name: str, value: str | None) -> None:
    body = {"metadata": {"labels": {"gpushare.k8s.io/lendable": value}}}
    client._call("PATCH", f"/api/v1/namespaces/{name}", body=body, content_type="application/merge-patch+json")


def test_a_namespace_that_gains_or_loses_the_label_arrives_by_watch(client: KubeClient) -> None:
    client._call("POST", "/api/v1/namespaces", body={"metadata": {"name": "team-watch"}}, ok=(409,))
    _label(client, "team-watch", None)
    changed = threading.Event()
    cache = NamespaceCache(client, label_selector=SELECTOR, on_change=changed.set)
    lists: list[int] = []
    relist = cache.relist

    def counted_relist() -> None:
        lists.append(1)
        relist()

    cache.relist = counted_relist  # type: ignore[method-assign]
    client.watch_timeout_s = 2
    stop = threading.Event()
    thread = threading.Thread(target=cache.run, args=(stop,), name="gpushare-controller-watch-namespaces-test")
    thread.start()
    try:
        wait_for("the first LIST", lambda: cache.is_synced)
        assert "team-watch" not in cache.names()
        _label(client, "team-watch", "true")
        wait_for("the labelled namespace", lambda: "team-watch" in cache.names())
        _label(client, "team-watch", "false")
        wait_for("the namespace to leave", lambda: "team-watch" not in cache.names())
        assert changed.is_set() and len(lists) == 1
    finally:
        stop.set()
        thread.join(timeout=20)
    assert not thread.is_alive()
