"""KmodClient against an in-memory kernel stand-in: ACK matching, errno mapping, notices."""

from __future__ import annotations

import errno
import struct
import threading
from collections import deque

import pytest

from gpukmod import KmodClient, KmodError
from gpukmod import client as client_mod
from gpukmod.protocol import (
    MSG_COMMAND,
    NLM_F_ACK,
    NLMSG_ERROR,
    CommandRejected,
    Message,
    decode_messages,
    encode_message,
    encode_notice,
    parse_command,
)


class FakeKernel:
    """Answers each command with an ACK carrying the parser's errno (or ``errors[verb]``)."""

    name = "fake"
    portid = 4242

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.inbox: deque[list[Message]] = deque()
        self.errors: dict[str, int] = {}
        self.silent = False
        self.closed = False

    def send(self, msg_type: int, flags: int, seq: int, payload: bytes) -> None:
        self.sent.append(payload)
        if self.silent or not flags & NLM_F_ACK:
            return
        code = 0
        if msg_type != MSG_COMMAND:
            code = errno.EOPNOTSUPP
        else:
            try:
                cmd = parse_command(payload)
                code = self.errors.get(cmd.verb.value, 0)
            except CommandRejected as exc:
                code = exc.errno
        request = encode_message(msg_type, payload, seq=seq, pid=self.portid)[:16]
        self.inbox.append(decode_messages(encode_message(NLMSG_ERROR, struct.pack("=i", -code) + request)))

    def receive(self, timeout_s: float) -> list[Message]:
        return self.inbox.popleft() if self.inbox else []

    def close(self) -> None:
        self.closed = True

    def notify(self, *inodes: int) -> None:
        self.inbox.append(decode_messages(b"".join(encode_notice(i) for i in inodes)))


@pytest.fixture
def kernel(monkeypatch: pytest.MonkeyPatch) -> FakeKernel:
    fake = FakeKernel()
    monkeypatch.setattr(client_mod, "open_transport", lambda unit, backend: fake)
    return fake


def test_commands_go_out_as_the_grammar_says(kernel: FakeKernel) -> None:
    with KmodClient() as c:
        c.register()
        c.watch(11, 12)
        c.release(11)
        c.undetect(12)
        c.delete(11, 12)
    assert kernel.sent == [
        b"Register",
        b"add(2):11 12",
        b"detect(2):11 12",
        b"release(1):11",
        b"undetect(1):12",
        b"delete(2):11 12",
    ]
    assert kernel.closed


def test_kernel_errno_becomes_kmod_error_with_hint(kernel: FakeKernel) -> None:
    kernel.errors["detect"] = errno.ENOENT
    with KmodClient() as c, pytest.raises(KmodError) as exc:
        c.detect(5)
    assert exc.value.errno == errno.ENOENT and exc.value.op == "detect" and "add it first" in str(exc.value)


def test_bad_ids_never_reach_the_kernel(kernel: FakeKernel) -> None:
    with KmodClient() as c, pytest.raises(KmodError) as exc:
        c.add(0)
    assert exc.value.errno == errno.EINVAL and kernel.sent == []


def test_send_raw_returns_the_kernel_errno(kernel: FakeKernel) -> None:
    with KmodClient() as c:
        assert c.send_raw(b"add(2):1") == errno.EINVAL
        assert c.send_raw(b"add(1):1", msg_type=0x42) == errno.EOPNOTSUPP
        assert c.send_raw(b"Register") == 0


def test_no_ack_times_out(kernel: FakeKernel) -> None:
    kernel.silent = True
    with KmodClient(ack_timeout_s=0.05) as c, pytest.raises(KmodError) as exc:
        c.register()
    assert exc.value.errno == errno.ETIMEDOUT


def test_notices_arriving_during_a_command_are_kept(kernel: FakeKernel) -> None:
    with KmodClient() as c:
        kernel.notify(7, 8)  # queued before the ACK: read while waiting for it
        c.release(3)
        assert c.next_notice(timeout_s=0) == 7
        assert list(c.notices(timeout_s=0.01)) == [8]
        assert c.next_notice(timeout_s=0.01) is None


def test_unexpected_messages_are_ignored(kernel: FakeKernel) -> None:
    with KmodClient() as c:
        kernel.inbox.append(decode_messages(encode_message(0x30, b"??")))
        kernel.notify(9)
        assert c.next_notice(timeout_s=0.05) == 9


def test_callback_thread_is_named_and_joined_on_close(kernel: FakeKernel) -> None:
    seen: list[int] = []
    done = threading.Event()

    def on_notice(inode: int) -> None:
        seen.append(inode)
        if len(seen) == 2:
            done.set()

    c = KmodClient()
    c.start_notices(on_notice)
    assert any(t.name == "gpushare-kmod-notices" for t in threading.enumerate())
    kernel.notify(1, 2)
    assert done.wait(5)
    with pytest.raises(KmodError):
        c.start_notices(on_notice)
    c.close()
    assert seen == [1, 2]
    assert not any(t.name == "gpushare-kmod-notices" for t in threading.enumerate())


def test_an_agent_client_empties_the_table_before_anything_else(kernel: FakeKernel) -> None:
    with KmodClient.open_flushed() as c:
        assert kernel.sent == [b"Flush"]  # before Register: no stale armed entry can hold anyone for us
        c.register()
        c.flush()
    assert kernel.sent == [b"Flush", b"Register", b"Flush"] and kernel.closed


def test_a_module_without_flush_is_still_used_and_says_what_to_do(
    kernel: FakeKernel, caplog: pytest.LogCaptureFixture
) -> None:
    kernel.errors["Flush"] = errno.EINVAL  # what a 0.1 module answers to a verb it does not know
    with KmodClient.open_flushed() as c:
        c.register()
    assert kernel.sent == [b"Flush", b"Register"]
    assert "cannot flush its table" in caplog.text and "gpushare kmod install" in caplog.text


@pytest.mark.parametrize("code", [errno.EPERM, errno.ETIMEDOUT])
def test_a_flush_that_fails_otherwise_closes_the_socket_and_raises(kernel: FakeKernel, code: int) -> None:
    kernel.errors["Flush"] = code
    with pytest.raises(KmodError) as exc:
        KmodClient.open_flushed()
    assert exc.value.errno == code and exc.value.op == "Flush"
    assert kernel.closed  # no socket left behind holding a module reference
