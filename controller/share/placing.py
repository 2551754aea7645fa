"""Sharers on their way to a slot: seen pending by the leader, now bound where it cannot see them.

The leader watches unscheduled pods and shadows only (docs/scale.md): a sharer the scheduler
has just bound leaves its pending view at once, but the slot it took shows again only when
that node's agent writes the sharer into its shadow's users record. In between,
``plan_shadows`` would count that slot as free and create too few shadows for the sharers
still pending, which then wait a whole second round of create, schedule, start and
advertise. So the leader remembers each sharer that left its pending view and counts it
against its key's free slots until a users record names it, its node's pods show it (the
leader's own node, counted there already), or ``PLACING_TTL_S`` passes.

A pending sharer that was deleted leaves the pending watch exactly as a bound one does (the
API server sends both as DELETED with the pod's last pending state), so it is counted too,
for at most ``PLACING_TTL_S``: the price is at most its slots of extra shadows for sharers
that arrive in that window, which idle out like any other. Pure module: no clock, ``now``
is passed in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from controller.core.model import ShareKey, SharePod

# A node agent records a bound sharer within a pass or two of kubelet admitting it; well past
# that, a sharer not recorded anywhere was most likely deleted while pending.
PLACING_TTL_S = 10.0


@dataclass(frozen=True, slots=True)
class Seen:
    """A sharer the leader saw pending: its key and slots; ``left_at`` once it left the pending view;
    ``since``: when this leader first saw it pending (how long the scheduler has left it there)."""

    key: ShareKey
    slots: int
    left_at: float | None = None
    since: float = 0.0


# "<ns>/<pod>" -> what the leader last knew of that sharer; kept by the caller from pass to pass.
Placing = Mapping[str, Seen]


def track_placing(
    previous: Placing,
    sharers: Iterable[SharePod],
    recorded: Iterable[str],
    now: float,
    ttl_s: float = PLACING_TTL_S,
) -> dict[str, Seen]:
    """The sharers pending now, and those that left the pending view and no record names yet.

    ``sharers``: every sharer of the leader's snapshot; ``recorded``: the ``"<ns>/<pod>"`` of
    every user in a shadow's users record.
    """
    out: dict[str, Seen] = {}
    # Seen but no longer pending (bound on the leader's node, counted there; terminating; gated):
    # no longer on its way to a slot the leader cannot see.
    visible: set[str] = set()
    for sharer in sharers:
        if sharer.is_pending:
            before = previous.get(sharer.facts.ref.key)
            since = now if before is None or before.left_at is not None else before.since
            out[sharer.facts.ref.key] = Seen(sharer.key, sharer.quantity, since=since)
        else:
            visible.add(sharer.facts.ref.key)
    gone = visible.union(recorded)
    for pod, seen in previous.items():
        if pod in out or pod in gone:
            continue
        left_at = now if seen.left_at is None else seen.left_at
        if now - left_at < ttl_s:
            out[pod] = Seen(seen.key, seen.slots, left_at, seen.since)
    return out


def placing_slots(placing: Placing) -> dict[ShareKey, int]:
    """Slots per key taken by sharers on their way to a slot (left the pending view, not recorded)."""
    out: dict[ShareKey, int] = {}
    for seen in placing.values():
        if seen.left_at is not None:
            out[seen.key] = out.get(seen.key, 0) + seen.slots
    return out


__all__ = ["PLACING_TTL_S", "Placing", "Seen", "placing_slots", "track_placing"]
