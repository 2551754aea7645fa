"""Who holds the ``gpushare-controller`` Lease next: client-go's rule, on plain data (design §1).

``decide_lease`` takes the Lease spec as last read and says create, renew, take over or
wait; ``controller.io.lease.LeaseElector`` reads and writes the Lease around it. Expiry
is judged on the caller's monotonic clock, never on timestamps written by another node.
Pure module: stdlib only (docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal


def format_micro_time(t: datetime) -> str:
    """Kubernetes MicroTime: RFC 3339 with microseconds, UTC."""
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class LeaseObservation:
    """The lease record as last seen, and when (monotonic): expiry is judged on our own clock."""

    record: tuple[str, str, int]  # holderIdentity, renewTime, leaseTransitions
    seen_at_s: float


@dataclass(frozen=True)
class LeaseDecision:
    action: Literal["create", "renew", "take", "wait"]
    spec: Mapping[str, Any]


def decide_lease(
    spec: Mapping[str, Any] | None,
    *,
    holder: str,
    duration_s: int,
    wall_now: datetime,
    mono_now: float,
    observed: LeaseObservation | None,
) -> tuple[LeaseDecision, LeaseObservation | None]:
    """Create, renew, take over or wait — client-go's rule, on plain data.

    Another holder's lease counts as expired only when its record has not changed for its
    ``leaseDurationSeconds`` as measured on *our* monotonic clock since we first saw that
    record, so clock skew between nodes cannot make two leaders.
    """
    stamp = format_micro_time(wall_now)
    mine = {
        "holderIdentity": holder,
        "leaseDurationSeconds": duration_s,
        "acquireTime": stamp,
        "renewTime": stamp,
        "leaseTransitions": 0,
    }
    if spec is None:
        return LeaseDecision("create", mine), None
    current = (str(spec.get("holderIdentity") or ""), str(spec.get("renewTime") or ""))
    transitions = int(spec.get("leaseTransitions") or 0)
    record = (*current, transitions)
    if current[0] == holder:
        return LeaseDecision("renew", {**spec, "renewTime": stamp, "leaseDurationSeconds": duration_s}), None
    seen = observed if observed is not None and observed.record == record else LeaseObservation(record, mono_now)
    their_s = int(spec.get("leaseDurationSeconds") or duration_s)
    if not current[0] or mono_now - seen.seen_at_s >= their_s:
        return LeaseDecision("take", {**mine, "leaseTransitions": transitions + 1}), None
    return LeaseDecision("wait", dict(spec)), seen


__all__ = ["LeaseDecision", "LeaseObservation", "decide_lease", "format_micro_time"]
