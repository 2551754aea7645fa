"""Leader failover on the real cluster: kill -9 of the leader, and a leader cut off from the API server.

Both agents run the whole time; the Lease alone decides which one does the cluster-wide work.
Throughout, no shadow may be created twice or deleted, and no sharer evicted.
"""

from __future__ import annotations

import json
import time

from localcluster.layout import NODE_NAME
from localcluster.pods import sharer
from tests.integration.failover.conftest import LEASE_S, NODE_B, RENEW_S, Pair, micro_time

# A loaded 2-core machine may start a poll or a pass a few seconds late.
SLACK_S = 10.0


def start(p: Pair, names: list[str]) -> None:
    for n in names:
        p.cluster.kubectl("apply", "-f", "-", input=json.dumps(sharer(n)))
    p.wait(f"{names} Running", lambda: p.running(names), 120)


def sharer_uids(p: Pair) -> dict[str, str]:
    return {x["metadata"]["name"]: x["metadata"]["uid"] for x in p.pods()}


def shadows_created(*logs: str) -> int:
    """Creates the API accepted, by any agent (one that met AlreadyExists logs that as well)."""
    text = "\n".join(logs)
    return text.count("decision=create-shadow") - text.count("shadow already exists")


def assert_nothing_lost(p: Pair, shadows: dict[str, str], sharers: dict[str, str]) -> None:
    now_shadows = p.shadows()
    assert {n: now_shadows.get(n) for n in shadows} == shadows, now_shadows  # none deleted or replaced
    now = sharer_uids(p)
    assert {n: now.get(n) for n in sharers} == sharers, now  # none evicted (a replacement has a new uid)
    assert p.running(list(sharers))
    for agent in (p.a, p.b):
        log = agent.log_text()
        for decision in ("decision=evict", "decision=delete-shadow", "key=gpushare.k8s.io/draining"):
            assert decision not in log, decision
    # Every shadow ever created is still there: none was made twice.
    assert shadows_created(p.a.log_text(), p.b.log_text()) == len(now_shadows), now_shadows


def test_kill9_of_the_leader_hands_over_within_the_lease_and_loses_nothing(pair: Pair) -> None:
    start(pair, ["fo-0", "fo-1", "fo-2"])  # one share-gpu-4 shadow, one slot free
    shadows, sharers = pair.shadows(), sharer_uids(pair)
    assert len(shadows) == 1, shadows
    assert pair.is_leader(pair.b) is True and pair.is_leader(pair.a) is False  # A: node work only

    pair.b.kill9()  # the leader dies without releasing the Lease
    last = pair.lease()
    assert last["holderIdentity"] == NODE_B
    pair.wait("A holds the Lease", lambda: pair.holder() == NODE_NAME, LEASE_S + RENEW_S + 60)
    lease = pair.lease()
    taken = micro_time(lease["acquireTime"]) - micro_time(last["renewTime"])
    # Not before B's lease could have run out, and within one poll of it.
    assert LEASE_S <= taken <= LEASE_S + RENEW_S + SLACK_S, taken
    assert lease["leaseTransitions"] == last.get("leaseTransitions", 0) + 1
    assert_nothing_lost(pair, shadows, sharers)

    # The new leader does the cluster-wide work: two more sharers need exactly one more shadow.
    start(pair, ["fo-3", "fo-4"])
    assert len(pair.shadows()) == 2
    assert_nothing_lost(pair, shadows, sharers)


def test_a_leader_cut_off_from_the_api_stops_leading_before_another_starts(pair: Pair) -> None:
    start(pair, ["cut-0", "cut-1"])
    shadows, sharers = pair.shadows(), sharer_uids(pair)
    assert len(shadows) == 1 and pair.is_leader(pair.b) is True

    pair.proxy.cut()  # B's requests now vanish without an answer
    cut_at = time.time()
    b_stopped: float | None = None

    def a_leads() -> bool:
        nonlocal b_stopped
        if b_stopped is None and pair.is_leader(pair.b) is False:
            b_stopped = time.time()  # B's own pass: no cluster-wide work from here on
        return pair.holder() == NODE_NAME

    pair.wait("A holds the Lease", a_leads, LEASE_S + RENEW_S + 60)
    a_started = micro_time(pair.lease()["acquireTime"])
    assert b_stopped is not None, "B still led when A took the Lease"
    assert b_stopped < a_started, (b_stopped, a_started)
    assert b_stopped - cut_at < LEASE_S  # B gave up within the lease duration, without hearing from anyone

    start(pair, ["cut-2", "cut-3", "cut-4"])  # A now leads: one more shadow for the fifth sharer
    assert len(pair.shadows()) == 2

    # The API comes back: B, its caches stale, finds A's Lease and stays a follower.
    mark = pair.b.mark()
    pair.proxy.restore()
    time.sleep(RENEW_S * 2 + 2)  # two more tries of the Lease, and passes
    assert pair.holder() == NODE_NAME and pair.is_leader(pair.b) is False
    assert "decision=create-shadow" not in pair.b.log_text()[mark:]
    assert_nothing_lost(pair, shadows, sharers)
