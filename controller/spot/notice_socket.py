"""gpukmod's client, stood in for by a unix socket: a benchmark and test seam, never for production.

gpukmod cannot load on every development host, yet an owner's return must enter the agent
where the kernel's notice enters it, or a benchmark measures something other than the agent.
``gpushare agent --kmod-socket PATH`` (or ``GPUSHARE_KMOD_SOCKET``) makes the ``KmodBridge``
connect to a peer listening on PATH (``bench/spot_return.py``) instead of opening netlink.
``NoticeSocketClient`` has the methods of ``gpukmod.KmodClient`` that the bridge uses
(``KmodLike``), so everything above it runs unchanged: the notice thread, the return path,
the pass.

The line protocol, ASCII, one message per line:

    peer  -> agent    notice <pidns>                 a kernel notice: a GPU ioctl from that pid namespace
    agent -> peer     <verb> <t_ns> [<pidns> ...]    each command the real client would send:
                                                     flush (once, on connect, as open_flushed does),
                                                     register, add, delete, detect, undetect, release

``t_ns`` is the agent's CLOCK_MONOTONIC in nanoseconds when it sent the command: on the same
host the peer reads the same clock, so it can time a notice to the owner's ``release`` exactly.
Commands are not acknowledged: the peer cannot refuse one and the agent never waits for it, so
the peer's own speed stays out of what it measures. Ids are checked as the real client checks
them (``gpukmod.protocol``). A peer that goes away is a module that went away: the next
command raises ``KmodError`` ECONNREFUSED, the bridge drops the client and looks again later.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import socket
import threading
import time
from collections.abc import Callable

from gpukmod import KmodError
from gpukmod.protocol import Command, CommandRejected, Verb, validate_ids
from gpushare.log import kv

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 2.0
SEND_TIMEOUT_S = 1.0  # a peer that stops reading costs one timeout, then the bridge drops it
MAX_LINE = 256  # a notice line is ~30 bytes; longer is garbage, not something to buffer
_READ_CHUNK = 4096


class NoticeSocketClient:
    """Connects to ``path`` at construction (KmodError ECONNREFUSED when nobody listens)."""

    def __init__(self, path: str, *, clock_ns: Callable[[], int] = time.monotonic_ns) -> None:
        self.path = path
        self._clock_ns = clock_ns
        self._send_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = threading.Event()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(CONNECT_TIMEOUT_S)
        try:
            sock.connect(path)
        except OSError as exc:
            sock.close()
            detail = f"no peer listening on the test socket {path}: {exc.strerror or exc}"
            raise KmodError(errno.ECONNREFUSED, "open", detail) from exc
        sock.settimeout(SEND_TIMEOUT_S)
        self._sock = sock
        try:
            self._send(Verb.FLUSH, ())  # what open_flushed does first
        except KmodError:
            sock.close()
            raise

    # -- commands (KmodLike) ---------------------------------------------------------------------

    def register(self) -> None:
        self._send(Verb.REGISTER, ())

    def add(self, *ids: int) -> None:
        self._send(Verb.ADD, ids)

    def delete(self, *ids: int) -> None:
        self._send(Verb.DELETE, ids)

    def detect(self, *ids: int) -> None:
        self._send(Verb.DETECT, ids)

    def undetect(self, *ids: int) -> None:
        self._send(Verb.UNDETECT, ids)

    def release(self, *ids: int) -> None:
        self._send(Verb.RELEASE, ids)

    def _send(self, verb: Verb, ids: tuple[int, ...]) -> None:
        op = verb.value.lower()
        try:
            validate_ids(verb, ids)
        except CommandRejected as exc:
            raise KmodError(exc.errno, op, exc.reason) from exc
        # Stamped as late as possible: the time the peer reads is when the module would have acted.
        with self._send_lock:
            line = " ".join([op, str(self._clock_ns()), *(str(i) for i in Command(verb, ids).ids)]) + "\n"
            try:
                self._sock.sendall(line.encode("ascii"))
            except OSError as exc:  # EPIPE, ECONNRESET, a timeout, or closed by us
                raise KmodError(errno.ECONNREFUSED, op, f"the test socket {self.path} is gone: {exc}") from exc

    # -- notices ---------------------------------------------------------------------------------

    def start_notices(self, callback: Callable[[int], None], *, name: str = "gpushare-kmod-notices") -> None:
        """Call ``callback(pidns)`` for each ``notice`` line on a named thread until ``close`` or EOF."""
        if self._thread is not None:
            raise KmodError(errno.EBUSY, "notices", "a notice thread is already running for this client")
        self._thread = threading.Thread(target=self._read, args=(callback,), name=name, daemon=True)
        self._thread.start()

    def _read(self, callback: Callable[[int], None]) -> None:
        lines = _Lines(self.path)
        while not self._closed.is_set():
            try:
                chunk = self._sock.recv(_READ_CHUNK)
            except TimeoutError:
                continue
            except OSError as exc:
                if not self._closed.is_set():
                    log.warning("test kmod socket: read failed", extra=kv(path=self.path, error=str(exc)))
                return
            if not chunk:
                if not self._closed.is_set():
                    log.warning("test kmod socket: the peer closed it", extra=kv(path=self.path))
                return
            for line in lines.feed(chunk):
                self._dispatch(line, callback)

    def _dispatch(self, line: bytes, callback: Callable[[int], None]) -> None:
        pidns = parse_notice(line)
        if pidns is None:
            text = line[:MAX_LINE].decode("ascii", "replace")
            log.warning("test kmod socket: not a notice, ignored", extra=kv(path=self.path, line=text))
            return
        try:
            callback(pidns)
        except Exception:  # a broken callback must not end the reader, as with the real client
            log.exception("test kmod socket: notice callback failed for pidns %d", pidns)

    # -- lifetime --------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the notice thread and close the socket (idempotent)."""
        if self._closed.is_set():
            return
        self._closed.set()
        with contextlib.suppress(OSError):  # the peer closed it already
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the reader's recv at once
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(SEND_TIMEOUT_S + 1.0)
        self._sock.close()


