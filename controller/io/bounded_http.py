"""A small HTTP/1.1 server whose every resource is bounded: the transport of the agent's endpoint.

``http.server.ThreadingHTTPServer``, which the endpoint used before, starts a thread per connection
without a cap, times out each read on its own (a client that sends a byte every few seconds keeps
its thread and its file descriptor for ever), and reads up to 100 header lines of 64 KiB. With
enough such clients the agent ran out of file descriptors, and then spot could not read the GPU
metrics or a pod's cgroup to kill a borrower. Here:

- ``max_connections`` worker threads, started once, serve one connection each; the accept thread
  hands a connection to a worker only while one is free (``endpoint_rules.admits``: clients off
  the node leave a few slots to loopback clients, and one address holds only a share), and
  answers every other connection at once with 503 and closes it: nothing waits in a queue;
- the request head must arrive whole within ``read_timeout_s`` of the accept, in at most
  ``max_head_bytes``; no request body is read; one request per connection (``Connection: close``);
- the response must be taken within ``write_timeout_s``;
- ``max_connections`` must fit a share of the process's open-files limit (``fd_budget_problem``);
- ``secure`` (the endpoint's TLS) runs in the worker, within the same read deadline: a slow
  handshake holds a worker slot as a slow request head does, never the accept thread.

``parse_head`` reads a request head into a ``Request``, or the ``Response`` that refuses it.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import http
import logging
import queue
import resource
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from controller.core import endpoint_rules as rules
from gpushare.errors import ConfigError
from gpushare.log import kv

log = logging.getLogger(__name__)

READ_TIMEOUT_S = 5.0
WRITE_TIMEOUT_S = 10.0
MAX_HEAD_BYTES = 16 * 1024
MAX_HEADERS = 64
BACKLOG = 64
# How often the accept thread looks at the stop flag, and how long it rests when accept() fails for
# want of descriptors (the kernel keeps the connection queued meanwhile).
_POLL_S = 0.2
_ACCEPT_REST_S = 0.05
# One WARNING per this many seconds while connections are being refused, with their count.
_REFUSAL_LOG_S = 60.0
# A refused connection is kept this long (at most this many at once) after its 503, so the request
# the client sent meanwhile is read before the close: closing on unread bytes resets the connection,
# and the client would see a reset instead of the 503.
_LINGER_S = 0.25
_LINGER_MAX = 32
_TOKEN_CHARS = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: str
    headers: Mapping[str, str]  # names in lower case
    client: str
    loopback: bool


@dataclass(frozen=True)
class Response:
    code: int
    body: bytes = b""
    content_type: str = "text/plain"
    headers: tuple[tuple[str, str], ...] = field(default=())

    def encode(self) -> bytes:
        try:
            phrase = http.HTTPStatus(self.code).phrase
        except ValueError:
            phrase = "Unknown"
        lines = [
            f"HTTP/1.1 {self.code} {phrase}",
            f"Content-Type: {self.content_type}",
            f"Content-Length: {len(self.body)}",
            "Connection: close",
            *(f"{name}: {value}" for name, value in self.headers),
        ]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + self.body


def plain(code: int, text: str, headers: tuple[tuple[str, str], ...] = ()) -> Response:
    return Response(code, (text.rstrip("\n") + "\n").encode(), "text/plain", headers)


# Given an admitted connection, whether its client is local, and the read deadline (monotonic):
# the socket to read the request from (the same one, or a TLS one over it), a Response to write on
# the plain connection instead, or None to drop it (having closed whatever it opened).
Secure = Callable[[socket.socket, bool, float], socket.socket | Response | None]


def _head_end(buf: bytes | bytearray, start: int = 0) -> int:
    """The index just past the blank line that ends a request head, or -1."""
    ends = [(i, n) for i, n in ((buf.find(b"\r\n\r\n", start), 4), (buf.find(b"\n\n", start), 2)) if i >= 0]
    if not ends:
        return -1
    at, length = min(ends)
    return at + length


def parse_head(head: bytes, *, client: str = "", loopback: bool = False) -> Request | Response:
    """A request head (request line and header lines, up to the blank line) read into a ``Request``;
    anything this endpoint does not serve becomes the ``Response`` that says so. Never raises."""
    text = head.decode("latin-1").replace("\r\n", "\n")
    lines = text.split("\n")
    while lines and lines[-1] == "":
        lines.pop()
    if not lines:
        return plain(400, "gpushare: an empty request")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1.") or not parts[0]:
        return plain(400, "gpushare: not an HTTP/1.x request line")
    method, target, _ = parts
    if len(lines) - 1 > MAX_HEADERS:
        return plain(431, f"gpushare: more than {MAX_HEADERS} header lines")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon or not name or not set(name) <= _TOKEN_CHARS:
            return plain(400, "gpushare: a header line that is not 'name: value'")
        name = name.lower()
        if name in headers and name == "authorization":
            return plain(400, "gpushare: more than one Authorization header")
        headers[name] = value.strip(" \t")
    if method != "GET":
        return plain(405, "gpushare: only GET is served here", (("Allow", "GET"),))
    if not target.startswith("/"):
        return plain(400, "gpushare: the request target must be a path")
    if headers.get("content-length", "0").strip() not in ("", "0") or "transfer-encoding" in headers:
        return plain(400, "gpushare: no request body is read here")
    path, _, query = target.partition("?")
    return Request(method, path, query, headers, client, loopback)


def fd_soft_limit() -> int | None:
    """The process's open-files limit (soft), None when unlimited."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def _socket_for(host: str, port: int) -> socket.socket:
    host = host.strip("[]") or "0.0.0.0"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6 and host == "::":
            # Dual stack: 127.0.0.1 reaches a wildcard IPv6 endpoint as ::ffff:127.0.0.1.
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind((host, port))
        sock.listen(BACKLOG)
        sock.settimeout(_POLL_S)
    except BaseException:
        sock.close()
        raise
    return sock


