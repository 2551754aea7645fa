"""How large a message the plugin takes, at and over the old 16 MiB edge (docs/nri.md, "How large a
Synchronize can be").

containerd 1.7.24 sends a ttrpc message as a first mux frame of 4096 bytes and the rest as one frame
of at most 16 MiB, so it can finish messages of up to 16 MiB + 4086 bytes of data and no more;
containerd 2.4.2 sends nothing over 4 MiB and splits Synchronize into pieces.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from gpushare.config import load_config
from nri_plugin import Injector, ProtocolError, Stub
from nri_plugin._pb import nri_pb2, ttrpc_pb2
from nri_plugin.errors import ConnectionClosed
from nri_plugin.transport.mux import MAX_RECV_FRAME, MuxDecoder
from nri_plugin.transport.ttrpc import MAX_RECV_MESSAGE, TYPE_REQUEST, MessageDecoder, encode_message

from .fake_runtime import MUX, PLUGIN, TTRPC, FakeRuntime, runtime_frames

MIB = 1 << 20
MOST_1_7 = 16 * MIB + 4086
CHUNK = 64 * 1024
HANDSHAKE_NEVER_S = 3600.0


def _through_both(wire: bytes, *, chunk: int = CHUNK) -> list[bytes]:
    """Feed a byte stream as the plugin's reader does: mux frames, then ttrpc messages of conn 1."""
    mux, ttrpc = MuxDecoder(), MessageDecoder()
    out = []
    for i in range(0, len(wire), chunk):
        for conn, payload in mux.feed(wire[i : i + chunk]):
            assert conn == 1
            out.extend(m.data for m in ttrpc.feed(payload))
    return out


def test_the_bound_is_what_containerd_1_7_can_finish() -> None:
    assert MAX_RECV_MESSAGE == MOST_1_7
    assert MAX_RECV_FRAME == 16 * MIB  # NRI v0.6.1's mux refuses to write a larger frame