class _Lines:
    """Whole lines out of a byte stream; a line over ``MAX_LINE`` is dropped whole, with a warning."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._buf = b""
        self._dropping = False  # inside a line already found too long: skip to its end

    def feed(self, chunk: bytes) -> list[bytes]:
        *lines, self._buf = (self._buf + chunk).split(b"\n")
        out = []
        for line in lines:
            if self._dropping:
                self._dropping = False  # the end of the line dropped before
            elif len(line) > MAX_LINE:
                self._too_long(len(line))
            else:
                out.append(line)
        if len(self._buf) > MAX_LINE and not self._dropping:
            self._too_long(len(self._buf))
            self._dropping = True
        if self._dropping:
            self._buf = b""
        return out

    def _too_long(self, size: int) -> None:
        log.warning("test kmod socket: line too long, dropped", extra=kv(path=self._path, bytes=size, limit=MAX_LINE))


def parse_notice(line: bytes) -> int | None:
    """The pid namespace of a ``notice <pidns>`` line, or None for anything else."""
    parts = line.strip().split()
    if len(parts) != 2 or parts[0] != b"notice" or not parts[1].isdigit():
        return None
    pidns = int(parts[1])
    try:
        validate_ids(Verb.RELEASE, (pidns,))  # an id the module could have sent
    except CommandRejected:
        return None
    return pidns


def notice_socket_factory(path: str) -> Callable[[int], NoticeSocketClient]:
    """A ``KmodBridge`` client factory that ignores the netlink unit and connects to ``path``."""

    def open_socket(unit: int) -> NoticeSocketClient:
        return NoticeSocketClient(path)

    return open_socket


__all__ = ["NoticeSocketClient", "notice_socket_factory", "parse_notice"]
