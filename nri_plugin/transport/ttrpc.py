"""ttrpc over one logical mux connection: bytes and method names only.

Framing (containerd/ttrpc; docs/nri.md): a 10-byte big-endian header — data length (uint32), stream id
(uint32), type (1 request, 2 response, 3 data), flags — then a protobuf ``ttrpc.Request`` or
``ttrpc.Response``. Clients use odd, strictly increasing stream ids starting at 1; the server
answers on the same id. We never send more than 4 MiB of data (``MAX_MESSAGE``, what containerd
reads). We accept up to ``MAX_RECV_MESSAGE`` (16 MiB + 4086 bytes), the most any supported
containerd can send (below, and docs/nri.md); a header announcing more is a ``ProtocolError``
at once, before anything of that size is buffered.

``TtrpcServer`` answers unknown services/methods with UNIMPLEMENTED (12), which NRI v0.12
runtimes need to fall back to ``StateChange``. Handlers run on a small pool and send their own
reply; a watchdog thread answers DEADLINE_EXCEEDED for any call still running shortly before the
caller's deadline (``timeout_nano``), so a slow handler fails one call instead of the runtime
disconnecting the plugin.
"""

from __future__ import annotations

import enum
import heapq
import logging
import struct
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from google.protobuf.message import DecodeError
from google.protobuf.message import Message as _ProtoMessage

from nri_plugin._pb import ttrpc_pb2
from nri_plugin.errors import ConnectionClosed, DeadlineExceeded, ProtocolError, RpcStatusError, TransportError

log = logging.getLogger(__name__)

HEADER = struct.Struct(">IIBB")
HEADER_SIZE = HEADER.size  # 10
MAX_MESSAGE = 4 << 20

# containerd 1.7 (NRI v0.6.1 over ttrpc 1.2.4/1.2.5) checks no size when it sends. Its ttrpc writes
# the header and the data through a 4096-byte buffer: the header and the first 4086 bytes of data go
# to the mux as one write, the rest as a second, and NRI v0.6.1's mux fails a write over 16 MiB
# (EMSGSIZE). So 16 MiB + 4086 bytes of data is the largest message it can finish sending; a
# larger one stops after its first 4096 bytes. containerd 2.x (ttrpc 1.2.9) sends no message over
# 4 MiB and splits Synchronize to fit. Nothing larger can come from a supported runtime, and this
# is what one message can make a connection buffer.
RUNTIME_WRITE_BUFFER = 4096
RUNTIME_MAX_MUX_WRITE = 16 << 20
MAX_RECV_MESSAGE = RUNTIME_MAX_MUX_WRITE + RUNTIME_WRITE_BUFFER - HEADER_SIZE

_M = TypeVar("_M", bound=_ProtoMessage)

TYPE_REQUEST = 0x01
TYPE_RESPONSE = 0x02
TYPE_DATA = 0x03
_KNOWN_TYPES = (TYPE_REQUEST, TYPE_RESPONSE, TYPE_DATA)


class Code(enum.IntEnum):
    """gRPC status codes (google.rpc.Code numbering)."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14


@dataclass(frozen=True)
class Message:
    stream_id: int
    type: int
    flags: int
    data: bytes


def encode_message(stream_id: int, msg_type: int, data: bytes, flags: int = 0) -> bytes:
    if len(data) > MAX_MESSAGE:
        raise ProtocolError(f"gpushare: ttrpc message of {len(data)} bytes exceeds the 4 MiB limit")
    return HEADER.pack(len(data), stream_id, msg_type, flags) + data


class MessageDecoder:
    """Incremental decoder of ttrpc messages from one connection's byte stream."""

    def __init__(self, max_data: int = MAX_RECV_MESSAGE) -> None:
        self._buf = bytearray()
        self._max = max_data
        self._why = str(max_data)
        if max_data == MAX_RECV_MESSAGE:
            self._why += (
                ", the most a supported containerd can send (containerd 1.7 fails a larger send with "
                "'message too long' after its first 4096 bytes; docs/nri.md)"
            )

    def feed(self, data: bytes) -> list[Message]:
        self._buf += data
        out: list[Message] = []
        while len(self._buf) >= HEADER_SIZE:
            length, sid, msg_type, flags = HEADER.unpack_from(self._buf)
            if length > self._max:
                raise ProtocolError(f"gpushare: ttrpc message of {length} bytes (stream {sid}) exceeds {self._why}")
            if msg_type not in _KNOWN_TYPES:
                raise ProtocolError(f"gpushare: ttrpc message of unknown type {msg_type:#x} (stream {sid})")
            if len(self._buf) < HEADER_SIZE + length:
                break
            out.append(Message(sid, msg_type, flags, bytes(self._buf[HEADER_SIZE : HEADER_SIZE + length])))
            del self._buf[: HEADER_SIZE + length]
        return out


