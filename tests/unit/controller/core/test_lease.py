"""The lease rule: create, renew, take over or wait, judged on our own monotonic clock."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from controller.core.lease import LeaseObservation, decide_lease, format_micro_time

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


def test_micro_time_format() -> None:
    assert format_micro_time(WALL) == STAMP