def _drain_and_close(conn: socket.socket) -> None:
    """Read what the client sent (never blocking), then close: no unread bytes, no reset."""
    with contextlib.suppress(OSError):
        for _ in range(16):
            if not conn.recv(4096):
                break
    with contextlib.suppress(OSError):
        conn.close()


class BoundedHttpServer:
    """Serve ``handler`` on ``host:port`` within the bounds of the module docstring.

    ``start()`` starts the accept thread (``name``) and the workers (``name-<i>``); ``close()``
    stops them, cutting connections still open, within a bounded time. ``is_local`` tells the
    node's own clients (loopback) from the others; the unit tests stand 127.0.0.2 for a remote one.
    """

    def __init__(
        self,
        host: str,
        port: int,
        handler: Callable[[Request], Response],
        *,
        max_connections: int,
        read_timeout_s: float = READ_TIMEOUT_S,
        write_timeout_s: float = WRITE_TIMEOUT_S,
        max_head_bytes: int = MAX_HEAD_BYTES,
        name: str = "gpushare-agent-http",
        fd_limit: Callable[[], int | None] = fd_soft_limit,
        is_local: Callable[[str], bool] = rules.is_loopback,
        secure: Secure | None = None,
    ) -> None:
        if problem := rules.fd_budget_problem(max_connections, fd_limit()):
            raise ConfigError([problem], "the agent's endpoint")
        if max_connections <= rules.LOOPBACK_RESERVE:
            raise ValueError(f"max_connections must exceed the loopback reserve of {rules.LOOPBACK_RESERVE}")
        self._handler = handler
        self._is_local = is_local
        self._secure = secure
        self.max_connections = max_connections
        self.read_timeout_s = read_timeout_s
        self.write_timeout_s = write_timeout_s
        self.max_head_bytes = max_head_bytes
        self._sock = _socket_for(host, port)
        addr = self._sock.getsockname()
        self.address = f"[{addr[0]}]:{addr[1]}" if self._sock.family == socket.AF_INET6 else f"{addr[0]}:{addr[1]}"
        self._lock = threading.Lock()
        self._busy = 0
        self._by_address: dict[str, int] = {}
        self._open: set[socket.socket] = set()
        self._refused = 0
        self._refused_logged_at = -_REFUSAL_LOG_S
        self._work: queue.SimpleQueue[tuple[socket.socket, str, bool, float] | None] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._refusal = plain(
            503, "gpushare: the endpoint has no free connection for this client; try again", (("Retry-After", "1"),)
        ).encode()
        self._lingering: collections.deque[tuple[float, socket.socket]] = collections.deque()
        self._accept_thread = threading.Thread(target=self._accept_loop, name=name, daemon=True)
        self._workers = [
            threading.Thread(target=self._worker, name=f"{name}-{i}", daemon=True) for i in range(max_connections)
        ]

    # -- accepting ------------------------------------------------------------------------------------------

    def start(self) -> None:
        for worker in self._workers:
            worker.start()
        self._accept_thread.start()

    def busy(self) -> int:
        with self._lock:
            return self._busy

    def refused(self) -> int:
        """Connections refused since the start, because every slot they could take was busy."""
        with self._lock:
            return self._refused

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            self._close_lingering(time.monotonic())
            try:
                conn, addr = self._sock.accept()
            except TimeoutError:
                continue
            except OSError as exc:
                if self._stop.is_set():
                    break
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self._note_refusal(f"accept failed: {exc.strerror}")
                    self._stop.wait(_ACCEPT_REST_S)
                continue
            try:
                self._admit(conn, str(addr[0]))
            except Exception:  # top of the thread's loop: the next connection is served regardless
                log.exception("endpoint: a connection could not be admitted")
                with contextlib.suppress(OSError):
                    conn.close()
        self._close_lingering(float("inf"))

    def _admit(self, conn: socket.socket, client: str) -> None:
        loopback = self._is_local(client)
        with self._lock:
            taken = self._by_address.get(client, 0)
            ok = rules.admits(capacity=self.max_connections, busy=self._busy, from_address=taken, loopback=loopback)
            if ok:
                self._busy += 1
                self._by_address[client] = taken + 1
                self._open.add(conn)
        if ok:
            self._work.put((conn, client, loopback, time.monotonic()))
            return
        # Answered here without blocking, then closed by this thread a moment later: a refused
        # client costs one descriptor for that moment, and learns at once to come back later.
        conn.setblocking(False)
        with contextlib.suppress(OSError):
            conn.send(self._refusal)
            conn.shutdown(socket.SHUT_WR)
        self._lingering.append((time.monotonic() + _LINGER_S, conn))
        if len(self._lingering) > _LINGER_MAX:
            _drain_and_close(self._lingering.popleft()[1])
        self._note_refusal("every slot this client may take is busy")

    def _close_lingering(self, now: float) -> None:
        while self._lingering and self._lingering[0][0] <= now:
            _drain_and_close(self._lingering.popleft()[1])

    def _note_refusal(self, why: str) -> None:
        now = time.monotonic()
        with self._lock:
            self._refused += 1
            due = now - self._refused_logged_at >= _REFUSAL_LOG_S
            if due:
                self._refused_logged_at = now
            count = self._refused
        if due:
            log.warning(
                "endpoint refusing connections",
                extra=kv(why=why, refused_total=count, max_connections=self.max_connections),
            )

    # -- serving ----------------------------------------------------------------------------------------

    def _worker(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                return
            conn, client, loopback, accepted = item
            served: socket.socket | None = conn
            try:
                served = self._secured(conn, loopback, accepted)
                if served is not None:
                    self._serve(served, client, loopback, accepted)
            except Exception:  # top of the thread's loop: the worker serves the next connection
                log.exception("endpoint: serving a connection failed", extra=kv(client=client))
            finally:
                with contextlib.suppress(OSError):
                    conn.close()
                if served is not None and served is not conn:
                    with contextlib.suppress(OSError):
                        served.close()
                with self._lock:
                    self._open.discard(conn)
                    if served is not None:
                        self._open.discard(served)
                    self._busy -= 1
                    left = self._by_address.get(client, 1) - 1
                    if left:
                        self._by_address[client] = left
                    else:
                        self._by_address.pop(client, None)

    def _secured(self, conn: socket.socket, loopback: bool, accepted: float) -> socket.socket | None:
        """``secure``'s socket for the connection (kept where ``close()`` cuts it), or None once its
        refusal is written or it was dropped."""
        if self._secure is None:
            return conn
        result = self._secure(conn, loopback, accepted + self.read_timeout_s)
        if isinstance(result, Response):
            self._write(conn, result)
            return None
        if result is not None and result is not conn:
            with self._lock:
                self._open.discard(conn)
                self._open.add(result)
        return result

    def _serve(self, conn: socket.socket, client: str, loopback: bool, accepted: float) -> None:
        head = self._read_head(conn, accepted + self.read_timeout_s)
        if head is None:
            return
        if isinstance(head, Response):
            self._write(conn, head)
            return
        request = parse_head(head, client=client, loopback=loopback)
        if isinstance(request, Request):
            try:
                response = self._handler(request)
            except Exception:
                log.exception("endpoint: the handler failed", extra=kv(path=request.path))
                response = plain(500, "gpushare: the agent failed to answer; see its log")
        else:
            response = request
        self._write(conn, response)

    def _read_head(self, conn: socket.socket, deadline: float) -> bytes | Response | None:
        """The request head, the Response refusing it, or None when the client went away."""
        buf = bytearray()
        while (end := _head_end(buf, max(0, len(buf) - 4096 - 3))) < 0:
            if len(buf) > self.max_head_bytes:
                return plain(431, f"gpushare: a request head is at most {self.max_head_bytes} bytes")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return plain(408, f"gpushare: a request must arrive within {self.read_timeout_s:g} s")
            conn.settimeout(remaining)
            try:
                chunk = conn.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return None
            if not chunk:
                return None
            buf += chunk
        if end > self.max_head_bytes:
            return plain(431, f"gpushare: a request head is at most {self.max_head_bytes} bytes")
        return bytes(buf[:end])

    def _write(self, conn: socket.socket, response: Response) -> None:
        # sendall's timeout bounds the whole response, not each send (Python 3.5+).
        conn.settimeout(self.write_timeout_s)
        try:
            conn.sendall(response.encode())
            conn.shutdown(socket.SHUT_WR)
        except OSError as exc:
            log.debug("endpoint: a client did not take its answer", extra=kv(error=str(exc)))

    # -- stopping ---------------------------------------------------------------------------------------

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop accepting, cut the connections still open, and join every thread (bounded)."""
        deadline = time.monotonic() + timeout_s
        self._stop.set()
        if self._accept_thread.is_alive():
            self._accept_thread.join(max(0.0, deadline - time.monotonic()))
        self._sock.close()
        with self._lock:
            still_open = list(self._open)
        for conn in still_open:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        for _ in self._workers:
            self._work.put(None)
        for worker in self._workers:
            if worker.is_alive():
                worker.join(max(0.0, deadline - time.monotonic()))


__all__ = [
    "MAX_HEAD_BYTES",
    "READ_TIMEOUT_S",
    "WRITE_TIMEOUT_S",
    "BoundedHttpServer",
    "Request",
    "Response",
    "fd_soft_limit",
    "parse_head",
    "plain",
]
