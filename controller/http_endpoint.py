"""The agent's HTTP endpoint: ``/metrics`` (Prometheus text), ``/healthz``, ``/status``, and who gets each.

Everything served is read from immutable values (the loop's last ``TickReport``, the metrics
registry): a scrape never waits for the loop, and the loop never waits for a scrape. The
series are listed in ``controller/metrics/exposition.py``.

Who gets what (``controller/core/endpoint_rules.py``, docs/security.md): ``/healthz`` anyone;
``/status`` loopback clients only; ``/metrics``, which names tenants' pods, loopback clients and,
with ``metrics.access: rbac`` (the default), clients whose bearer token a TokenReview authenticates
and a SubjectAccessReview allows to get ``/metrics`` (``controller/io/access_reviews.py``); with
``open``, anyone. The server holding it all within bounds is ``controller/io/bounded_http.py``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

from controller.core import endpoint_rules as rules
from controller.core.endpoint_rules import Verdict
from controller.io.bounded_http import BoundedHttpServer, Request, Response, plain
from controller.metrics.exposition import CONTENT_TYPE
from controller.report import TickReport
from gpushare.config import METRICS_ACCESS_OPEN, METRICS_ACCESS_RBAC, MetricsConfig
from gpushare.log import kv

log = logging.getLogger(__name__)

Authorize = Callable[[str | None, str], Verdict]


def is_healthy(report: TickReport, now: float, max_age_s: float) -> tuple[bool, str]:
    """``/healthz``: a reconcile pass completed within ``max_age_s``."""
    if report.at == 0.0:
        return False, "no reconcile pass yet"
    age = now - report.at
    if age > max_age_s:
        return False, f"last reconcile pass {age:.0f}s ago (limit {max_age_s:.0f}s)"
    return True, f"ok: last pass {age:.1f}s ago"


def _no_reviewer(_authorization: str | None, path: str) -> Verdict:
    return Verdict(403, f"gpushare: this agent checks no tokens; {path} is served to loopback clients only")


class Endpoint:
    """The bounded server with the endpoint's routes; ``start()``, then ``close()`` stops it.

    ``access`` and ``authorize`` decide ``/metrics`` for clients off the node: ``rbac`` asks
    ``authorize(authorization header, path)`` (without one, such clients are refused).
    """

    def __init__(
        self,
        listen: str,
        *,
        report: Callable[[], TickReport],
        status: Callable[[], dict[str, Any]],
        metrics: Callable[[], bytes],
        max_age_s: float = 30.0,
        clock: Callable[[], float] = time.time,
        access: str = METRICS_ACCESS_RBAC,
        authorize: Authorize | None = None,
        max_connections: int = MetricsConfig.max_connections,
        **bounds: Any,
    ) -> None:
        self._report = report
        self._status = status
        self._metrics = metrics
        self._max_age_s = max_age_s
        self._clock = clock
        self.access = access
        self._authorize = authorize or _no_reviewer
        host, _, port = listen.rpartition(":")
        self._server = BoundedHttpServer(host, int(port), self.handle, max_connections=max_connections, **bounds)
        self.address = self._server.address

    def handle(self, request: Request) -> Response:
        path = request.path
        if path not in (rules.METRICS_PATH, rules.HEALTHZ_PATH, rules.STATUS_PATH):
            return plain(404, "gpushare: /metrics, /healthz or /status")
        verdict = rules.before_review(path, loopback=request.loopback, access=self.access)
        if verdict is None:
            verdict = self._authorize(request.headers.get("authorization"), path)
        if not verdict.allowed:
            # The refusal says what to do; it names no pod, whoever asks.
            challenge = (("WWW-Authenticate", 'Bearer realm="gpushare"'),) if verdict.code == 401 else ()
            return plain(verdict.code, verdict.reason, challenge)
        if path == rules.METRICS_PATH:
            return Response(200, self._metrics(), CONTENT_TYPE)
        if path == rules.HEALTHZ_PATH:
            ok, why = is_healthy(self._report(), self._clock(), self._max_age_s)
            return plain(200 if ok else 503, why)
        return Response(200, json.dumps(self._status(), default=str).encode(), "application/json")

    def start(self) -> None:
        self._server.start()
        log.info(
            "metrics endpoint listening",
            extra=kv(address=self.address, access=self.access, max_connections=self._server.max_connections),
        )
        if self.access == METRICS_ACCESS_OPEN and not rules.is_loopback(self.address.rpartition(":")[0].strip("[]")):
            log.warning(
                "/metrics is open to every client that reaches the endpoint, and it names tenants' pods",
                extra=kv(address=self.address, access=self.access),
            )

    def busy(self) -> int:
        return self._server.busy()

    def refused(self) -> int:
        return self._server.refused()

    def close(self, timeout_s: float = 5.0) -> None:
        self._server.close(timeout_s)


__all__ = ["Endpoint", "is_healthy"]
