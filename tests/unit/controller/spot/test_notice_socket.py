"""The gpukmod stand-in on a unix socket (``gpushare agent --kmod-socket``) against a real listening peer.

The peer here is what bench/spot_return.py is: it accepts the agent's connection, reads the
commands with their CLOCK_MONOTONIC stamps and writes ``notice <pidns>`` lines.
"""

from __future__ import annotations

import errno
import logging
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli import main as cli
from controller.core.actions import KmodCommand
from controller.spot.kmod_bridge import KmodBridge
from controller.spot.notice_socket import MAX_LINE, NoticeSocketClient, notice_socket_factory, parse_notice
from gpukmod import KmodError
from gpukmod.protocol import MAX_ID

PIDNS = 4026532001


class Peer:
    """The listening side: one connection, lines read with a deadline."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(self.path)
        self.server.listen(1)
        self.server.settimeout(5.0)
        self.conn: socket.socket | None = None
        self._buf = b""

    def accept(self) -> None:
        self.conn, _ = self.server.accept()
        self.conn.settimeout(5.0)

    def line(self) -> list[str]:
        """The next command line, split: [verb, t_ns, ids...]."""
        assert self.conn is not None
        while b"\n" not in self._buf:
            chunk = self.conn.recv(4096)
            assert chunk, "the agent side closed the socket"
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line.decode().split()

    def send(self, data: bytes) -> None:
        assert self.conn is not None
        self.conn.sendall(data)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.server.close()


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    # Short: a unix socket path is limited to 107 bytes, pytest's tmp_path can be longer.
    d = Path(tempfile.mkdtemp(prefix="gs-ns", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def peer(sock_dir: Path) -> Iterator[Peer]:
    p = Peer(sock_dir / "kmod.sock")
    yield p
    p.close()


def connect(peer: Peer) -> NoticeSocketClient:
    """A client connected to ``peer``, its opening ``flush`` already read."""
    before = time.monotonic_ns()
    client = NoticeSocketClient(peer.path)
    peer.accept()
    verb, t_ns = peer.line()
    assert verb == "flush" and before <= int(t_ns) <= time.monotonic_ns()
    return client


def test_commands_reach_the_peer_stamped_with_the_agents_monotonic_clock(peer: Peer) -> None:
    client = connect(peer)
    try:
        client.register()
        assert peer.line()[0] == "register"
        before = time.monotonic_ns()
        client.add(PIDNS, PIDNS + 1)
        client.release(PIDNS)
        after = time.monotonic_ns()
        add, release = peer.line(), peer.line()
        assert add[0] == "add" and add[2:] == [str(PIDNS), str(PIDNS + 1)]
        assert release[0] == "release" and release[2:] == [str(PIDNS)]
        assert before <= int(add[1]) <= int(release[1]) <= after
        for op in ("delete", "detect", "undetect"):
            getattr(client, op)(PIDNS)
            assert peer.line()[0::2] == [op, str(PIDNS)]
    finally:
        client.close()


@pytest.mark.parametrize(
    ("ids", "code"),
    [((), errno.EINVAL), ((0,), errno.EINVAL), ((MAX_ID + 1,), errno.ERANGE), ((PIDNS, PIDNS), errno.EINVAL)],
)
def test_ids_the_module_would_refuse_are_refused_and_nothing_is_sent(
    peer: Peer, ids: tuple[int, ...], code: int
) -> None:
    client = connect(peer)
    try:
        with pytest.raises(KmodError) as info:
            client.detect(*ids)
        assert info.value.errno == code and info.value.op == "detect"
        client.undetect(PIDNS)  # the next line the peer reads is this one: the refused one never went out
        assert peer.line()[0] == "undetect"
    finally:
        client.close()


def test_notices_are_parsed_whole_and_garbage_is_dropped(peer: Peer, caplog: pytest.LogCaptureFixture) -> None:
    client = connect(peer)
    got: list[int] = []
    done = threading.Event()

    def on_notice(pidns: int) -> None:
        if pidns == 7:
            raise RuntimeError("a broken callback must not end the reader")
        got.append(pidns)
        if pidns == PIDNS + 1:
            done.set()

    try:
        client.start_notices(on_notice, name="test-notices")
        with pytest.raises(KmodError):
            client.start_notices(on_notice)  # one reader per client
        # A notice split across writes, garbage, a line too long, a failing callback, then two more.
        peer.send(b"noti")
        time.sleep(0.05)
        peer.send(f"ce {PIDNS}\nhello\nnotice -3\nnotice 0\n".encode())
        peer.send(b"x" * (MAX_LINE + 10))
        time.sleep(0.05)  # most likely read apart: the line's tail must be dropped with it
        peer.send(f"notice 9\nnotice 7\nnotice {PIDNS}\nnotice {PIDNS + 1}\n".encode())
        assert done.wait(5.0)
        assert got == [PIDNS, PIDNS, PIDNS + 1]
        assert "not a notice, ignored" in caplog.text and "line too long" in caplog.text
    finally:
        client.close()


def test_parse_notice() -> None:
    assert parse_notice(b"notice 4026531836") == 4026531836
    assert parse_notice(b"  notice 12 \r") == 12
    for bad in (b"", b"notice", b"notice x", b"notice 1 2", b"release 5", f"notice {MAX_ID + 1}".encode()):
        assert parse_notice(bad) is None, bad


def test_no_peer_is_an_absent_module_and_the_bridge_says_where_it_looked(sock_dir: Path) -> None:
    path = str(sock_dir / "nobody.sock")
    with pytest.raises(KmodError) as info:
        NoticeSocketClient(path)
    assert info.value.errno == errno.ECONNREFUSED and path in str(info.value)
    bridge = KmodBridge()
    bridge.use_client_factory(notice_socket_factory(path), where=f"the test socket {path}")
    assert not bridge.start() and not bridge.available
    assert path in bridge.reason and "utilization alone" in bridge.reason


def test_a_peer_that_went_away_is_a_module_that_went_away(peer: Peer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    bridge = KmodBridge(retry_s=3600.0)
    bridge.use_client_factory(notice_socket_factory(peer.path), where="the test socket")
    assert bridge.start()
    peer.accept()
    assert [peer.line()[0], peer.line()[0]] == ["flush", "register"]
    assert bridge.reason == "registered on the test socket"
    peer.close()
    deadline = time.monotonic() + 5.0
    while "the peer closed it" not in caplog.text and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "the peer closed it" in caplog.text
    with pytest.raises(KmodError) as info:
        for _ in range(20):  # the first write after a close may still land in the socket buffer
            bridge.apply(KmodCommand("detect", PIDNS))
    assert info.value.errno == errno.ECONNREFUSED
    assert not bridge.available  # dropped, looked for again after retry_s
    bridge.close()


def test_the_return_path_sees_the_notice_and_the_peer_times_the_release(peer: Peer) -> None:
    """What the benchmark relies on: notice in, the bridge's return callback, ``release`` out with its stamp."""
    bridge = KmodBridge()
    bridge.use_client_factory(notice_socket_factory(peer.path), where="the test socket")
    seen: list[tuple[int, float]] = []

    def on_notice(pidns: int, at: float) -> None:  # what SpotRuntime._on_notice does, minus the kill
        seen.append((pidns, at))
        bridge.queue_notice(pidns, at)
        bridge.release(pidns)

    bridge.on_notice = on_notice
    assert bridge.start()
    try:
        peer.accept()
        assert [peer.line()[0], peer.line()[0]] == ["flush", "register"]
        sent = time.monotonic_ns()
        peer.send(f"notice {PIDNS}\n".encode())
        verb, t_ns, pidns = peer.line()
        assert (verb, pidns) == ("release", str(PIDNS)) and int(t_ns) >= sent
        assert [p for p, _ in bridge.drain()] == [PIDNS] and seen[0][1] * 1e9 >= sent
    finally:
        bridge.close()


def test_close_is_prompt_and_idempotent(peer: Peer) -> None:
    client = connect(peer)
    client.start_notices(lambda pidns: None)
    started = time.monotonic()
    client.close()
    client.close()
    assert time.monotonic() - started < 1.0
    assert peer.conn is not None and peer.conn.recv(10) == b""  # the peer sees EOF


def test_agent_refuses_the_socket_without_spot_or_kmod(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\nnodeName: n1\nrealResources: [example.com/gpu]\n")
    for flag in ("--no-kmod", "--no-spot"):
        result = CliRunner().invoke(
            cli.app, ["agent", "--config", str(config), "--kmod-socket", str(tmp_path / "k.sock"), flag]
        )
        assert result.exit_code == 2, result.output
        assert "--kmod-socket stands in for gpukmod: it needs --spot and --kmod" in result.output
