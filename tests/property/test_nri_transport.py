"""Property tests of the mux and ttrpc decoders: round trip under any chunking, and garbage gives a
result or our own TransportError, never another exception."""

from __future__ import annotations

import contextlib

from hypothesis import given, settings
from hypothesis import strategies as st

from nri_plugin.errors import TransportError
from nri_plugin.transport.mux import FIRST_FRAME_MAX, MuxDecoder, encode_frames
from nri_plugin.transport.ttrpc import (
    TYPE_REQUEST,
    MessageDecoder,
    decode_request,
    decode_response,
    encode_message,
)

messages = st.lists(st.tuples(st.integers(1, 0xFFFFFFFF), st.binary(max_size=10_000)), min_size=1, max_size=5)


def _chunks(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    out, prev = [], 0
    for p in [*points, len(data)]:
        out.append(data[prev:p])
        prev = p
    return out


@given(messages, st.lists(st.integers(0, 1 << 20), max_size=20))
def test_mux_round_trip_any_chunking(msgs: list[tuple[int, bytes]], cuts: list[int]) -> None:
    wire = b""
    for conn, payload in msgs:
        frames = encode_frames(conn, payload)
        assert len(frames[0]) - 8 <= FIRST_FRAME_MAX
        wire += b"".join(frames)
    dec = MuxDecoder()
    got: dict[int, bytes] = {}
    for chunk in _chunks(wire, cuts):
        for conn, payload in dec.feed(chunk):
            got[conn] = got.get(conn, b"") + payload
    want: dict[int, bytes] = {}
    for conn, payload in msgs:
        want[conn] = want.get(conn, b"") + payload
    assert got == want and dec.pending == 0


@given(st.binary(max_size=4096), st.lists(st.integers(0, 4096), max_size=8))
def test_mux_garbage_is_frames_or_protocol_error(data: bytes, cuts: list[int]) -> None:
    dec = MuxDecoder(max_frame=1 << 16)
    try:
        for chunk in _chunks(data, cuts):
            for conn, _ in dec.feed(chunk):
                assert conn != 0
    except TransportError:
        pass


@given(
    st.lists(st.tuples(st.integers(0, 0xFFFFFFFF), st.sampled_from([1, 2, 3]), st.binary(max_size=5000)), max_size=5),
    st.lists(st.integers(0, 1 << 16), max_size=20),
)
def test_ttrpc_round_trip_any_chunking(msgs: list[tuple[int, int, bytes]], cuts: list[int]) -> None:
    wire = b"".join(encode_message(sid, t, data) for sid, t, data in msgs)
    dec = MessageDecoder()
    got = []
    for chunk in _chunks(wire, cuts):
        got.extend((m.stream_id, m.type, m.data) for m in dec.feed(chunk))
    assert got == msgs


@settings(max_examples=300)
@given(st.binary(max_size=2048), st.lists(st.integers(0, 2048), max_size=8))
def test_ttrpc_garbage_is_messages_or_protocol_error(data: bytes, cuts: list[int]) -> None:
    dec = MessageDecoder(max_data=1 << 16)
    try:
        for chunk in _chunks(data, cuts):
            for m in dec.feed(chunk):
                assert m.type in (1, 2, 3)
                if m.type == TYPE_REQUEST:
                    decode_request(m.data)
                else:
                    decode_response(m.data)
    except TransportError:
        pass


@settings(max_examples=500)
@given(st.binary(max_size=512))
def test_envelope_garbage_is_decoded_or_protocol_error(data: bytes) -> None:
    for decode in (decode_request, decode_response):
        with contextlib.suppress(TransportError):
            decode(data)
