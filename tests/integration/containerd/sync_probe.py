"""A throwaway NRI plugin that measures the Synchronize containerd sends to a newly connected plugin.

It reads the ttrpc headers of containerd's requests as they arrive, before any size limit of
ours applies, so it also sees the announced length of a message containerd fails to finish
sending (containerd 1.7 sends the first 4096 bytes before its mux refuses the rest). The tests
use it to bring a node's Synchronize to an exact size and to show what that size was.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from dataclasses import dataclass

from localcluster.containerd import Containerd
from nri_plugin._pb import nri_pb2
from nri_plugin.errors import TransportError
from nri_plugin.transport.mux import PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN, Mux
from nri_plugin.transport.ttrpc import (
    TYPE_REQUEST,
    TYPE_RESPONSE,
    MessageDecoder,
    TtrpcClient,
    decode_request,
    encode_message,
    encode_response,
)

PLUGIN = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME = "nri.pkg.api.v1alpha1.Runtime"
PROBE_NAME = "syncprobe"
# What containerd (1.7 and 2.x alike) logs when a newly connected plugin's Synchronize fails.
SYNC_FAILED = "failed to synchronize plugin"
_TTRPC_HEADER = struct.Struct(">IIBB")


@dataclass(frozen=True)
class SyncSize:
    """The Synchronize requests containerd started to send, as their ttrpc headers announced them."""

    lengths: tuple[int, ...]  # ttrpc data length of each piece, in order
    complete: bool  # every piece arrived whole and the last one said more=false

    @property
    def total(self) -> int:
        return sum(self.lengths)


class _RequestHeaders:
    """Announced lengths of the requests on one ttrpc byte stream, read as the headers arrive."""

    def __init__(self) -> None:
        self.lengths: list[int] = []
        self._header = bytearray()
        self._skip = 0

    def feed(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            if self._skip:
                n = min(self._skip, len(view))
                self._skip -= n
                view = view[n:]
                continue
            need = _TTRPC_HEADER.size - len(self._header)
            self._header += view[:need]
            view = view[need:]
            if len(self._header) == _TTRPC_HEADER.size:
                length, _, msg_type, _ = _TTRPC_HEADER.unpack(self._header)
                if msg_type == TYPE_REQUEST:
                    self.lengths.append(length)
                self._skip = length
                self._header.clear()


def measure_sync(containerd: Containerd, timeout_s: float = 30.0) -> SyncSize:
    """Connect as plugin ``99-syncprobe``, take the Synchronize, disconnect.

    The probe has no size limit of its own (up to 64 MiB), so what it measures does not depend
    on the plugin under test. It returns once containerd is done with this connection: it added
    the probe (the sync went through), closed the connection, or logged that the sync failed."""
    added_before = containerd.nri_plugin_registrations(PROBE_NAME)
    log_mark = len(containerd.log_text())
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(5.0)
    sock.connect(containerd.nri_socket)
    mux = Mux(sock, thread_name="gpushare-test-syncprobe")
    headers = _RequestHeaders()
    requests = MessageDecoder(max_data=64 << 20)
    last_piece = threading.Event()
    closed = threading.Event()

    def answer(method: str, payload: bytes) -> bytes:
        if method == "Configure":
            # Only RemoveContainer: the probe must not be asked about the test's containers.
            return nri_pb2.ConfigureResponse(events=1 << (nri_pb2.REMOVE_CONTAINER - 1)).SerializeToString()
        if method == "Synchronize":
            more = nri_pb2.SynchronizeRequest.FromString(payload).more
            if not more:
                last_piece.set()
            return nri_pb2.SynchronizeResponse(more=more).SerializeToString()
        return b""

    def plugin_conn(data: bytes) -> None:
        headers.feed(data)
        for msg in requests.feed(data):
            req = decode_request(msg.data)
            reply = encode_response(payload=answer(req.method, req.payload))
            mux.send(PLUGIN_SERVICE_CONN, encode_message(msg.stream_id, TYPE_RESPONSE, reply))

    client = TtrpcClient(lambda b: mux.send(RUNTIME_SERVICE_CONN, b))

    def on_close(reason: TransportError) -> None:
        client.fail_all(reason)
        closed.set()

    mux.attach(PLUGIN_SERVICE_CONN, plugin_conn)
    mux.attach(RUNTIME_SERVICE_CONN, client.feed)
    mux.start(on_close=on_close)
    try:
        register = nri_pb2.RegisterPluginRequest(plugin_name=PROBE_NAME, plugin_idx="99")
        client.call(RUNTIME, "RegisterPlugin", register.SerializeToString(), 10.0)
        deadline = time.monotonic() + timeout_s
        while not closed.is_set():
            if last_piece.is_set() and containerd.nri_plugin_registrations(PROBE_NAME) > added_before:
                break
            if SYNC_FAILED in containerd.log_text()[log_mark:]:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"syncprobe: containerd neither finished nor dropped the Synchronize in {timeout_s} s"
                )
            time.sleep(0.05)
        complete = last_piece.is_set() and not closed.is_set() and SYNC_FAILED not in containerd.log_text()[log_mark:]
    finally:
        mux.close()
    # The first request on the plugin's connection is Configure; the rest are Synchronize pieces.
    return SyncSize(lengths=tuple(headers.lengths[1:]), complete=complete)
