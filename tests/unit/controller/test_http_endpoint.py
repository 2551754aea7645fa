"""The agent's endpoint: what each path answers, and to whom (routes as plain calls, then one real socket)."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator

import pytest

from controller.core.endpoint_rules import Verdict
from controller.http_endpoint import Endpoint, is_healthy
from controller.io.bounded_http import Request
from controller.report import TickReport

METRICS = b'gpushare_gpu_user{namespace="team-a",pod="secret-pod"} 1.0\n'


def test_healthz_needs_a_recent_pass() -> None:
    assert is_healthy(TickReport(), now=100.0, max_age_s=30)[0] is False
    assert is_healthy(TickReport(at=90.0), now=100.0, max_age_s=30) == (True, "ok: last pass 10.0s ago")
    ok, why = is_healthy(TickReport(at=10.0), now=100.0, max_age_s=30)
    assert not ok and "90s ago" in why


class Reviewer:
    """Stands in for AccessReviewer: "Bearer prom" is allowed, "Bearer nobody" is not, else 401."""

    def __init__(self) -> None:
        self.asked: list[tuple[str | None, str]] = []

    def __call__(self, authorization: str | None, path: str) -> Verdict:
        self.asked.append((authorization, path))
        if authorization == "Bearer prom":
            return Verdict(200, "ok", "prom")
        if authorization == "Bearer nobody":
            return Verdict(403, "gpushare: nobody may not get /metrics: bind it to gpushare-metrics-reader")
        return Verdict(401, "gpushare: send a bearer token")


def endpoint(
    access: str = "rbac", reviewer: Reviewer | None = None, report: list[TickReport] | None = None
) -> Endpoint:
    reports = report if report is not None else [TickReport()]
    return Endpoint(
        "127.0.0.1:0",
        report=lambda: reports[0],
        status=lambda: {"node": "n1", "pods": ["team-a/secret-pod"]},
        metrics=lambda: METRICS,
        max_age_s=30.0,
        clock=lambda: 100.0,
        access=access,
        authorize=reviewer,
    )


@pytest.fixture
def rbac() -> Iterator[tuple[Endpoint, Reviewer]]:
    reviewer = Reviewer()
    ep = endpoint("rbac", reviewer)
    try:
        yield ep, reviewer
    finally:
        ep.close()


def req(path: str, *, loopback: bool, token: str | None = None) -> Request:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    return Request("GET", path, "", headers, "127.0.0.1" if loopback else "10.0.0.9", loopback)


@pytest.mark.parametrize(
    ("path", "loopback", "token", "code"),
    [
        ("/metrics", True, None, 200),  # the node itself
        ("/metrics", False, None, 401),
        ("/metrics", False, "forged", 401),
        ("/metrics", False, "nobody", 403),
        ("/metrics", False, "prom", 200),
        ("/healthz", False, None, 503),  # no pass yet: but answered, without a token
        ("/status", True, None, 200),
        ("/status", False, "prom", 403),  # a /metrics reader is not the node
        ("/nothing", False, None, 404),
    ],
)
def test_who_gets_what_with_rbac(
    rbac: tuple[Endpoint, Reviewer], path: str, loopback: bool, token: str | None, code: int
) -> None:
    ep, _ = rbac
    response = ep.handle(req(path, loopback=loopback, token=token))
    assert response.code == code
    if code != 200:
        # A refusal never names a pod, whoever asks.
        assert b"secret-pod" not in response.body


def test_only_metrics_off_the_node_is_reviewed(rbac: tuple[Endpoint, Reviewer]) -> None:
    ep, reviewer = rbac
    for path in ("/healthz", "/status", "/nothing"):
        ep.handle(req(path, loopback=False, token="prom"))
    ep.handle(req("/metrics", loopback=True))
    assert reviewer.asked == []
    ep.handle(req("/metrics", loopback=False, token="prom"))
    assert reviewer.asked == [("Bearer prom", "/metrics")]


def test_a_401_challenges_for_a_bearer_token(rbac: tuple[Endpoint, Reviewer]) -> None:
    ep, _ = rbac
    response = ep.handle(req("/metrics", loopback=False))
    assert ("WWW-Authenticate", 'Bearer realm="gpushare"') in response.headers
    assert ep.handle(req("/metrics", loopback=False, token="nobody")).headers == ()


def test_open_access_serves_metrics_to_anyone_but_status_stays_on_the_node() -> None:
    ep = endpoint("open")
    try:
        assert ep.handle(req("/metrics", loopback=False)).body == METRICS
        assert ep.handle(req("/status", loopback=False)).code == 403
    finally:
        ep.close()


def test_rbac_without_a_reviewer_refuses_clients_off_the_node() -> None:
    ep = endpoint("rbac", None)
    try:
        assert ep.handle(req("/metrics", loopback=False, token="prom")).code == 403
        assert ep.handle(req("/metrics", loopback=True)).code == 200
    finally:
        ep.close()


def test_each_path_answers_over_a_real_socket() -> None:
    reports = [TickReport()]
    ep = endpoint("rbac", Reviewer(), reports)
    ep.start()
    host, _, port = ep.address.rpartition(":")

    def get(path: str) -> tuple[int, str, bytes]:
        conn = http.client.HTTPConnection(host, int(port), timeout=5)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, resp.getheader("Content-Type") or "", resp.read()
        finally:
            conn.close()

    try:
        assert get("/metrics") == (200, "text/plain; version=0.0.4; charset=utf-8", METRICS)
        assert get("/healthz") == (503, "text/plain", b"no reconcile pass yet\n")
        reports[0] = TickReport(at=95.0, passes=7)
        assert get("/healthz") == (200, "text/plain", b"ok: last pass 5.0s ago\n")
        code, ctype, body = get("/status?verbose=1")
        assert (code, ctype, json.loads(body)) == (
            200,
            "application/json",
            {"node": "n1", "pods": ["team-a/secret-pod"]},
        )
        assert get("/nothing")[0] == 404
    finally:
        ep.close()