def _decode(msg: _M, data: bytes, what: str) -> _M:
    try:
        msg.ParseFromString(data)
    except (DecodeError, ValueError, RecursionError) as exc:
        raise ProtocolError(f"gpushare: undecodable ttrpc {what} ({exc})") from exc
    return msg


def decode_request(data: bytes) -> ttrpc_pb2.Request:
    return _decode(ttrpc_pb2.Request(), data, "request")


def decode_response(data: bytes) -> ttrpc_pb2.Response:
    return _decode(ttrpc_pb2.Response(), data, "response")


def encode_response(payload: bytes = b"", code: int = 0, message: str = "") -> bytes:
    resp = ttrpc_pb2.Response(payload=payload)
    if code:
        resp.status.code = code
        resp.status.message = message
    return resp.SerializeToString()


Send = Callable[[bytes], None]
# A handler takes the request payload and returns the response payload. It raises
# RpcStatusError (→ its code) or anything else (→ INTERNAL); what a refusal means is the caller's business.
Handler = Callable[[bytes], bytes]


class TtrpcClient:
    """Calls on one connection; responses arrive through ``feed`` (the mux reader thread)."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self._decoder = MessageDecoder()
        self._lock = threading.Lock()
        self._next_id = 1
        self._pending: dict[int, _Slot] = {}
        self._closed: TransportError | None = None

    def feed(self, data: bytes) -> None:
        for msg in self._decoder.feed(data):
            if msg.type != TYPE_RESPONSE:
                raise ProtocolError(f"gpushare: ttrpc client got message type {msg.type:#x} (stream {msg.stream_id})")
            with self._lock:
                slot = self._pending.pop(msg.stream_id, None)
            if slot is None:
                log.debug("ttrpc: dropping response for unknown stream %d", msg.stream_id)
                continue
            slot.data = msg.data
            slot.done.set()

    def call(self, service: str, method: str, payload: bytes, timeout_s: float) -> bytes:
        """One unary call; returns the response payload or raises a TransportError."""
        with self._lock:
            if self._closed is not None:
                raise ConnectionClosed(f"gpushare: {method}: {self._closed}")
            sid = self._next_id
            self._next_id += 2
            slot = _Slot()
            self._pending[sid] = slot
        req = ttrpc_pb2.Request(service=service, method=method, payload=payload, timeout_nano=int(timeout_s * 1e9))
        try:
            self._send(encode_message(sid, TYPE_REQUEST, req.SerializeToString()))
            if not slot.done.wait(timeout_s):
                raise DeadlineExceeded(f"gpushare: {service}/{method} got no answer within {timeout_s:.1f}s")
        finally:
            with self._lock:
                self._pending.pop(sid, None)
        if slot.error is not None:
            raise slot.error
        resp = decode_response(slot.data)
        if resp.HasField("status") and resp.status.code != 0:
            raise RpcStatusError(resp.status.code, resp.status.message, f"{service}/{method}")
        return resp.payload

    def fail_all(self, reason: TransportError) -> None:
        """Wake every waiting call with ``reason``; later calls fail at once."""
        with self._lock:
            self._closed = reason
            pending, self._pending = self._pending, {}
        for slot in pending.values():
            slot.error = ConnectionClosed(f"gpushare: connection lost while waiting: {reason}")
            slot.done.set()


class _Slot:
    __slots__ = ("data", "done", "error")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.data = b""
        self.error: TransportError | None = None


class _Call:
    """One request in flight; answered exactly once, by its handler or by the watchdog."""

    __slots__ = ("answered", "deadline", "method", "stream_id")

    def __init__(self, stream_id: int, method: str, deadline: float) -> None:
        self.stream_id = stream_id
        self.method = method
        self.deadline = deadline
        self.answered = False


class TtrpcServer:
    """Serves registered (service, method) pairs on one connection.

    ``feed`` runs on the mux reader: it decodes, validates stream ids, answers protocol-level
    errors (UNIMPLEMENTED, INVALID_ARGUMENT) at once and hands each call to the handler pool,
    whose thread sends the reply itself (one thread hop per call). A watchdog thread answers
    DEADLINE_EXCEEDED for a call still running ``deadline_margin_s`` before the caller's
    deadline; the late handler's result is then dropped.
    """

    def __init__(
        self,
        send: Send,
        handlers: Mapping[tuple[str, str], Handler],
        *,
        default_timeout_s: float = 2.0,
        deadline_margin_s: float = 0.25,
        workers: int = 2,
        name: str = "gpushare-nri",
    ) -> None:
        self._send = send
        self._handlers = dict(handlers)
        self._decoder = MessageDecoder()
        self._last_id = 0
        self._default_timeout_s = default_timeout_s
        self._margin_s = deadline_margin_s
        self._cv = threading.Condition()
        self._deadlines: list[tuple[float, int, _Call]] = []  # heap, guarded by _cv
        self._closed = False
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"{name}-handler")
        self._watchdog = threading.Thread(target=self._watch_loop, name=f"{name}-watchdog", daemon=True)
        self._watchdog.start()

    def feed(self, data: bytes) -> None:
        for msg in self._decoder.feed(data):
            if msg.type != TYPE_REQUEST:
                # Streaming data or a stray response: NRI uses unary calls only.
                raise ProtocolError(f"gpushare: ttrpc server got message type {msg.type:#x} (stream {msg.stream_id})")
            if msg.stream_id % 2 == 0 or msg.stream_id <= self._last_id:
                self._reply(
                    msg.stream_id,
                    encode_response(
                        code=Code.INVALID_ARGUMENT,
                        message=f"StreamID {msg.stream_id} must be odd and greater than {self._last_id}",
                    ),
                )
                continue
            self._last_id = msg.stream_id
            req = decode_request(msg.data)
            handler = self._handlers.get((req.service, req.method))
            if handler is None:
                known = {s for s, _ in self._handlers}
                text = f"method {req.method}" if req.service in known else f"service {req.service}"
                self._reply(msg.stream_id, encode_response(code=Code.UNIMPLEMENTED, message=text))
                continue
            timeout_s = req.timeout_nano / 1e9 if req.timeout_nano > 0 else self._default_timeout_s
            call = _Call(msg.stream_id, req.method, time.monotonic() + max(0.05, timeout_s - self._margin_s))
            with self._cv:
                if self._closed:
                    return
                heapq.heappush(self._deadlines, (call.deadline, call.stream_id, call))
                self._cv.notify()
            try:
                self._pool.submit(self._run, call, handler, req.payload)
            except RuntimeError:  # the pool was shut down by close() meanwhile
                return

    def _reply(self, stream_id: int, response: bytes) -> None:
        try:
            self._send(encode_message(stream_id, TYPE_RESPONSE, response))
        except ProtocolError as exc:  # our reply is too large: tell the caller instead
            refusal = encode_response(code=Code.RESOURCE_EXHAUSTED, message=str(exc))
            self._send(encode_message(stream_id, TYPE_RESPONSE, refusal))

    def _claim(self, call: _Call) -> bool:
        """True for the first of handler and watchdog to answer ``call``."""
        with self._cv:
            if call.answered:
                return False
            call.answered = True
            return True

    def _answer(self, call: _Call, response: bytes) -> None:
        try:
            self._reply(call.stream_id, response)
        except TransportError as exc:
            log.debug("ttrpc: reply to %s (stream %d) not sent: %s", call.method, call.stream_id, exc)

    def _run(self, call: _Call, handler: Handler, payload: bytes) -> None:
        response = self._invoke(call.method, handler, payload)
        if self._claim(call):
            self._answer(call, response)
        else:
            log.warning(
                "ttrpc: %s (stream %d) finished after its deadline; result dropped", call.method, call.stream_id
            )

    @staticmethod
    def _invoke(method: str, handler: Handler, payload: bytes) -> bytes:
        try:
            return encode_response(payload=handler(payload))
        except RpcStatusError as exc:
            return encode_response(code=exc.code, message=exc.status_message)
        except Exception as exc:  # top of a handler call: the caller gets INTERNAL, we keep serving
            log.exception("ttrpc: %s handler failed", method)
            return encode_response(code=Code.INTERNAL, message=f"gpushare: {method} failed: {exc!r}")

    def _watch_loop(self) -> None:
        while True:
            expired: list[_Call] = []
            with self._cv:
                if self._closed:
                    return
                now = time.monotonic()
                while self._deadlines and (self._deadlines[0][2].answered or self._deadlines[0][0] <= now):
                    _, _, call = heapq.heappop(self._deadlines)
                    if not call.answered:
                        call.answered = True
                        expired.append(call)
                if not expired:
                    wait_s = self._deadlines[0][0] - now if self._deadlines else None
                    self._cv.wait(wait_s)
                    continue
            for call in expired:
                log.error("ttrpc: %s handler ran past its deadline; answering DEADLINE_EXCEEDED", call.method)
                self._answer(
                    call,
                    encode_response(
                        code=Code.DEADLINE_EXCEEDED,
                        message=f"gpushare: {call.method} handler did not finish before the caller's deadline",
                    ),
                )

    def close(self) -> None:
        """Stop the watchdog and the handler pool; idempotent."""
        with self._cv:
            if self._closed:
                return
            self._closed = True
            self._cv.notify_all()
        if threading.current_thread() is not self._watchdog:
            self._watchdog.join(timeout=5.0)
        self._pool.shutdown(wait=True, cancel_futures=True)
