"""Property tests of the netlink message codec and the command parser."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpukmod import protocol as p
from gpukmod._pyroute2 import _parse as pyroute2_parse
from gpukmod.protocol import Command, CommandRejected, Verb

ids = st.lists(st.integers(1, p.MAX_ID), min_size=1, max_size=p.MAX_IDS, unique=True).map(tuple)
commands = st.one_of(
    st.sampled_from([Command(v) for v in sorted(p.BARE_VERBS, key=lambda v: v.value)]),
    st.builds(Command, st.sampled_from([v for v in Verb if v not in p.BARE_VERBS]), ids),
)


@given(commands)
def test_every_valid_command_round_trips(command: Command) -> None:
    wire = p.encode_command(command)
    assert len(wire) <= p.MAX_COMMAND_LEN
    assert p.parse_command(wire) == command


@given(st.binary(max_size=1200))
def test_parser_only_ever_raises_command_rejected(payload: bytes) -> None:
    try:
        command = p.parse_command(payload)
    except CommandRejected as exc:
        assert exc.errno > 0
    else:  # anything accepted re-encodes to the same bytes (canonical form)
        assert p.encode_command(command) == payload.removesuffix(b"\0")


@given(commands, st.integers(0, 2**32 - 1))
def test_request_decodes_back(command: Command, seq: int) -> None:
    (msg,) = p.decode_messages(p.encode_request(command, seq))
    assert msg.type == p.MSG_COMMAND and msg.seq == seq
    assert p.parse_command(msg.payload) == command


messages = st.lists(
    st.one_of(
        st.integers(1, 2**64 - 1).map(p.encode_notice),
        st.builds(p.encode_message, st.integers(0x10, 0xFFFF), st.binary(max_size=40)),
    ),
    max_size=6,
)


@given(messages)
def test_batches_split_exactly_and_pyroute2_agrees(parts: list[bytes]) -> None:
    buf = b"".join(parts)
    ours = p.decode_messages(buf)
    assert len(ours) == len(parts)
    theirs = pyroute2_parse(buf)
    assert [(m.type, m.payload) for m in ours] == [(m.type, m.payload) for m in theirs]


@given(st.binary(max_size=200))
def test_decoder_only_raises_value_error(buf: bytes) -> None:
    with contextlib.suppress(ValueError):
        p.decode_messages(buf)


@given(messages.filter(bool), st.data())
def test_a_message_cut_short_is_refused(parts: list[bytes], data: st.DataObject) -> None:
    buf = b"".join(parts)
    start = len(buf) - len(parts[-1])
    declared = int.from_bytes(parts[-1][:4], "little")
    end = data.draw(st.integers(start + 1, start + declared - 1))
    with pytest.raises(ValueError):
        p.decode_messages(buf[:end])
