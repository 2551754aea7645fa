"""AccessReviewer: the cache first, then a TokenReview and a SubjectAccessReview, a few at a time."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from controller.core import endpoint_rules as rules
from controller.core.endpoint_rules import ReviewCache
from controller.errors import ApiUnavailable, KubeError
from controller.io.access_reviews import AccessReviewer

GOOD = "good-token"
NOBODY = "nobody-token"
PROM = "system:serviceaccount:monitoring:prometheus"


class FakeReviews:
    """The API server's answers: GOOD is Prometheus, allowed; NOBODY authenticates, is not allowed."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.fail: Exception | None = None
        self.answer: Any = None
        self.gate: threading.Event | None = None

    def token_review(self, body: Mapping[str, Any]) -> Any:
        self.calls.append("token")
        if self.gate is not None:
            self.gate.wait(5)
        if self.fail is not None:
            raise self.fail
        if self.answer is not None:
            return self.answer
        token = body["spec"]["token"]
        users = {GOOD: PROM, NOBODY: "system:serviceaccount:tenant:nobody"}
        if token not in users:
            return {"status": {"authenticated": False, "error": "invalid bearer token"}}
        return {"status": {"authenticated": True, "user": {"username": users[token], "groups": ["g"]}}}

    def access_review(self, body: Mapping[str, Any]) -> Any:
        self.calls.append("access")
        spec = body["spec"]
        assert spec["nonResourceAttributes"] == {"path": "/metrics", "verb": "get"}
        return {"status": {"allowed": spec["user"] == PROM}}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def reviewer(fake: FakeReviews, clock: Clock | None = None, **kw: Any) -> AccessReviewer:
    return AccessReviewer(fake, clock=clock or Clock(), **kw)


def test_no_token_is_401_without_asking_the_api_server() -> None:
    fake = FakeReviews()
    r = reviewer(fake)
    for header in (None, "", "Basic dXNlcjpwYXNz", "Bearer "):
        verdict = r.verdict(header, "/metrics")
        assert verdict.code == 401 and rules.READER_CLUSTER_ROLE in verdict.reason
    assert fake.calls == []


def test_allowed_denied_and_unauthenticated_tokens() -> None:
    fake = FakeReviews()
    r = reviewer(fake)
    assert r.verdict(f"Bearer {GOOD}", "/metrics").code == 200
    assert fake.calls == ["token", "access"]
    denied = r.verdict(f"Bearer {NOBODY}", "/metrics")
    assert denied.code == 403 and "nobody" in denied.reason
    fake.calls.clear()
    unknown = r.verdict("Bearer forged", "/metrics")
    assert unknown.code == 401 and "invalid bearer token" in unknown.reason
    assert fake.calls == ["token"]  # no SubjectAccessReview for a user nobody authenticated


def test_verdicts_are_cached_allowed_longer_than_refused() -> None:
    fake, clock = FakeReviews(), Clock()
    r = reviewer(fake, clock)
    for _ in range(3):
        assert r.verdict(f"Bearer {GOOD}", "/metrics").code == 200
        assert r.verdict(f"Bearer {NOBODY}", "/metrics").code == 403
    assert fake.calls == ["token", "access", "token", "access"]
    clock.now = rules.DENY_TTL_S
    fake.calls.clear()
    r.verdict(f"Bearer {GOOD}", "/metrics")
    r.verdict(f"Bearer {NOBODY}", "/metrics")
    assert fake.calls == ["token", "access"]  # only the refusal was asked again
    clock.now = rules.ALLOW_TTL_S
    fake.calls.clear()
    r.verdict(f"Bearer {GOOD}", "/metrics")
    assert fake.calls == ["token", "access"]


def test_an_api_server_that_fails_gets_503_and_nothing_is_cached() -> None:
    fake = FakeReviews()
    r = reviewer(fake)
    fake.fail = ApiUnavailable("gpushare: the API server at x did not answer")
    assert r.verdict(f"Bearer {GOOD}", "/metrics").code == 503
    fake.fail = KubeError("gpushare: POST /apis/authentication.k8s.io/v1/tokenreviews: 403 forbidden")
    assert r.verdict(f"Bearer {GOOD}", "/metrics").code == 503
    fake.fail = None
    assert r.verdict(f"Bearer {GOOD}", "/metrics").code == 200  # asked again, not a cached failure
    assert r.cached() == 1


def test_a_malformed_answer_is_503_never_an_allowance() -> None:
    fake = FakeReviews()
    fake.answer = {"status": {"authenticated": True, "user": {"username": ["not", "a", "name"]}}}
    assert reviewer(fake).verdict(f"Bearer {GOOD}", "/metrics").code == 503


def test_reviews_in_flight_are_bounded_and_the_rest_wait_briefly_then_get_503() -> None:
    fake = FakeReviews()
    fake.gate = threading.Event()
    r = reviewer(fake, max_in_flight=2, turn_wait_s=0.2)
    results: list[int] = []
    threads = [
        threading.Thread(target=lambda i=i: results.append(r.verdict(f"Bearer t{i}", "/metrics").code))
        for i in range(2)
    ]
    for t in threads:
        t.start()
    try:
        while fake.calls.count("token") < 2:
            threading.Event().wait(0.01)
        # Both turns are taken by reviews the API server has not answered: the third waits, then 503.
        assert r.verdict("Bearer third", "/metrics").code == 503
        assert fake.calls.count("token") == 2
    finally:
        fake.gate.set()
        for t in threads:
            t.join(5)
    assert sorted(results) == [401, 401]


def test_the_cache_of_the_reviewer_is_bounded() -> None:
    fake = FakeReviews()
    r = reviewer(fake, cache=ReviewCache(max_entries=5))
    for i in range(50):
        r.verdict(f"Bearer random-{i}", "/metrics")
    assert r.cached() == 5
