"""The agent's HTTP endpoint: ``/metrics`` (Prometheus text), ``/healthz``, ``/status`` (loopback only).

Everything served is read from immutable values (the loop's last ``TickReport``, the metrics
registry): a scrape never waits for the loop, and the loop never waits for a scrape. The
series are listed in ``controller/metrics/exposition.py``.
"""

from __future__ import annotations

import http.server
import ipaddress
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from controller.metrics.exposition import CONTENT_TYPE
from controller.report import TickReport
from gpushare.log import kv

log = logging.getLogger(__name__)


def is_healthy(report: TickReport, now: float, max_age_s: float) -> tuple[bool, str]:
    """``/healthz``: a reconcile pass completed within ``max_age_s``."""
    if report.at == 0.0:
        return False, "no reconcile pass yet"
    age = now - report.at
    if age > max_age_s:
        return False, f"last reconcile pass {age:.0f}s ago (limit {max_age_s:.0f}s)"
    return True, f"ok: last pass {age:.1f}s ago"


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Endpoint:
    """``ThreadingHTTPServer`` in one thread (``gpushare-agent-http``); ``close()`` stops it."""

    def __init__(
        self,
        listen: str,
        *,
        report: Callable[[], TickReport],
        status: Callable[[], dict[str, Any]],
        metrics: Callable[[], bytes],
        max_age_s: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        host, _, port = listen.rpartition(":")

        class Handler(http.server.BaseHTTPRequestHandler):
            timeout = 5.0  # a client that stalls mid-request is dropped: every wait is bounded

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._send(200, metrics(), CONTENT_TYPE)
                elif path == "/healthz":
                    ok, why = is_healthy(report(), clock(), max_age_s)
                    self._send(200 if ok else 503, (why + "\n").encode(), "text/plain")
                elif path == "/status":
                    # Pod names and mappings: only for the node itself (gpushare status), never the network.
                    if not _is_loopback(self.client_address[0]):
                        self._send(403, b"gpushare: /status is served to loopback clients only\n", "text/plain")
                        return
                    self._send(200, json.dumps(status(), default=str).encode(), "application/json")
                else:
                    self._send(404, b"gpushare: /metrics, /healthz or /status\n", "text/plain")

            def _send(self, code: int, body: bytes, ctype: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("http " + format, *args)

        self._server = http.server.ThreadingHTTPServer((host or "0.0.0.0", int(port)), Handler)
        self._server.daemon_threads = True
        addr = self._server.server_address
        self.address = f"{addr[0]!s}:{addr[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.2}, name="gpushare-agent-http"
        )

    def start(self) -> None:
        self._thread.start()
        log.info("metrics endpoint listening", extra=kv(address=self.address))

    def close(self, timeout_s: float = 5.0) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(timeout_s)
        self._server.server_close()


__all__ = ["Endpoint", "is_healthy"]
