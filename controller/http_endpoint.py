"""The agent's HTTP endpoint: ``/metrics`` (Prometheus text), ``/healthz``, ``/status``, and who gets each.

Everything served is read from immutable values (the loop's last ``TickReport``, the metrics
registry): a scrape never waits for the loop, and the loop never waits for a scrape. The
series are listed in ``controller/metrics/exposition.py``.

Who gets what (``controller/core/endpoint_rules.py``, docs/security.md): ``/healthz`` anyone;
``/status`` loopback clients only; ``/metrics``, which names tenants' pods, loopback clients and,
with ``metrics.access: rbac`` (the default), clients whose bearer token a TokenReview authenticates
and a SubjectAccessReview allows to get ``/metrics`` (``controller/io/access_reviews.py``); with
``open``, anyone. The server holding it all within bounds is ``controller/io/bounded_http.py``.

With ``metrics.tls`` (docs/metrics.md, "TLS") clients off the node must speak TLS, and with a client
CA show a certificate it signed; the files are read again when they change, which is how
cert-manager renews a certificate. Loopback clients may speak TLS or plain HTTP on the same port:
kubelet's probes, ``gpushare status`` and ``gpushare doctor`` reach the endpoint over plain HTTP on
127.0.0.1, and nothing of a loopback connection crosses the wire. A connection's first byte tells
the two apart: every TLS connection opens with a handshake record (type 22), no HTTP request does.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any

from controller.core import endpoint_rules as rules
from controller.core.endpoint_rules import Verdict
from controller.io.bounded_http import BoundedHttpServer, Request, Response, plain
from controller.metrics.exposition import CONTENT_TYPE
from controller.report import TickReport
from gpushare.config import METRICS_ACCESS_OPEN, METRICS_ACCESS_RBAC, MetricsConfig, MetricsTlsConfig
from gpushare.errors import ConfigError
from gpushare.log import kv

log = logging.getLogger(__name__)

Authorize = Callable[[str | None, str], Verdict]

# The first byte of every TLS connection: a record of content type handshake (RFC 8446, 5.1).
TLS_HANDSHAKE_RECORD = 0x16
_FileStamp = tuple[int, int, int, int]  # device, inode, mtime (ns), size: a replaced file reads differently


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


def _stamp(path: str) -> _FileStamp | None:
    try:
        st = os.stat(path)  # follows symlinks: a Secret volume swaps its files by moving a link
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)


def _context(tls: MetricsTlsConfig, *, verify_clients: bool) -> ssl.SSLContext:
    """A server context with the certificate and key; ``verify_clients``: a client certificate the
    client CA signed is required. ``ConfigError`` names the key whose file cannot be used."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(tls.cert_file, tls.key_file)
    except (OSError, ssl.SSLError) as exc:
        problem = f"{tls.cert_file}, {tls.key_file}: not a PEM certificate and its key ({exc})"
        raise ConfigError([f"metrics.tls.certFile/keyFile: {problem}"], "the agent's endpoint") from exc
    if verify_clients:
        try:
            ctx.load_verify_locations(cafile=tls.client_ca_file)
        except (OSError, ssl.SSLError) as exc:
            problem = f"{tls.client_ca_file}: not a PEM CA certificate ({exc})"
            raise ConfigError([f"metrics.tls.clientCAFile: {problem}"], "the agent's endpoint") from exc
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


