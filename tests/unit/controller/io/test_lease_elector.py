"""Two electors on one Lease, on an injected clock: never two leaders, and the takeover is timely.

The Lease lives in a small in-memory API that checks resourceVersion like the real one; each
elector reaches it through its own link, which a test can cut (a leader that lost the API
server) or kill (kill -9: the process stops renewing and nothing is released).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from controller.errors import ApiUnavailable
from controller.io.lease import LeaseElector

DURATION = 15


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def wall(self) -> datetime:
        return datetime(2026, 12, 3, tzinfo=UTC) + timedelta(seconds=self.t)


class LeaseApi:
    """One Lease object with optimistic concurrency, as coordination.k8s.io/v1 keeps it."""

    def __init__(self) -> None:
        self.spec: dict[str, Any] | None = None
        self.rv = 0
        self.writes: list[str] = []  # holder of each accepted write

    def get(self) -> dict[str, Any] | None:
        if self.spec is None:
            return None
        return {"metadata": {"resourceVersion": str(self.rv)}, "spec": dict(self.spec)}

    def write(self, spec: Any, rv: str | None) -> bool:
        if (rv is None) != (self.spec is None) or (rv is not None and rv != str(self.rv)):
            return False
        self.spec, self.rv = dict(spec), self.rv + 1
        self.writes.append(str(spec["holderIdentity"]))
        return True


class Link:
    """One agent's client: ``cut`` makes every call fail as an unreachable API server does."""

    def __init__(self, api: LeaseApi) -> None:
        self.api = api
        self.cut = False

    def _check(self) -> None:
        if self.cut:
            raise ApiUnavailable("gpushare: the API server did not answer")

    def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        self._check()
        return self.api.get()

    def write_lease(self, namespace: str, name: str, spec: Any, resource_version: str | None) -> bool:
        self._check()
        return self.api.write(spec, resource_version)


def pair() -> tuple[Clock, LeaseApi, tuple[Link, LeaseElector], tuple[Link, LeaseElector]]:
    clock, api = Clock(), LeaseApi()
    out = []
    for holder in ("node-a", "node-b"):
        link = Link(api)
        elector = LeaseElector(link, holder, duration_s=DURATION, clock=clock, wall_clock=clock.wall)  # type: ignore[arg-type]
        out.append((link, elector))
    return clock, api, out[0], out[1]


def run(
    clock: Clock, electors: list[LeaseElector | None], seconds: float, step: float = 0.5
) -> list[tuple[float, str]]:
    """Each live elector tries every DURATION/3 s as the agent's lease thread does; check every step."""
    renew_s = DURATION / 3
    next_try = {id(e): clock.t for e in electors if e is not None}
    leaders: list[tuple[float, str]] = []
    end = clock.t + seconds
    while clock.t < end:
        for e in electors:
            if e is not None and clock.t >= next_try[id(e)]:
                e.try_acquire_or_renew()
                next_try[id(e)] = clock.t + renew_s
        now_leading = [e.holder for e in electors if e is not None and e.is_leader()]
        assert len(now_leading) <= 1, (clock.t, now_leading)
        leaders += [(clock.t, h) for h in now_leading]
        clock.t += step
    return leaders


def test_one_of_two_leads_and_keeps_leading_while_it_renews() -> None:
    clock, api, (_, a), (_, b) = pair()
    leaders = run(clock, [a, b], 60)
    assert {h for _, h in leaders} == {"node-a"}
    assert leaders[0][0] == 1000.0 and len(leaders) == 120  # every step of the minute
    assert not b.is_leader() and api.writes[0] == "node-a"


def test_a_killed_leader_is_replaced_within_the_lease_duration_of_its_last_renew() -> None:
    clock, api, (_, a), (_, b) = pair()
    run(clock, [a, b], 20)
    last_renew = 1000.0 + 15  # renews at 1000, 1005, 1010, 1015
    leaders = run(clock, [None, b], 40)  # kill -9: a stops; its Lease is not released
    first_b = min(t for t, h in leaders if h == "node-b")
    # b must have seen the record unchanged for the lease duration on its own clock; it polls
    # every DURATION/3, so it takes over at most one poll after that.
    assert last_renew + DURATION <= first_b <= last_renew + DURATION + DURATION / 3
    assert api.writes.count("node-b") >= 1


def test_a_leader_cut_off_from_the_api_stops_before_another_can_start() -> None:
    clock, _api, (link_a, a), (_, b) = pair()
    run(clock, [a, b], 20)
    link_a.cut = True  # a keeps trying, every call fails
    leaders = run(clock, [a, b], 60)
    a_until = max(t for t, h in leaders if h == "node-a")
    b_from = min(t for t, h in leaders if h == "node-b")
    # a's last renew started at 1015: it acts as leader for less than the lease duration after it.
    assert a_until < 1015 + DURATION
    assert a_until < b_from  # and stops before b starts (run() also checks every step)
    link_a.cut = False  # the API comes back: a finds b's lease and stays a follower
    assert {h for _, h in run(clock, [a, b], 30)} == {"node-b"}


def test_a_renew_that_answers_late_counts_from_when_it_was_sent() -> None:
    clock, _api, (link_a, a), _ = pair()
    sent = clock.t
    original = link_a.get_lease

    def slow_get(namespace: str, name: str) -> dict[str, Any] | None:
        clock.t += 10.0  # the GET took 10 s
        return original(namespace, name)

    link_a.get_lease = slow_get  # type: ignore[method-assign]
    assert a.try_acquire_or_renew()
    clock.t = sent + DURATION * 0.8 - 0.01
    assert a.is_leader()
    clock.t = sent + DURATION * 0.8
    assert not a.is_leader()  # well before anyone else could take it (sent + DURATION at the earliest)


def test_losing_the_write_race_is_not_leading() -> None:
    _clock, api, (link_a, a), (_, b) = pair()
    api.spec, api.rv = {"holderIdentity": "", "renewTime": "", "leaseTransitions": 1}, 7  # released
    original = link_a.write_lease

    def b_first(namespace: str, name: str, spec: Any, resource_version: str | None) -> bool:
        assert b.try_acquire_or_renew()  # b writes between a's read and a's write
        return original(namespace, name, spec, resource_version)

    link_a.write_lease = b_first  # type: ignore[method-assign]
    assert not a.try_acquire_or_renew() and not a.is_leader()
    assert b.is_leader() and api.writes == ["node-b"]


def test_release_hands_over_at_once() -> None:
    clock, api, (_, a), (_, b) = pair()
    run(clock, [a, b], 6)
    a.release()
    assert not a.is_leader() and api.spec is not None and api.spec["holderIdentity"] == ""
    assert b.try_acquire_or_renew() and b.is_leader()
