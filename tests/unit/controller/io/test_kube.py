"""The pure parts of controller.io.kube: the lease rule, error translation, watch lines, the cache's bookkeeping."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from controller.core.model import PodRef
from controller.errors import ApiUnavailable, KubeError, ResourceExpired, RetryLater
from controller.io.kube import (
    LeaseObservation,
    PodCache,
    WatchEvent,
    _translate,
    _watch_event,
    decide_lease,
    format_micro_time,
)

WALL = datetime(2026, 12, 2, 16, 0, 0, 123456, tzinfo=UTC)
STAMP = "2026-12-02T16:00:00.123456Z"


def lease(
    holder: str, renew: str = "2026-12-02T15:59:00.000000Z", duration: int = 15, transitions: int = 2
) -> dict[str, Any]:
    return {
        "holderIdentity": holder,
        "renewTime": renew,
        "leaseDurationSeconds": duration,
        "leaseTransitions": transitions,
    }


def decide(spec: dict[str, Any] | None, mono: float, observed: LeaseObservation | None = None) -> Any:
    return decide_lease(spec, holder="me", duration_s=15, wall_now=WALL, mono_now=mono, observed=observed)


def test_no_lease_is_created_with_us_as_holder() -> None:
    d, seen = decide(None, 100.0)
    assert d.action == "create" and seen is None
    assert d.spec == {
        "holderIdentity": "me",
        "leaseDurationSeconds": 15,
        "acquireTime": STAMP,
        "renewTime": STAMP,
        "leaseTransitions": 0,
    }


def test_our_lease_is_renewed_keeping_acquire_time_and_transitions() -> None:
    d, _ = decide({**lease("me"), "acquireTime": "earlier"}, 100.0)
    assert d.action == "renew" and d.spec["renewTime"] == STAMP
    assert d.spec["acquireTime"] == "earlier" and d.spec["leaseTransitions"] == 2


def test_another_holder_expires_only_on_our_own_clock() -> None:
    other = lease("other")
    d, seen = decide(other, 100.0)  # first sight: the timestamp in the record is not trusted
    assert d.action == "wait" and seen == LeaseObservation(("other", other["renewTime"], 2), 100.0)
    d, seen2 = decide(other, 114.9, seen)
    assert d.action == "wait" and seen2 == seen
    d, _ = decide(other, 115.0, seen)  # unchanged for its whole duration: take it over
    assert d.action == "take" and d.spec["holderIdentity"] == "me" and d.spec["leaseTransitions"] == 3
    renewed = lease("other", renew="2026-12-02T16:00:10.000000Z")
    d, seen3 = decide(renewed, 120.0, seen)  # the holder renewed: the clock starts again
    assert d.action == "wait" and seen3 == LeaseObservation(("other", renewed["renewTime"], 2), 120.0)


def test_a_released_lease_is_taken_at_once() -> None:
    d, _ = decide(lease(""), 100.0)
    assert d.action == "take"


def test_rbac_denials_point_at_the_rbac_manifest() -> None:
    denied = b'{"message": "pods is forbidden: User \\"x\\" cannot create resource \\"pods\\""}'
    assert "manifests/20-rbac.yaml" in str(_translate(403, "POST /p", denied, None))
    assert "manifests/20-rbac.yaml" not in str(_translate(403, "POST /p", b'{"message": "no PriorityClass"}', None))


def test_micro_time_format() -> None:
    assert format_micro_time(WALL) == STAMP


@pytest.mark.parametrize(
    ("status", "kind", "needle"),
    [
        (410, ResourceExpired, "listing again"),
        (429, ApiUnavailable, "retrying in 3s"),
        (503, ApiUnavailable, "answered 503"),
        (403, KubeError, "was refused with 403: bad pod"),
        (422, KubeError, "was refused with 422: bad pod"),
    ],
)
def test_api_errors_become_ours(status: int, kind: type[KubeError], needle: str) -> None:
    err = _translate(status, "POST /api/v1/pods", b'{"message": "bad pod"}', "3" if status == 429 else None)
    assert type(err) is kind and needle in str(err) and str(err).startswith("gpushare: POST /api/v1/pods")
    assert isinstance(err, RetryLater) == (kind is ApiUnavailable)


@pytest.mark.parametrize(
    ("line", "error"),
    [
        (b'{"type": "ERROR", "object": {"code": 410, "message": "too old resource version"}}', ResourceExpired),
        (b'{"type": "ERROR", "object": {"code": 500, "message": "boom"}}', ApiUnavailable),
        (b"{not json", ApiUnavailable),
        (b'{"type": "WEIRD", "object": {}}', ApiUnavailable),
    ],
)
def test_bad_watch_lines_end_the_watch_with_our_error(line: bytes, error: type[KubeError]) -> None:
    with pytest.raises(error, match=r"^gpushare: WATCH"):
        _watch_event(line, "WATCH /api/v1/pods")


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
