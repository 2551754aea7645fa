"""The NRI connection multiplexer: logical connections over one Unix stream socket.

Wire format (containerd/nri pkg/net/multiplex; docs/nri.md): every frame is an 8-byte big-endian header — connection id
(uint32, 0 reserved), payload length (uint32) — followed by that many bytes of the logical
connection's byte stream. Frames are stream chunks, not message boundaries.

Overflow rule for what we send: containerd reads each logical connection through a 4096-byte
buffer and fails the whole connection ("cannot allocate memory") when a frame that starts a
message does not fit it. So every message handed to ``Mux.send`` goes out as a first frame of
at most ``FIRST_FRAME_MAX`` (4096) bytes and the remainder in frames of at most
``MAX_SEND_FRAME`` (4 MiB, what NRI v0.8+ itself writes). What we receive is accepted up to
``MAX_RECV_FRAME`` (16 MiB, the largest frame NRI v0.6.1 writes); a larger frame, or a frame
for connection 0, is a ``ProtocolError`` and ends the connection.

This module knows bytes and connection ids only; it knows nothing of ttrpc or NRI.
"""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import struct
import threading
from collections.abc import Callable

from nri_plugin.errors import ConnectionClosed, DeadlineExceeded, ProtocolError, TransportError

log = logging.getLogger(__name__)

HEADER = struct.Struct(">II")
HEADER_SIZE = HEADER.size  # 8
FIRST_FRAME_MAX = 4096
MAX_SEND_FRAME = 4 << 20
MAX_RECV_FRAME = 16 << 20

PLUGIN_SERVICE_CONN = 1  # plugin is the ttrpc server (runtime calls Configure, events)
RUNTIME_SERVICE_CONN = 2  # runtime is the ttrpc server (plugin calls RegisterPlugin)

_READ_CHUNK = 64 * 1024
_POLL_S = 0.2  # the reader re-checks for close this often


def encode_frames(conn_id: int, message: bytes) -> list[bytes]:
    """Frame one message for containerd: first frame <= 4096 bytes, the rest <= 4 MiB each."""
    if not 0 < conn_id <= 0xFFFFFFFF:
        raise ProtocolError(f"gpushare: mux connection id {conn_id} is out of range (1..2^32-1)")
    frames: list[bytes] = []
    view = memoryview(message)
    first = view[:FIRST_FRAME_MAX]
    frames.append(HEADER.pack(conn_id, len(first)) + bytes(first))
    offset = len(first)
    while offset < len(view):
        chunk = view[offset : offset + MAX_SEND_FRAME]
        frames.append(HEADER.pack(conn_id, len(chunk)) + bytes(chunk))
        offset += len(chunk)
    return frames


class MuxDecoder:
    """Incremental frame decoder: feed any chunking of the byte stream, get (conn id, payload)."""

    def __init__(self, max_frame: int = MAX_RECV_FRAME) -> None:
        self._buf = bytearray()
        self._max_frame = max_frame

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        self._buf += data
        out: list[tuple[int, bytes]] = []
        while len(self._buf) >= HEADER_SIZE:
            conn_id, length = HEADER.unpack_from(self._buf)
            if conn_id == 0:
                raise ProtocolError("gpushare: mux frame for reserved connection id 0")
            if length > self._max_frame:
                raise ProtocolError(
                    f"gpushare: mux frame of {length} bytes on connection {conn_id} exceeds {self._max_frame}"
                )
            if len(self._buf) < HEADER_SIZE + length:
                break
            out.append((conn_id, bytes(self._buf[HEADER_SIZE : HEADER_SIZE + length])))
            del self._buf[: HEADER_SIZE + length]
        return out

    @property
    def pending(self) -> int:
        """Bytes received but not yet part of a complete frame."""
        return len(self._buf)


OnData = Callable[[bytes], None]
OnClose = Callable[[TransportError], None]


class Mux:
    """One socket, many logical connections; one blocking reader thread.

    ``attach(conn_id, on_data)`` before ``start``; ``on_data`` runs on the reader thread and must
    be quick (our ttrpc endpoints only decode and enqueue). ``on_close`` is called exactly once,
    from the reader thread or from ``close``, with the reason.
    """

    def __init__(self, sock: socket.socket, *, send_timeout_s: float = 5.0, thread_name: str = "gpushare-nri-reader"):
        self._sock = sock
        self._sock.settimeout(send_timeout_s)  # bounds sendall; the reader polls with select
        self._send_lock = threading.Lock()
        self._handlers: dict[int, OnData] = {}
        self._decoder = MuxDecoder()
        self._closed = threading.Event()
        self._close_lock = threading.Lock()
        self._on_close: OnClose | None = None
        self._close_reason: TransportError | None = None
        self._thread = threading.Thread(target=self._read_loop, name=thread_name, daemon=True)
        self._started = False

    def attach(self, conn_id: int, on_data: OnData) -> None:
        self._handlers[conn_id] = on_data

    def start(self, on_close: OnClose | None = None) -> None:
        self._on_close = on_close
        self._started = True
        self._thread.start()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    @property
    def close_reason(self) -> TransportError | None:
        return self._close_reason

    def send(self, conn_id: int, message: bytes) -> None:
        """Send one whole message on a logical connection (framed per the overflow rule)."""
        frames = encode_frames(conn_id, message)
        if self._closed.is_set():
            raise ConnectionClosed("gpushare: NRI connection is closed")
        with self._send_lock:
            try:
                for frame in frames:
                    self._sock.sendall(frame)
            except TimeoutError as exc:
                self._shutdown(DeadlineExceeded("gpushare: sending to the NRI socket timed out"))
                raise DeadlineExceeded("gpushare: sending to the NRI socket timed out") from exc
            except OSError as exc:
                err = ConnectionClosed(f"gpushare: NRI socket send failed: {exc}")
                self._shutdown(err)
                raise err from exc

    def _read_loop(self) -> None:
        reason: TransportError = ConnectionClosed("gpushare: NRI socket closed by the runtime (EOF)")
        try:
            while not self._closed.is_set():
                ready, _, _ = select.select([self._sock], [], [], _POLL_S)
                if not ready:
                    continue
                data = self._sock.recv(_READ_CHUNK)
                if not data:
                    break
                for conn_id, payload in self._decoder.feed(data):
                    handler = self._handlers.get(conn_id)
                    if handler is None:
                        # Go drops frames for connections nobody opened; so do we.
                        log.debug("mux: dropping %d bytes for unopened connection %d", len(payload), conn_id)
                        continue
                    handler(payload)
        except TransportError as exc:
            reason = exc
        except (OSError, ValueError) as exc:
            # ValueError: select on a socket closed under us by close().
            reason = ConnectionClosed(f"gpushare: NRI socket read failed: {exc}")
        except Exception as exc:  # top of a thread loop: log and end this connection
            log.exception("mux: reader crashed")
            reason = ProtocolError(f"gpushare: NRI reader crashed: {exc!r}")
        self._shutdown(reason)

    def _shutdown(self, reason: TransportError) -> None:
        with self._close_lock:
            if self._closed.is_set():
                return
            self._close_reason = reason
            self._closed.set()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        if self._on_close is not None:
            self._on_close(reason)

    def close(self) -> None:
        """Idempotent; joins the reader unless called from it."""
        self._shutdown(ConnectionClosed("gpushare: NRI connection closed by the plugin"))
        if self._started and threading.current_thread() is not self._thread:
            self._thread.join(timeout=5.0)
        with contextlib.suppress(OSError):
            self._sock.close()
