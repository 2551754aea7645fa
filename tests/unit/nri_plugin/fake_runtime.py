"""A byte-level fake of containerd's NRI side for the stub's unit tests.

It frames everything itself with ``struct`` (independently of ``nri_plugin.transport``), so the
stub's mux and ttrpc are checked against the wire format, not against themselves. The real
runtime is exercised by the integration tests under tests/integration/.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import struct
import tempfile
import threading
from dataclasses import dataclass, field

from nri_plugin._pb import nri_pb2, ttrpc_pb2

MUX = struct.Struct(">II")
TTRPC = struct.Struct(">IIBB")
PLUGIN = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME = "nri.pkg.api.v1alpha1.Runtime"
# containerd 1.7's writes: ttrpc's 4096-byte buffer goes out first (header + start of the data),
# the rest as one more mux write, which its mux refuses over 16 MiB.
WRITE_BUFFER = 4096
MAX_MUX_WRITE = 16 << 20


def runtime_frames(conn_id: int, message: bytes, max_write: int = MAX_MUX_WRITE) -> tuple[list[bytes], bool]:
    """The mux frames containerd 1.7 writes for one ttrpc message, and whether it finishes.

    A message whose rest is over ``max_write`` gets only its first frame out, as in containerd."""
    frames = [MUX.pack(conn_id, len(message[:WRITE_BUFFER])) + message[:WRITE_BUFFER]]
    rest = message[WRITE_BUFFER:]
    if len(rest) > max_write:
        return frames, False
    if rest:
        frames.append(MUX.pack(conn_id, len(rest)) + rest)
    return frames, True


@dataclass
class Reply:
    stream_id: int
    code: int
    message: str
    payload: bytes


@dataclass
class FakeRuntime:
    """Listens on a Unix socket in a short temp dir; serves one plugin connection at a time."""

    pods: list[nri_pb2.PodSandbox] = field(default_factory=list)
    containers: list[nri_pb2.Container] = field(default_factory=list)
    register_status: tuple[int, str] = (0, "")
    silent: bool = False  # never answer RegisterPlugin
    sync_pieces: int = 1  # Synchronize in this many requests, more=true on all but the last (NRI v0.8+)
    drop_before_sync: bool = False  # close the connection after Configure, as 2.x does when it cannot split
    max_first_frame_seen: int = 0
    frames_seen: list[tuple[int, int]] = field(default_factory=list)  # (conn, length)

    def __post_init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="gs-nri-", dir="/tmp")
        self.path = os.path.join(self.dir, "nri.sock")
        self.registered = threading.Event()
        self.registration: nri_pb2.RegisterPluginRequest | None = None
        self.configure_reply: nri_pb2.ConfigureResponse | None = None
        self.ready = threading.Event()
        self._listener: socket.socket | None = None
        self._conn: socket.socket | None = None
        self._buf = {1: bytearray(), 2: bytearray()}
        self._replies: dict[int, Reply] = {}
        self._cv = threading.Condition()
        self._next_sid = 1
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.accepts = 0

    # --- lifecycle ---
    def listen(self) -> None:
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.path)
        self._listener.listen(4)
        self._listener.settimeout(0.1)
        self._stop.clear()
        self._thread = threading.Thread(target=self._serve, name="gpushare-test-fakeruntime", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Close listener and connection (like containerd exiting)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def drop_connection(self) -> None:
        conn = self._conn
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    # --- wire ---
    def send_raw(self, data: bytes) -> None:
        assert self._conn is not None
        self._conn.sendall(data)

    def _send_ttrpc(self, conn_id: int, sid: int, mtype: int, data: bytes) -> None:
        frames, finished = runtime_frames(conn_id, TTRPC.pack(len(data), sid, mtype, 0) + data)
        for frame in frames:
            self.send_raw(frame)
        if not finished:
            raise OSError(errno.EMSGSIZE, "message too long")

    def call(
        self,
        method: str,
        msg: object,
        timeout_s: float = 3.0,
        *,
        service: str = PLUGIN,
        sid: int | None = None,
        timeout_nano: int = 2_000_000_000,
    ) -> Reply:
        with self._cv:
            if sid is None:
                sid = self._next_sid
                self._next_sid += 2
        payload = msg.SerializeToString() if hasattr(msg, "SerializeToString") else bytes(msg)  # type: ignore[arg-type]
        req = ttrpc_pb2.Request(service=service, method=method, payload=payload, timeout_nano=timeout_nano)
        self._send_ttrpc(1, sid, 1, req.SerializeToString())
        with self._cv:
            if not self._cv.wait_for(lambda: sid in self._replies, timeout_s):
                raise TimeoutError(f"no reply to {method} (stream {sid})")
            return self._replies.pop(sid)

    def serve_socket(self, conn: socket.socket) -> None:
        """Pre-connected mode: speak over one end of a socketpair instead of listening."""
        self._stop.clear()
        self._thread = threading.Thread(target=self._serve_conn, args=(conn,), name="gpushare-test-fakeruntime")
        self._thread.daemon = True
        self._thread.start()

    def _serve(self) -> None:
        assert self._listener is not None
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._serve_conn(conn)

    def _serve_conn(self, conn: socket.socket) -> None:
        self.accepts += 1
        self._conn = conn
        self._buf = {1: bytearray(), 2: bytearray()}
        self._next_sid = 1
        self.ready.clear()
        self.registered.clear()
        conn.settimeout(0.1)
        try:
            self._read(conn)
        finally:
            conn.close()
            self._conn = None

    def _read(self, conn: socket.socket) -> None:
        pending = b""
        while not self._stop.is_set():
            try:
                data = conn.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            if not data:
                return
            pending += data
            while len(pending) >= 8:
                cid, n = MUX.unpack_from(pending)
                if len(pending) < 8 + n:
                    break
                chunk, pending = pending[8 : 8 + n], pending[8 + n :]
                buf = self._buf[cid]
                if not buf:
                    self.max_first_frame_seen = max(self.max_first_frame_seen, n)
                self.frames_seen.append((cid, n))
                buf += chunk
                while len(buf) >= 10:
                    length, sid, mtype, _ = TTRPC.unpack_from(buf)
                    if len(buf) < 10 + length:
                        break
                    body = bytes(buf[10 : 10 + length])
                    del buf[: 10 + length]
                    self._on_message(cid, sid, mtype, body)

    def _on_message(self, cid: int, sid: int, mtype: int, body: bytes) -> None:
        if cid == 2 and mtype == 1:  # plugin → runtime request
            req = ttrpc_pb2.Request()
            req.ParseFromString(body)
            if req.method == "RegisterPlugin":
                if self.silent:
                    return
                self.registration = nri_pb2.RegisterPluginRequest.FromString(req.payload)
                code, text = self.register_status
                resp = ttrpc_pb2.Response()
                if code:
                    resp.status.code, resp.status.message = code, text
                    self._send_ttrpc(2, sid, 2, resp.SerializeToString())
                    return
                # Like containerd: Configure goes out before the RegisterPlugin reply.
                threading.Thread(target=self._handshake, args=(sid,), name="gpushare-test-handshake").start()
            return
        if cid == 1 and mtype == 2:
            resp = ttrpc_pb2.Response()
            resp.ParseFromString(body)
            with self._cv:
                self._replies[sid] = Reply(sid, resp.status.code, resp.status.message, resp.payload)
                self._cv.notify_all()

    def _handshake(self, register_sid: int) -> None:
        try:
            cfg = self.call("Configure", nri_pb2.ConfigureRequest(runtime_name="fake", runtime_version="0"))
            self._send_ttrpc(2, register_sid, 2, b"")
            self.configure_reply = nri_pb2.ConfigureResponse.FromString(cfg.payload)
            self.registered.set()
            if self.drop_before_sync:
                self.drop_connection()
                return
            sync = None
            for req in self.sync_requests():
                sync = self.call("Synchronize", req)
            if sync is not None and sync.code == 0:
                self.ready.set()
        except (TimeoutError, OSError, AssertionError):
            return

    def sync_requests(self) -> list[nri_pb2.SynchronizeRequest]:
        """The handshake's Synchronize: all pods in the first piece, the containers spread over all."""
        n = self.sync_pieces
        per = -(-len(self.containers) // n) if self.containers else 0
        return [
            nri_pb2.SynchronizeRequest(
                pods=self.pods if i == 0 else [], containers=self.containers[i * per : (i + 1) * per], more=i < n - 1
            )
            for i in range(n)
        ]

    def cleanup(self) -> None:
        self.stop()
        with contextlib.suppress(OSError):
            os.rmdir(self.dir)
