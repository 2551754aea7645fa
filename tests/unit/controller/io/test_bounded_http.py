"""The bounded server, for real on loopback: slow clients, big heads and floods cost a bounded share.

127.0.0.1 stands for the node's own clients and 127.0.0.2.. for clients off the node (``is_local``),
so every rule about addresses runs without root or a second machine.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from controller.core import endpoint_rules as rules
from controller.io.bounded_http import BoundedHttpServer, Request, Response, parse_head, plain
from gpushare.errors import ConfigError

CAP = 12  # 8 slots for clients off the node, 2 per address, 4 kept for the node's own
READ_S = 0.6


def local_only(host: str) -> bool:
    return host == "127.0.0.1"


def echo(request: Request) -> Response:
    if request.path == "/slow":
        time.sleep(0.3)
    return plain(200, f"{request.path} for {request.client} loopback={request.loopback}")


@pytest.fixture
def server() -> Iterator[BoundedHttpServer]:
    srv = BoundedHttpServer(
        "127.0.0.1", 0, echo, max_connections=CAP, read_timeout_s=READ_S, write_timeout_s=2.0, is_local=local_only
    )
    srv.start()
    try:
        yield srv
    finally:
        srv.close()


def connect(srv: BoundedHttpServer, source: str = "127.0.0.1") -> socket.socket:
    host, _, port = srv.address.rpartition(":")
    sock = socket.socket()
    sock.settimeout(5)
    sock.bind((source, 0))
    sock.connect((host, int(port)))
    return sock


def read_all(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def get(srv: BoundedHttpServer, path: str = "/x", source: str = "127.0.0.1") -> bytes:
    with connect(srv, source) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: agent\r\n\r\n".encode())
        return read_all(sock)


def wait_for(what: str, ok: object, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not ok():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_a_request_is_answered_and_the_connection_closed(server: BoundedHttpServer) -> None:
    answer = get(server, "/metrics?x=1")
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"Connection: close\r\n" in answer
    assert answer.endswith(b"/metrics for 127.0.0.1 loopback=True\n")
    assert get(server, "/m", source="127.0.0.2").endswith(b"loopback=False\n")


def test_a_slow_client_is_cut_at_the_read_deadline_however_it_trickles(server: BoundedHttpServer) -> None:
    with connect(server) as sock:
        started = time.monotonic()
        sock.sendall(b"GET /metrics HTTP/1.1\r\n")
        # A byte every 0.1 s: each read alone is quick, the head as a whole never ends.
        answer = b""
        try:
            while time.monotonic() - started < READ_S * 4:
                sock.sendall(b"X")
                time.sleep(0.1)
        except OSError:
            pass
        sock.settimeout(2)
        with contextlib.suppress(OSError):
            answer = read_all(sock)
        took = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert took < READ_S * 4, took
    wait_for("the slot freed", lambda: server.busy() == 0)


def test_a_head_over_the_bound_is_refused_without_reading_on(server: BoundedHttpServer) -> None:
    with connect(server) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nX-Big: " + b"a" * (server.max_head_bytes + 10))
        assert read_all(sock).startswith(b"HTTP/1.1 431")


def test_only_get_without_a_body(server: BoundedHttpServer) -> None:
    with connect(server) as sock:
        sock.sendall(b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
        answer = read_all(sock)
    assert answer.startswith(b"HTTP/1.1 405") and b"Allow: GET\r\n" in answer
    with connect(server) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello")
        assert read_all(sock).startswith(b"HTTP/1.1 400")


def _hold(srv: BoundedHttpServer, source: str, n: int) -> list[socket.socket]:
    """``n`` silent connections from ``source``: each takes a slot until the read deadline."""
    return [connect(srv, source) for _ in range(n)]


def test_clients_off_the_node_leave_the_nodes_slots_and_the_excess_is_refused_at_once(
    server: BoundedHttpServer,
) -> None:
    per_address = rules.per_address_limit(CAP)
    remote = CAP - rules.LOOPBACK_RESERVE
    held: list[socket.socket] = []
    try:
        for i in range(remote // per_address):
            held += _hold(server, f"127.0.0.{i + 2}", per_address)
        wait_for("every remote slot held", lambda: server.busy() == remote)
        # Another client off the node: answered 503 and closed at once, not queued.
        started = time.monotonic()
        refused = get(server, "/metrics", source="127.0.0.99")
        assert refused.startswith(b"HTTP/1.1 503") and b"Retry-After: 1\r\n" in refused
        assert time.monotonic() - started < 0.5
        # The node's own clients (kubelet's probe, gpushare status) still get in.
        assert get(server, "/healthz").startswith(b"HTTP/1.1 200")
        assert server.refused() >= 1
    finally:
        for sock in held:
            sock.close()
    wait_for("every slot freed", lambda: server.busy() == 0)
    assert get(server, "/metrics", source="127.0.0.99").startswith(b"HTTP/1.1 200")


def test_one_address_holds_only_its_share(server: BoundedHttpServer) -> None:
    per_address = rules.per_address_limit(CAP)
    held = _hold(server, "127.0.0.2", per_address)
    try:
        wait_for("the address's share held", lambda: server.busy() == per_address)
        assert get(server, source="127.0.0.2").startswith(b"HTTP/1.1 503")
        assert get(server, source="127.0.0.3").startswith(b"HTTP/1.1 200")
    finally:
        for sock in held:
            sock.close()


def test_even_the_node_is_refused_promptly_when_every_slot_is_taken(server: BoundedHttpServer) -> None:
    held = _hold(server, "127.0.0.1", CAP)
    try:
        wait_for("every slot held", lambda: server.busy() == CAP)
        started = time.monotonic()
        assert get(server, "/healthz").startswith(b"HTTP/1.1 503")
        assert time.monotonic() - started < 0.5
    finally:
        for sock in held:
            sock.close()


def test_a_flood_starts_no_thread_beyond_the_workers(server: BoundedHttpServer) -> None:
    threads_before = threading.active_count()
    held: list[socket.socket] = []
    try:
        for i in range(60):
            with contextlib.suppress(OSError):
                held.append(connect(server, f"127.0.1.{i % 30 + 1}"))
        wait_for("the server took what it may", lambda: server.busy() == CAP - rules.LOOPBACK_RESERVE)
        assert threading.active_count() == threads_before
        assert server.busy() <= CAP
    finally:
        for sock in held:
            sock.close()


def test_close_cuts_open_connections_and_joins_promptly() -> None:
    srv = BoundedHttpServer("127.0.0.1", 0, echo, max_connections=CAP, read_timeout_s=30.0, is_local=local_only)
    srv.start()
    held = _hold(srv, "127.0.0.1", 3)
    wait_for("3 slots held", lambda: srv.busy() == 3)
    started = time.monotonic()
    srv.close(timeout_s=5.0)
    assert time.monotonic() - started < 2.0
    names = {t.name for t in threading.enumerate()}
    assert not any(n.startswith("gpushare-agent-http") for n in names), names
    for sock in held:
        sock.close()


def test_the_cap_must_leave_most_file_descriptors_to_the_agent() -> None:
    with pytest.raises(ConfigError) as err:
        BoundedHttpServer("127.0.0.1", 0, echo, max_connections=32, fd_limit=lambda: 100)
    assert "metrics.maxConnections is 32" in str(err.value) and "100" in str(err.value)
    BoundedHttpServer("127.0.0.1", 0, echo, max_connections=32, fd_limit=lambda: None).close()


def test_an_ipv6_wildcard_is_reached_at_127_0_0_1_as_loopback() -> None:
    if not socket.has_ipv6:
        pytest.fail("this machine's Python has no IPv6; the dual-stack listener cannot be checked")
    srv = BoundedHttpServer("[::]", 0, echo, max_connections=CAP)
    srv.start()
    try:
        port = int(srv.address.rpartition(":")[2])
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(b"GET /h HTTP/1.1\r\n\r\n")
            assert read_all(sock).endswith(b"loopback=True\n")
    finally:
        srv.close()


@pytest.mark.parametrize(
    ("head", "code"),
    [
        (b"GET / HTTP/1.1\r\n\r\n", None),
        (b"GET /metrics?x=1 HTTP/1.0\n\n", None),
        (b"", 400),
        (b"GARBAGE\r\n\r\n", 400),
        (b"GET / HTTP/2.0\r\n\r\n", 400),
        (b"GET  / HTTP/1.1\r\n\r\n", 400),
        (b"GET metrics HTTP/1.1\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\n folded\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nBad Name: x\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nAuthorization: Bearer a\r\nauthorization: Bearer b\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
        (b"DELETE / HTTP/1.1\r\n\r\n", 405),
        (b"GET / HTTP/1.1\r\n" + b"X: y\r\n" * 65 + b"\r\n", 431),
    ],
)
def test_parse_head(head: bytes, code: int | None) -> None:
    parsed = parse_head(head, client="10.0.0.1")
    if code is None:
        assert isinstance(parsed, Request) and parsed.client == "10.0.0.1"
    else:
        assert isinstance(parsed, Response) and parsed.code == code


def test_parse_head_reads_headers_in_lower_case() -> None:
    parsed = parse_head(b"GET /metrics?a=b HTTP/1.1\r\nAuthorization:  Bearer t \r\nHost: h\r\n\r\n")
    assert isinstance(parsed, Request)
    assert (parsed.path, parsed.query) == ("/metrics", "a=b")
    assert parsed.headers == {"authorization": "Bearer t", "host": "h"}
