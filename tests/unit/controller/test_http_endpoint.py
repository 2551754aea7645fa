"""The agent's endpoint, served for real on a loopback port: /metrics, /healthz, /status."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator

import pytest

from controller.http_endpoint import Endpoint, _is_loopback, is_healthy
from controller.report import TickReport


def test_healthz_needs_a_recent_pass() -> None:
    assert is_healthy(TickReport(), now=100.0, max_age_s=30)[0] is False
    assert is_healthy(TickReport(at=90.0), now=100.0, max_age_s=30) == (True, "ok: last pass 10.0s ago")
    ok, why = is_healthy(TickReport(at=10.0), now=100.0, max_age_s=30)
    assert not ok and "90s ago" in why


def test_status_is_for_loopback_clients_only() -> None:
    assert _is_loopback("127.0.0.1") and _is_loopback("::1")
    assert not _is_loopback("10.0.0.7") and not _is_loopback("not-an-address")


@pytest.fixture
def endpoint() -> Iterator[Endpoint]:
    report = [TickReport()]
    ep = Endpoint(
        "127.0.0.1:0",
        report=lambda: report[0],
        status=lambda: {"node": "n1", "passes": report[0].passes},
        metrics=lambda: b"gpushare_leader 1.0\n",
        max_age_s=30.0,
        clock=lambda: 100.0,
    )
    ep.start()
    ep.report = report  # type: ignore[attr-defined]  # lets a test replace the report served
    try:
        yield ep
    finally:
        ep.close()


def get(ep: Endpoint, path: str) -> tuple[int, str, bytes]:
    host, _, port = ep.address.rpartition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.getheader("Content-Type") or "", resp.read()
    finally:
        conn.close()


def test_each_path_answers_from_the_values_it_is_given(endpoint: Endpoint) -> None:
    assert get(endpoint, "/metrics") == (200, "text/plain; version=0.0.4; charset=utf-8", b"gpushare_leader 1.0\n")
    assert get(endpoint, "/healthz") == (503, "text/plain", b"no reconcile pass yet\n")
    endpoint.report[0] = TickReport(at=95.0, passes=7)  # type: ignore[attr-defined]
    assert get(endpoint, "/healthz") == (200, "text/plain", b"ok: last pass 5.0s ago\n")
    code, ctype, body = get(endpoint, "/status?verbose=1")
    assert (code, ctype, json.loads(body)) == (200, "application/json", {"node": "n1", "passes": 7})
    assert get(endpoint, "/nothing")[0] == 404
