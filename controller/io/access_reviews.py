"""The agent's TokenReviews and SubjectAccessReviews, and the verdicts it keeps from them.

``ReviewClient`` is ``KubeClient`` with the two review calls: the same transport and error
translation, but its own connection pool, built for the endpoint alone, so clients of the
endpoint can never take a connection the reconcile loop or spot needs. ``AccessReviewer`` turns
an ``Authorization`` header into a verdict (``controller/core/endpoint_rules.py``): the bounded
cache first, then the two reviews, at most ``max_in_flight`` at a time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from controller.core import endpoint_rules as rules
from controller.core.endpoint_rules import Identity, ReviewCache, Verdict
from controller.errors import KubeError
from controller.io.kube_client import KubeClient
from gpushare.log import kv

log = logging.getLogger(__name__)

TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
# Reviews the endpoint's clients may have the agent send at once, and how long a request waits for
# its turn: a client with a new token per request costs the API server this much, not more.
MAX_IN_FLIGHT = 4
TURN_WAIT_S = 2.0
REVIEW_TIMEOUT_S = 3.0


class ReviewClient(KubeClient):
    """``POST`` of a TokenReview and of a SubjectAccessReview; nothing else is called on it."""

    @classmethod
    def for_endpoint(cls, kubeconfig: str | None, timeout_s: float = REVIEW_TIMEOUT_S) -> ReviewClient:
        """A client with a pool of its own (``kubeconfig`` None: the in-cluster service account)."""
        client = cls.from_kubeconfig(kubeconfig, timeout_s=timeout_s)
        assert isinstance(client, cls)  # from_kubeconfig builds the class it is called on
        return client

    def token_review(self, body: Mapping[str, Any]) -> Any:
        _, doc = self._call("POST", TOKEN_REVIEWS, body=dict(body))
        return doc

    def access_review(self, body: Mapping[str, Any]) -> Any:
        _, doc = self._call("POST", ACCESS_REVIEWS, body=dict(body))
        return doc


class Reviews(Protocol):
    def token_review(self, body: Mapping[str, Any]) -> Any: ...
    def access_review(self, body: Mapping[str, Any]) -> Any: ...


class AccessReviewer:
    """Verdicts for bearer tokens; thread-safe (the cache under a lock, no I/O held under it)."""

    def __init__(
        self,
        reviews: Reviews,
        *,
        cache: ReviewCache | None = None,
        max_in_flight: int = MAX_IN_FLIGHT,
        turn_wait_s: float = TURN_WAIT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._reviews = reviews
        self._cache = cache if cache is not None else ReviewCache()
        self._lock = threading.Lock()
        self._turns = threading.BoundedSemaphore(max_in_flight)
        self._turn_wait_s = turn_wait_s
        self._clock = clock

    def verdict(self, authorization: str | None, path: str, verb: str = "get") -> Verdict:
        token = rules.bearer_token(authorization)
        if token is None:
            return rules.no_token(path)
        key = rules.cache_key(token, path)
        with self._lock:
            cached = self._cache.get(key, self._clock())
        if cached is not None:
            return cached
        if not self._turns.acquire(timeout=self._turn_wait_s):
            return Verdict(503, "gpushare: too many token reviews in flight; try again")
        try:
            verdict = self._review(token, path, verb)
        finally:
            self._turns.release()
        with self._lock:
            self._cache.put(key, verdict, self._clock())
        if verdict.allowed:
            log.info("endpoint access allowed", extra=kv(user=verdict.user, path=path, cached_s=rules.ALLOW_TTL_S))
        else:
            log.debug("endpoint access refused", extra=kv(code=verdict.code, reason=verdict.reason))
        return verdict

    def _review(self, token: str, path: str, verb: str) -> Verdict:
        """Both reviews; a failed or malformed one is 503 (never cached), never an allowance."""
        try:
            identity = rules.read_token_review(self._reviews.token_review(rules.token_review_body(token)))
            if not isinstance(identity, Identity):
                return identity
            answer = self._reviews.access_review(rules.access_review_body(identity, path, verb))
            return rules.read_access_review(answer, identity, path, verb)
        except (KubeError, ValueError) as exc:
            log.warning("cannot review a token for the endpoint", extra=kv(path=path, error=str(exc)))
            return Verdict(503, "gpushare: the API server cannot check the token now; try again")

    def cached(self) -> int:
        with self._lock:
            return len(self._cache)


__all__ = ["ACCESS_REVIEWS", "MAX_IN_FLIGHT", "TOKEN_REVIEWS", "AccessReviewer", "ReviewClient", "Reviews"]
