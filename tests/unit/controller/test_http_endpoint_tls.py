"""The agent's endpoint over TLS (``metrics.tls``): real sockets, real certificates made with ``openssl``.

127.0.0.1 stands for the node's own clients and 127.0.0.2 for a client off the node (``is_local``),
as in tests/unit/controller/io/test_bounded_http.py. The certificates come from a throw-away CA the
test makes: the server's names 127.0.0.1, a client's is signed by the same CA.
"""

from __future__ import annotations

import http.client
import os
import shutil
import socket
import ssl
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from controller.http_endpoint import Endpoint
from controller.report import TickReport
from gpushare.config import MetricsTlsConfig
from gpushare.errors import ConfigError
from tests.unit.controller.test_http_endpoint import METRICS, Reviewer

LOCAL = "127.0.0.1"
REMOTE = "127.0.0.2"


def _openssl(*args: str, cwd: Path) -> None:
    binary = shutil.which("openssl")
    if binary is None:
        pytest.fail("no openssl binary: these tests make their certificates with it (apt-get install openssl)")
    res = subprocess.run([binary, *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0, f"openssl {' '.join(args)}: {res.stderr}"


@dataclass(frozen=True)
class Pki:
    root: Path

    def path(self, name: str) -> str:
        return str(self.root / name)

    def issue(self, name: str, *, server: bool) -> None:
        """``name``.crt and ``name``.key, signed by the CA: a server certificate for 127.0.0.1, or a client's."""
        ext = self.root / f"{name}.ext"
        usage = "serverAuth" if server else "clientAuth"
        ext.write_text(f"extendedKeyUsage={usage}\n" + ("subjectAltName=IP:127.0.0.1\n" if server else ""))
        _openssl(*_NEW_KEY, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=self.root)
        _openssl(
            "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", "2", "-out", f"{name}.crt", "-extfile", ext.name, cwd=self.root,
        )  # fmt: skip


_NEW_KEY = ("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    root = tmp_path_factory.mktemp("pki")
    _openssl(
        *_NEW_KEY, "-x509", "-days", "2", "-keyout", "ca.key", "-out", "ca.crt", "-subj", "/CN=gpushare-test-ca",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=root,
    )  # fmt: skip
    pki = Pki(root)
    for name, server in (("server", True), ("renewed", True), ("prometheus", False)):
        pki.issue(name, server=server)
    return pki


def _tls(pki: Pki, tmp: Path, *, client_ca: bool = False) -> MetricsTlsConfig:
    """The server's pair copied where the endpoint reads it (a test may replace it there)."""
    for suffix in ("crt", "key"):
        shutil.copy(pki.path(f"server.{suffix}"), tmp / f"tls.{suffix}")
    return MetricsTlsConfig(
        cert_file=str(tmp / "tls.crt"),
        key_file=str(tmp / "tls.key"),
        client_ca_file=pki.path("ca.crt") if client_ca else "",
    )


def _endpoint(tls: MetricsTlsConfig, access: str = "rbac") -> Endpoint:
    return Endpoint(
        f"{LOCAL}:0",
        report=lambda: TickReport(at=99.0),
        status=lambda: {"node": "n1"},
        metrics=lambda: METRICS,
        clock=lambda: 100.0,
        access=access,
        authorize=Reviewer(),
        tls=tls,
        is_local=lambda address: address == LOCAL,
    )


@pytest.fixture
def served(pki: Pki, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Endpoint]:
    access, client_ca = getattr(request, "param", ("rbac", False))
    ep = _endpoint(_tls(pki, tmp_path, client_ca=client_ca), access)
    ep.start()
    try:
        yield ep
    finally:
        ep.close()


def _port(ep: Endpoint) -> int:
    return int(ep.address.rpartition(":")[2])


def _client_context(pki: Pki, *, cert: str | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=pki.path("ca.crt"))
    if cert:
        ctx.load_cert_chain(pki.path(f"{cert}.crt"), pki.path(f"{cert}.key"))
    return ctx


def get(
    ep: Endpoint,
    path: str,
    *,
    source: str = REMOTE,
    context: ssl.SSLContext | None = None,
    token: str | None = None,
) -> tuple[int, bytes]:
    """One GET from ``source`` (127.0.0.2: a client off the node), over TLS when given a ``context``."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    conn: http.client.HTTPConnection
    if context is None:
        conn = http.client.HTTPConnection(LOCAL, _port(ep), timeout=5, source_address=(source, 0))
    else:
        conn = http.client.HTTPSConnection(LOCAL, _port(ep), timeout=5, source_address=(source, 0), context=context)
    try:
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _peer_serial(ep: Endpoint, pki: Pki) -> int:
    with (
        socket.create_connection((LOCAL, _port(ep)), timeout=5, source_address=(REMOTE, 0)) as raw,
        _client_context(pki).wrap_socket(raw, server_hostname=LOCAL) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    pem = ssl.DER_cert_to_PEM_cert(der)
    res = subprocess.run(
        ["openssl", "x509", "-noout", "-serial"], input=pem, capture_output=True, text=True, timeout=30, check=True
    )
    return int(res.stdout.strip().partition("=")[2], 16)


def _serial(pki: Pki, name: str) -> int:
    res = subprocess.run(
        ["openssl", "x509", "-noout", "-serial", "-in", pki.path(f"{name}.crt")],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return int(res.stdout.strip().partition("=")[2], 16)


def test_rbac_over_tls_asks_clients_off_the_node_for_a_reviewed_token(served: Endpoint, pki: Pki) -> None:
    ctx = _client_context(pki)
    assert get(served, "/metrics", context=ctx, token="prom") == (200, METRICS)
    assert get(served, "/metrics", context=ctx)[0] == 401
    assert get(served, "/metrics", context=ctx, token="nobody")[0] == 403
    assert get(served, "/status", context=ctx, token="prom")[0] == 403  # /status stays the node's


@pytest.mark.parametrize("served", [("open", False)], indirect=True)
def test_open_access_over_tls_serves_anyone_who_speaks_it(served: Endpoint, pki: Pki) -> None:
    assert get(served, "/metrics", context=_client_context(pki)) == (200, METRICS)


def test_a_client_off_the_node_without_tls_is_told_to_use_https(served: Endpoint) -> None:
    code, body = get(served, "/metrics", token="prom")
    assert code == 400 and b"speaks TLS" in body and b"https://" in body
    assert METRICS not in body


def test_loopback_clients_keep_plain_http_and_may_speak_tls(served: Endpoint, pki: Pki) -> None:
    # kubelet's probes and `gpushare status` dial 127.0.0.1 without TLS.
    assert get(served, "/healthz", source=LOCAL) == (200, b"ok: last pass 1.0s ago\n")
    assert get(served, "/metrics", source=LOCAL) == (200, METRICS)
    assert get(served, "/metrics", source=LOCAL, context=_client_context(pki)) == (200, METRICS)


@pytest.mark.parametrize("served", [("rbac", True)], indirect=True)
def test_a_client_ca_asks_clients_off_the_node_for_a_certificate_it_signed(served: Endpoint, pki: Pki) -> None:
    with pytest.raises((ssl.SSLError, ConnectionError)):
        # TLS 1.3 reports the refused client certificate at the first read, TLS 1.2 in the handshake.
        get(served, "/metrics", context=_client_context(pki), token="prom")
    assert get(served, "/metrics", context=_client_context(pki, cert="prometheus"), token="prom") == (200, METRICS)
    # With a certificate, the token is still asked for: rbac decides who reads the metrics.
    assert get(served, "/metrics", context=_client_context(pki, cert="prometheus"))[0] == 401
    # The node itself is never asked for one.
    assert get(served, "/metrics", source=LOCAL, context=_client_context(pki)) == (200, METRICS)


def _replace(src: Path, dest: Path) -> None:
    """As a Secret volume swaps its files: the new content appears whole, under a new inode."""
    tmp = dest.with_name(f".{dest.name}.new")
    shutil.copy(src, tmp)
    os.replace(tmp, dest)


def test_a_renewed_certificate_is_served_to_new_connections(pki: Pki, tmp_path: Path) -> None:
    tls = _tls(pki, tmp_path)
    ep = _endpoint(tls)
    ep.start()
    try:
        assert _peer_serial(ep, pki) == _serial(pki, "server")
        _replace(pki.root / "renewed.key", Path(tls.key_file))
        _replace(pki.root / "renewed.crt", Path(tls.cert_file))
        assert _peer_serial(ep, pki) == _serial(pki, "renewed")
        assert ep.tls is not None and ep.tls.reloads == 1
        assert get(ep, "/metrics", context=_client_context(pki), token="prom") == (200, METRICS)
    finally:
        ep.close()


def test_a_renewal_that_cannot_be_loaded_keeps_the_last_good_certificate(
    pki: Pki, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tls = _tls(pki, tmp_path)
    ep = _endpoint(tls)
    ep.start()
    try:
        _replace(pki.root / "renewed.crt", Path(tls.cert_file))  # its key not there yet: a mismatched pair
        assert _peer_serial(ep, pki) == _serial(pki, "server")
        assert _peer_serial(ep, pki) == _serial(pki, "server")
        warnings = [r for r in caplog.records if "cannot be loaded" in r.getMessage()]
        assert len(warnings) == 1  # once per change, not once per connection
        _replace(pki.root / "renewed.key", Path(tls.key_file))
        assert _peer_serial(ep, pki) == _serial(pki, "renewed")
    finally:
        ep.close()


def _refusal(tls: MetricsTlsConfig) -> str:
    with pytest.raises(ConfigError) as err:
        _endpoint(tls)
    (problem,) = err.value.problems
    return problem


def test_files_that_cannot_be_used_refuse_the_start_naming_the_key(pki: Pki, tmp_path: Path) -> None:
    tls = _tls(pki, tmp_path, client_ca=True)
    missing_ca = MetricsTlsConfig(tls.cert_file, tls.key_file, str(tmp_path / "missing-ca.crt"))
    assert _refusal(missing_ca).startswith(f"metrics.tls.clientCAFile: {tmp_path / 'missing-ca.crt'}: ")
    Path(tls.cert_file).write_text("not a certificate\n")
    assert _refusal(tls).startswith(f"metrics.tls.certFile/keyFile: {tls.cert_file}, {tls.key_file}: ")


def test_a_handshake_that_never_finishes_is_cut_at_the_read_deadline(pki: Pki, tmp_path: Path) -> None:
    ep = Endpoint(
        f"{LOCAL}:0",
        report=TickReport,
        status=dict,
        metrics=lambda: METRICS,
        tls=_tls(pki, tmp_path),
        is_local=lambda address: address == LOCAL,
        read_timeout_s=0.5,
    )
    ep.start()
    try:
        with socket.create_connection((LOCAL, _port(ep)), timeout=30, source_address=(REMOTE, 0)) as raw:
            raw.sendall(b"\x16\x03\x01")  # the start of a ClientHello, and nothing more
            # The server closes it on its own, long before this client's 30 s would run out.
            assert raw.recv(1024) == b""
    finally:
        ep.close()
