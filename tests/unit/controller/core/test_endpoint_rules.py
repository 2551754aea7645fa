"""Who the agent's endpoint serves and how much of the agent its clients may hold: tables, no sockets."""

from __future__ import annotations

from typing import Any

import pytest

from controller.core import endpoint_rules as rules
from controller.core.endpoint_rules import Identity, ReviewCache, Verdict

PROM = Identity(
    "system:serviceaccount:monitoring:prometheus",
    "uid-1",
    ("system:serviceaccounts", "system:serviceaccounts:monitoring", "system:authenticated"),
    (("authentication.kubernetes.io/pod-name", ("prometheus-0",)),),
)


@pytest.mark.parametrize(
    ("path", "loopback", "access", "code"),
    [
        # /healthz: kubelet's probes carry no token, and it names nothing.
        ("/healthz", False, "rbac", 200),
        ("/healthz", True, "rbac", 200),
        # /status names pods and devices: the node only, whatever access says.
        ("/status", False, "rbac", 403),
        ("/status", False, "open", 403),
        ("/status", True, "rbac", 200),
        # /metrics: loopback is the node; others are reviewed unless access is open.
        ("/metrics", True, "rbac", 200),
        ("/metrics", False, "rbac", None),
        ("/metrics", False, "open", 200),
    ],
)
def test_which_requests_need_a_review(path: str, loopback: bool, access: str, code: int | None) -> None:
    verdict = rules.before_review(path, loopback=loopback, access=access)
    assert (verdict.code if verdict else None) == code


def test_an_unknown_access_mode_reviews_rather_than_opens() -> None:
    # Only the word "open" opens /metrics: a mode this code does not know keeps it closed.
    assert rules.before_review("/metrics", loopback=False, access="Open") is None


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer abc.def.ghi", "abc.def.ghi"),
        ("bearer abc", "abc"),
        ("BEARER   abc  ", "abc"),
        (None, None),
        ("", None),
        ("Bearer", None),
        ("Bearer ", None),
        ("Basic dXNlcjpwYXNz", None),
        ("Bearer a b", None),
        ("Bearer " + "x" * rules.MAX_TOKEN_BYTES, None),
    ],
)
def test_bearer_token(header: str | None, token: str | None) -> None:
    assert rules.bearer_token(header) == token


def test_the_token_review_is_controller_runtimes() -> None:
    assert rules.token_review_body("t0k") == {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenReview",
        "spec": {"token": "t0k"},
    }


def _authenticated(user: dict[str, Any]) -> dict[str, Any]:
    return {"status": {"authenticated": True, "user": user}}


def test_an_authenticated_review_names_the_identity_to_authorize() -> None:
    doc = _authenticated(
        {
            "username": PROM.user,
            "uid": "uid-1",
            "groups": list(PROM.groups),
            "extra": {"authentication.kubernetes.io/pod-name": ["prometheus-0"]},
        }
    )
    assert rules.read_token_review(doc) == PROM
    assert rules.read_token_review(_authenticated({"username": "alice"})) == Identity("alice")


@pytest.mark.parametrize(
    "status",
    [
        {"authenticated": False},
        {"authenticated": False, "error": "token has expired"},
        {},  # the API server leaves authenticated out when false
        {"authenticated": "true"},  # not a boolean: not authenticated
    ],
)
def test_an_unauthenticated_token_is_401(status: dict[str, Any]) -> None:
    verdict = rules.read_token_review({"status": status})
    assert isinstance(verdict, Verdict) and verdict.code == 401
    if status.get("error"):
        assert "token has expired" in verdict.reason


@pytest.mark.parametrize(
    "doc",
    [
        None,
        [],
        {},
        {"status": "yes"},
        _authenticated({}),
        _authenticated({"username": ""}),
        _authenticated({"username": 7}),
        _authenticated({"username": "a", "groups": "g"}),
        _authenticated({"username": "a", "groups": [1]}),
        _authenticated({"username": "a", "uid": 3}),
        _authenticated({"username": "a", "extra": {"k": "v"}}),
        _authenticated({"username": "a", "extra": []}),
    ],
)
def test_a_malformed_token_review_answer_is_an_error_not_a_verdict(doc: object) -> None:
    # The caller answers 503 and caches nothing: a broken answer must never allow, nor stick as a denial.
    with pytest.raises(ValueError):
        rules.read_token_review(doc)


def test_the_access_review_repeats_the_identity_for_the_non_resource_url() -> None:
    assert rules.access_review_body(PROM, "/metrics") == {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": PROM.user,
            "uid": "uid-1",
            "groups": list(PROM.groups),
            "extra": {"authentication.kubernetes.io/pod-name": ["prometheus-0"]},
            "nonResourceAttributes": {"path": "/metrics", "verb": "get"},
        },
    }
    spec = rules.access_review_body(Identity("alice"), "/metrics")["spec"]
    assert spec == {"user": "alice", "groups": [], "nonResourceAttributes": {"path": "/metrics", "verb": "get"}}


@pytest.mark.parametrize(
    ("status", "code"),
    [
        ({"allowed": True}, 200),
        ({"allowed": True, "reason": 'RBAC: allowed by ClusterRoleBinding "prom"'}, 200),
        ({"allowed": False}, 403),
        ({}, 403),  # allowed left out when false
        ({"allowed": False, "denied": True}, 403),
        ({"allowed": True, "denied": True}, 403),  # contradictory: never an allowance
    ],
)
def test_the_access_review_answer(status: dict[str, Any], code: int) -> None:
    verdict = rules.read_access_review({"status": status}, PROM, "/metrics")
    assert verdict.code == code and verdict.user == PROM.user
    if code == 403:
        assert rules.READER_CLUSTER_ROLE in verdict.reason and PROM.user in verdict.reason