class TlsFiles:
    """The endpoint's TLS contexts, made again from ``metrics.tls``'s files whenever one of them changes.

    ``contexts()`` gives (for clients off the node, for loopback clients); the loopback one never asks
    for a client certificate. A change that cannot be loaded (a key that does not match yet, a file
    half written) keeps the last good contexts and says so once per change; the first load, at
    start, raises ``ConfigError`` instead, naming the key.
    """

    def __init__(self, tls: MetricsTlsConfig) -> None:
        self.tls = tls
        self._paths = tuple(p for p in (tls.cert_file, tls.key_file, tls.client_ca_file) if p)
        self._lock = threading.Lock()
        self._loaded = self._stamps()
        self._remote, self._local = self._load()
        self._failed: tuple[_FileStamp | None, ...] | None = None
        self.reloads = 0

    def _stamps(self) -> tuple[_FileStamp | None, ...]:
        return tuple(_stamp(p) for p in self._paths)

    def _load(self) -> tuple[ssl.SSLContext, ssl.SSLContext]:
        remote = _context(self.tls, verify_clients=bool(self.tls.client_ca_file))
        local = _context(self.tls, verify_clients=False) if self.tls.client_ca_file else remote
        return remote, local

    def contexts(self) -> tuple[ssl.SSLContext, ssl.SSLContext]:
        """(for clients off the node, for loopback clients), loaded again first if a file changed."""
        stamps = self._stamps()  # a few stat calls per connection: cheaper than any handshake
        with self._lock:
            if stamps not in (self._loaded, self._failed):
                try:
                    self._remote, self._local = self._load()
                except ConfigError as exc:
                    self._failed = stamps
                    log.warning(
                        "metrics endpoint: the changed TLS files cannot be loaded; serving the previous certificate",
                        extra=kv(error="; ".join(exc.problems)),
                    )
                else:
                    self._loaded, self._failed = stamps, None
                    self.reloads += 1
                    log.info("metrics endpoint: TLS files changed; new connections get the new certificate")
            return self._remote, self._local


class Endpoint:
    """The bounded server with the endpoint's routes; ``start()``, then ``close()`` stops it.

    ``access`` and ``authorize`` decide ``/metrics`` for clients off the node: ``rbac`` asks
    ``authorize(authorization header, path)`` (without one, such clients are refused). ``tls``
    with a certificate: clients off the node speak TLS (see the module docstring).
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
        tls: MetricsTlsConfig | None = None,
        **bounds: Any,
    ) -> None:
        self._report = report
        self._status = status
        self._metrics = metrics
        self._max_age_s = max_age_s
        self._clock = clock
        self.access = access
        self._authorize = authorize or _no_reviewer
        self.tls = TlsFiles(tls) if tls is not None and tls.enabled else None
        host, _, port = listen.rpartition(":")
        secure = self._secure if self.tls is not None else None
        self._server = BoundedHttpServer(
            host, int(port), self.handle, max_connections=max_connections, secure=secure, **bounds
        )
        self.address = self._server.address

    def _secure(self, conn: socket.socket, loopback: bool, deadline: float) -> socket.socket | Response | None:
        """The connection to read the request from: ``conn`` (a loopback client's plain HTTP), the TLS
        connection over it, a ``Response`` refusing a client off the node that does not speak TLS, or
        None when the client left or its handshake failed (whatever was opened is closed)."""
        assert self.tls is not None
        try:
            conn.settimeout(max(0.001, deadline - time.monotonic()))
            first = conn.recv(1, socket.MSG_PEEK)
        except TimeoutError:
            return conn  # nothing sent in time: the request reader answers 408 at once
        except OSError:
            return None
        if not first:
            return None
        if first[0] != TLS_HANDSHAKE_RECORD:
            if loopback:
                return conn
            return plain(400, "gpushare: this endpoint speaks TLS to clients off the node (metrics.tls): use https://")
        remote, local = self.tls.contexts()
        tls_conn = (local if loopback else remote).wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
        try:
            tls_conn.settimeout(max(0.001, deadline - time.monotonic()))
            tls_conn.do_handshake()  # bounded as a whole by the timeout (CPython keeps one deadline)
        except OSError as exc:  # ssl.SSLError and timeouts are OSErrors
            log.debug("metrics endpoint: a TLS handshake failed", extra=kv(error=str(exc), loopback=loopback))
            with contextlib.suppress(OSError):
                tls_conn.close()
            return None
        return tls_conn

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
        tls = self.tls.tls if self.tls is not None else None
        log.info(
            "metrics endpoint listening",
            extra=kv(
                address=self.address,
                access=self.access,
                max_connections=self._server.max_connections,
                tls=tls is not None,
                client_certs=bool(tls and tls.client_ca_file),
            ),
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


__all__ = ["TLS_HANDSHAKE_RECORD", "Endpoint", "TlsFiles", "is_healthy"]
