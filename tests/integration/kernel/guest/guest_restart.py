"""Inside the QEMU guest: an agent killed with SIGKILL leaves entries in gpukmod's table; the next
agent's kernel client deletes them before it registers (``Flush``), so no owner is held for them.

The crashed agent is a real process (its own netlink socket, killed with SIGKILL, no cleanup). A
control run first shows what the stale entries did before ``Flush``: a new listener got the
notice of an armed entry it never added and the owner was held. Then the same crash is followed
by the agent's own start path (``KmodBridge.start`` → ``open_kmod`` → ``Flush``, ``Register``), and
the owner's GPU ioctl passes. Run by tests/integration/kernel/test_qemu.py; skips on the host.
"""

from __future__ import annotations

import errno
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.core.actions import KmodCommand
from controller.spot.kmod_bridge import KmodBridge
from gpukmod import KmodClient, KmodError
from gpukmod.protocol import CommandRejected, parse_command
from tests.integration.kernel.guest.common import Worker, in_guest, module_loaded, worker

pytestmark = pytest.mark.skipif(not in_guest(), reason="runs inside the QEMU guest: make kmod-test")

REPO_ROOT = Path(__file__).resolve().parents[4]  # the old agent imports gpukmod from this checkout
MAX_BLOCK_MS = 10000  # a stale hold would last this long: unmistakable beside NOT_HELD_S
NOT_HELD_S = 0.8  # as in guest_gpukmod.py: a plain ioctl under TCG on a busy host
ENOTTY = errno.ENOTTY

# The agent that crashes: registers, watches `added` (comma-separated inodes), arms `armed`, says
# "ready" and then prints each notice it gets until it is killed.
OLD_AGENT = """
import sys
from gpukmod import KmodClient
client = KmodClient.open_flushed()
client.register()
added = [int(x) for x in sys.argv[1].split(",") if x]
armed = [int(x) for x in sys.argv[2].split(",") if x]
client.add(*added)
client.detect(*armed)
print("ready", flush=True)
for inode in client.notices():
    print(f"notice {inode}", flush=True)
"""


class OldAgent:
    """A process holding the module's listener and some entries, to be killed with SIGKILL."""

    def __init__(self, added: list[int], armed: list[int]) -> None:
        args = [",".join(map(str, added)), ",".join(map(str, armed))]
        self.proc = subprocess.Popen(
            [sys.executable, "-c", OLD_AGENT, *args], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True, bufsize=1
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        assert line == "ready", (line, self.proc.poll())

    def next_line(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        assert self.proc.returncode == -signal.SIGKILL
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture
def owners() -> Iterator[tuple[Worker, Worker, Worker]]:
    """Three containers' worth of pid namespaces: armed, only watched, and held at the crash."""
    with module_loaded(MAX_BLOCK_MS), worker() as armed, worker() as watched, worker() as held:
        yield armed, watched, held


def _dmesg() -> str:
    return subprocess.run(["dmesg"], capture_output=True, text=True, check=True).stdout


def _is_gone(client: KmodClient, inode: int) -> bool:
    try:
        client.detect(inode)
    except KmodError as exc:
        assert exc.errno == errno.ENOENT, exc
        return True
    return False


def test_without_flush_a_crashed_agents_armed_entry_holds_the_owner(owners: tuple[Worker, Worker, Worker]) -> None:
    # The control: what a restarted agent met before it flushed. The test below must differ.
    armed, watched, _ = owners
    OldAgent([armed.pidns, watched.pidns], [armed.pidns]).kill9()
    with KmodClient() as listener:
        listener.register()  # a new listener only, the old agent's start path
        armed.ioctl_async()
        assert listener.next_notice(timeout_s=10) == armed.pidns  # a notice about nobody it watches
        time.sleep(0.5)
        listener.release(armed.pidns)
        ((code, held),) = armed.result()
        assert code == ENOTTY and held >= 0.45, held  # held for the dead agent's plan
        assert not _is_gone(listener, watched.pidns)  # and every entry is still there


def test_the_next_agent_deletes_every_stale_entry_and_no_owner_is_held(
    owners: tuple[Worker, Worker, Worker],
) -> None:
    armed, watched, held = owners
    old = OldAgent([armed.pidns, watched.pidns, held.pidns], [armed.pidns, held.pidns])
    held.ioctl_async()  # the old agent is the listener: this ioctl is held when it dies
    assert old.next_line() == f"notice {held.pidns}"
    old.kill9()
    ((code, stall),) = held.result()
    assert code == ENOTTY and stall < MAX_BLOCK_MS / 1000 / 2, stall  # its socket closed: hold ended

    woken: list[float] = []
    bridge = KmodBridge(wake=lambda: woken.append(time.monotonic()))
    try:
        seen = len(_dmesg())
        assert bridge.start(), bridge.reason  # the agent's own start: Flush, then Register
        assert "flushed the table: 3 entries removed" in _dmesg()[seen:]
        ((code, stall),) = armed.ioctl()
        assert code == ENOTTY and stall < NOT_HELD_S, stall  # no stale entry holds the owner
        time.sleep(0.3)
        assert bridge.drain() == [] and woken == []  # and nobody is told about it
        with KmodClient() as probe:
            assert [_is_gone(probe, w.pidns) for w in owners] == [True, True, True]
        # The new agent's own watches work as before.
        bridge.apply(KmodCommand("add", armed.pidns))
        bridge.apply(KmodCommand("detect", armed.pidns))
        armed.ioctl_async()
        deadline = time.monotonic() + 10
        while not woken and time.monotonic() < deadline:
            time.sleep(0.005)
        assert [p for p, _ in bridge.drain()] == [armed.pidns]
        bridge.apply(KmodCommand("release", armed.pidns))
        ((code, stall),) = armed.result()
        assert code == ENOTTY and stall < MAX_BLOCK_MS / 1000 / 2, stall
    finally:
        bridge.close()


def test_flush_ends_a_hold_in_progress_and_leaves_the_listener() -> None:
    with module_loaded(MAX_BLOCK_MS), KmodClient() as client, worker() as w:
        client.register()
        client.watch(w.pidns)
        w.ioctl_async()
        assert client.next_notice(timeout_s=10) == w.pidns
        time.sleep(0.3)
        client.flush()
        ((code, stall),) = w.result()
        assert code == ENOTTY and 0.25 <= stall < MAX_BLOCK_MS / 1000 / 2, stall
        assert _is_gone(client, w.pidns)
        client.flush()  # an empty table flushes too
        client.watch(w.pidns)  # still the listener: a new watch notifies this socket
        w.ioctl_async()
        assert client.next_notice(timeout_s=10) == w.pidns
        client.release(w.pidns)
        assert w.result()[0][0] == ENOTTY


def test_the_kernel_parses_flush_like_protocol_py() -> None:
    payloads = [
        b"Flush",
        b"Flush\0",
        b"flush",
        b"Flush ",
        b" Flush",
        b"Flush(1):5",
        b"Flush(0):",
        b"Flus",
        b"FlushFlush",
    ]
    with module_loaded(MAX_BLOCK_MS), KmodClient() as client:
        for payload in payloads:
            try:
                parse_command(payload)
                expected = 0
            except CommandRejected as exc:
                expected = exc.errno
            assert client.send_raw(payload) == expected, payload