@pytest.mark.parametrize("doc", [None, {}, {"status": None}, {"status": {"allowed": "yes"}}])
def test_a_malformed_access_review_answer_is_an_error(doc: object) -> None:
    with pytest.raises(ValueError):
        rules.read_access_review(doc, PROM, "/metrics")


def test_the_cache_keys_hide_the_token_and_tell_paths_apart() -> None:
    key = rules.cache_key("secret-token", "/metrics")
    assert "secret-token" not in key
    assert key != rules.cache_key("secret-token", "/other")
    assert key == rules.cache_key("secret-token", "/metrics")


ALLOWED = Verdict(200, "ok", "u")
DENIED = Verdict(403, "no", "u")
UNAUTHENTICATED = Verdict(401, "who?")
UNAVAILABLE = Verdict(503, "later")


def test_allowed_and_refused_verdicts_expire_on_their_own_clocks() -> None:
    cache = ReviewCache(allow_ttl_s=60.0, deny_ttl_s=10.0)
    cache.put("a", ALLOWED, now=0.0)
    cache.put("d", DENIED, now=0.0)
    cache.put("u", UNAUTHENTICATED, now=0.0)
    assert (cache.get("a", 9.9), cache.get("d", 9.9), cache.get("u", 9.9)) == (ALLOWED, DENIED, UNAUTHENTICATED)
    assert (cache.get("a", 10.0), cache.get("d", 10.0), cache.get("u", 10.0)) == (ALLOWED, None, None)
    assert cache.get("a", 60.0) is None
    assert len(cache) == 0  # an expired entry read is dropped


def test_an_unavailable_answer_is_never_kept() -> None:
    cache = ReviewCache()
    cache.put("k", UNAVAILABLE, now=0.0)
    assert cache.get("k", 0.0) is None and len(cache) == 0


def test_the_cache_is_bounded_dropping_expired_entries_first_then_the_oldest() -> None:
    cache = ReviewCache(max_entries=3, allow_ttl_s=60.0, deny_ttl_s=10.0)
    cache.put("old-allowed", ALLOWED, now=0.0)
    cache.put("denied", DENIED, now=0.0)
    cache.put("newer-allowed", ALLOWED, now=5.0)
    cache.put("fourth", ALLOWED, now=11.0)  # the denial has expired: it goes, not the oldest allowance
    assert cache.get("old-allowed", 11.0) == ALLOWED and cache.get("denied", 11.0) is None
    cache.put("fifth", ALLOWED, now=12.0)  # nothing expired: the oldest goes
    assert cache.get("old-allowed", 12.0) is None
    assert [cache.get(k, 12.0) for k in ("newer-allowed", "fourth", "fifth")] == [ALLOWED] * 3
    for i in range(1000):  # a client with a new token per request: the cache stays at its bound
        cache.put(f"t{i}", UNAUTHENTICATED, now=13.0)
    assert len(cache) == 3


def test_a_verdict_put_again_replaces_the_old_one() -> None:
    cache = ReviewCache(max_entries=2)
    cache.put("k", ALLOWED, now=0.0)
    cache.put("k", DENIED, now=1.0)
    assert cache.get("k", 1.0) == DENIED and len(cache) == 1


@pytest.mark.parametrize(
    ("capacity", "busy", "from_address", "loopback", "admitted"),
    [
        (32, 0, 0, False, True),
        (32, 27, 0, False, True),
        (32, 28, 0, False, False),  # the last 4 slots are the node's own
        (32, 28, 0, True, True),
        (32, 31, 0, True, True),
        (32, 32, 0, True, False),  # full: even loopback is refused at once, never queued
        (32, 10, 7, False, False),  # one address off the node: at most (32 - 4) // 4 = 7
        (32, 10, 6, False, True),
        (32, 10, 7, True, True),  # loopback has no per-address share
        (8, 3, 0, False, True),
        (8, 3, 1, False, False),  # (8 - 4) // 4 = 1 per address
        (8, 4, 0, False, False),
    ],
)
def test_which_connection_may_take_a_slot(
    capacity: int, busy: int, from_address: int, loopback: bool, admitted: bool
) -> None:
    assert rules.admits(capacity=capacity, busy=busy, from_address=from_address, loopback=loopback) is admitted


def test_per_address_limit_is_never_zero() -> None:
    assert [rules.per_address_limit(c) for c in (5, 8, 32, 1024)] == [1, 1, 7, 255]


@pytest.mark.parametrize(
    ("max_connections", "limit", "fits"),
    [(32, 1024, True), (256, 1024, True), (257, 1024, False), (32, 64, False), (1024, None, True)],
)
def test_the_connection_cap_stays_well_below_the_open_files_limit(
    max_connections: int, limit: int | None, fits: bool
) -> None:
    problem = rules.fd_budget_problem(max_connections, limit)
    assert (problem is None) is fits
    if problem:
        assert "metrics.maxConnections" in problem and str(limit) in problem and "RLIMIT_NOFILE" in problem


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("::ffff:10.0.0.1", False),
        ("10.0.0.7", False),
        ("198.18.0.1", False),
        ("fe80::1%eth0", False),
        ("localhost", False),  # a name is not an address: never trusted as the node
        ("", False),
    ],
)
def test_loopback_is_decided_by_address(host: str, loopback: bool) -> None:
    assert rules.is_loopback(host) is loopback