@pytest.mark.parametrize(
    "size",
    [16 * MIB, 16 * MIB + 1, 16 * MIB + 2043, MOST_1_7],
    ids=["16MiB", "16MiB+1", "16MiB+2043", "16MiB+4086"],
)
def test_a_message_containerd_1_7_can_send_is_taken_whole(size: int) -> None:
    data = bytes(range(256)) * (size // 256) + b"z" * (size % 256)
    frames, finished = runtime_frames(1, encode_message_unchecked(1, data))
    assert finished and len(frames) == 2 and len(frames[1]) - 8 <= 16 * MIB
    got = _through_both(b"".join(frames))
    assert len(got) == 1 and got[0] == data


def test_one_byte_more_is_refused_at_its_header_before_any_buffering() -> None:
    message = encode_message_unchecked(3, b"x" * (MOST_1_7 + 1))
    frames, finished = runtime_frames(1, message)
    assert not finished and len(frames) == 1  # containerd gets only its first 4096 bytes out
    mux, ttrpc = MuxDecoder(), MessageDecoder()
    [(_, first)] = mux.feed(frames[0])
    with pytest.raises(ProtocolError, match=rf"message of {MOST_1_7 + 1} bytes \(stream 3\) exceeds {MOST_1_7}, "):
        ttrpc.feed(first[:10])  # the header alone is enough to refuse


def test_mux_frames_up_to_16_mib_are_taken_and_larger_refused() -> None:
    payload = b"f" * (16 * MIB)
    assert MuxDecoder().feed(MUX.pack(1, len(payload)) + payload) == [(1, payload)]
    with pytest.raises(ProtocolError, match=rf"frame of {16 * MIB + 1} bytes"):
        MuxDecoder().feed(MUX.pack(1, 16 * MIB + 1))  # refused at the header


def encode_message_unchecked(stream_id: int, data: bytes) -> bytes:
    """A ttrpc request as containerd 1.7 writes it: no size check on send."""
    return TTRPC.pack(len(data), stream_id, TYPE_REQUEST, 0) + data


def test_our_own_sends_stay_at_4_mib() -> None:
    encode_message(1, TYPE_REQUEST, b"s" * (4 * MIB))
    with pytest.raises(ProtocolError):
        encode_message(1, TYPE_REQUEST, b"s" * (4 * MIB + 1))


# --- the stub against the byte-level fake runtime -----------------------------------------------------


@pytest.fixture
def injector() -> Injector:
    return Injector(load_config(None))


@pytest.fixture
def big_runtime() -> Iterator[FakeRuntime]:
    rt = FakeRuntime()
    yield rt
    rt.cleanup()


def _sync_of_size(target: int, n: int = 14) -> tuple[list[nri_pb2.PodSandbox], list[nri_pb2.Container]]:
    """``n`` pods with one container each, their environments large enough that the handshake's
    Synchronize carries exactly ``target`` bytes of ttrpc data (the Request envelope included)."""
    pods = [nri_pb2.PodSandbox(id=f"p{i:02d}", name=f"pod-{i:02d}", namespace="ns") for i in range(n)]
    ctrs = [nri_pb2.Container(id=f"c{i:02d}", pod_sandbox_id=f"p{i:02d}", name="app") for i in range(n)]
    for c in ctrs:
        c.env.extend(f"BULK_{j:02d}=" + "e" * 100_000 for j in range(target // n // 100_010))
    ctrs[-1].env.append("PAD=")
    for _ in range(6):
        missing = target - _envelope(nri_pb2.SynchronizeRequest(pods=pods, containers=ctrs)).ByteSize()
        if missing == 0:
            return pods, ctrs
        assert len(ctrs[-1].env[-1]) + missing > 4, "the bulk alone is over the target"
        ctrs[-1].env[-1] += "p" * missing if missing > 0 else ""
        ctrs[-1].env[-1] = ctrs[-1].env[-1][: len(ctrs[-1].env[-1]) + min(missing, 0) or None]
    raise AssertionError(f"could not size the Synchronize to {target} bytes")


def _envelope(req: nri_pb2.SynchronizeRequest) -> ttrpc_pb2.Request:
    """The ttrpc Request the fake runtime wraps a Synchronize in."""
    return ttrpc_pb2.Request(
        service=PLUGIN, method="Synchronize", payload=req.SerializeToString(), timeout_nano=2_000_000_000
    )


@pytest.mark.parametrize("size", [16 * MIB + 2043, MOST_1_7], ids=["16MiB+2043", "16MiB+4086"])
def test_a_synchronize_over_16_mib_connects_the_stub(
    big_runtime: FakeRuntime, injector: Injector, size: int, caplog: pytest.LogCaptureFixture
) -> None:
    big_runtime.pods, big_runtime.containers = _sync_of_size(size)
    [req] = big_runtime.sync_requests()
    assert _envelope(req).ByteSize() == size
    big_runtime.listen()
    stub = Stub(injector, socket_path=big_runtime.path, timeout_s=20.0)
    try:
        with caplog.at_level(logging.INFO, logger="nri_plugin.stub"):
            stub.connect()
        assert big_runtime.ready.wait(10)
        assert len(injector.cache.view.containers) == 14
        assert max(n for _, n in big_runtime.frames_seen) <= 4096  # our replies stay small
    finally:
        stub.close()
    [record] = [r for r in caplog.records if r.getMessage() == "nri: connected"]
    fields = record.kv  # type: ignore[attr-defined]
    assert (fields["sync_messages"], fields["sync_bytes"]) == (1, req.ByteSize())


def test_a_synchronize_containerd_1_7_cannot_finish_fails_the_handshake_at_once(
    big_runtime: FakeRuntime, injector: Injector
) -> None:
    big_runtime.pods, big_runtime.containers = _sync_of_size(MOST_1_7 + 1)
    big_runtime.listen()
    # A deadline no test would wait out: only an error named at once can pass.
    stub = Stub(injector, socket_path=big_runtime.path, timeout_s=HANDSHAKE_NEVER_S)
    try:
        with pytest.raises(ProtocolError, match=rf"message of {MOST_1_7 + 1} bytes .* exceeds {MOST_1_7}, the most"):
            stub.connect()
    finally:
        stub.close()
    assert not big_runtime.ready.is_set() and not injector.cache.view.containers


def test_pieces_over_16_mib_in_all_are_collected(big_runtime: FakeRuntime, injector: Injector) -> None:
    big_runtime.pods, big_runtime.containers = _sync_of_size(17 * MIB)
    big_runtime.sync_pieces = 5
    pieces = big_runtime.sync_requests()
    assert all(_envelope(r).ByteSize() <= 4 * MIB for r in pieces) and [r.more for r in pieces] == [True] * 4 + [False]
    big_runtime.listen()
    stub = Stub(injector, socket_path=big_runtime.path, timeout_s=20.0)
    try:
        stub.connect()
        assert len(injector.cache.view.containers) == 14 and len(injector.cache.view.pods) == 14
    finally:
        stub.close()


def test_runtime_closing_after_configure_is_named_at_once(big_runtime: FakeRuntime, injector: Injector) -> None:
    """containerd 2.x closes a plugin whose Synchronize it cannot cut small enough; say so, without
    waiting out the handshake's deadline."""
    big_runtime.drop_before_sync = True
    big_runtime.listen()
    # A deadline no test would wait out: only an error named at once can pass.
    stub = Stub(injector, socket_path=big_runtime.path, timeout_s=HANDSHAKE_NEVER_S)
    try:
        with pytest.raises(ConnectionClosed, match="after Configure, before Synchronize completed"):
            stub.connect()
    finally:
        stub.close()
