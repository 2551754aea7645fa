"""``KmodClient``: commands to the gpukmod module and the stream of its notices (design §6, §7).

One client owns one netlink socket. Commands wait for the kernel's ACK and raise
``KmodError`` with the kernel's errno. An agent opens its client with ``open_flushed``,
which first deletes whatever an earlier agent left in the module's table. ``register()`` makes this socket the module's
listener, so notices (one pid-namespace inode each) arrive on it; they are read by
``next_notice``/``notices`` or by a callback on a named thread (``start_notices``).
Reading is done in short slices under a lock, so one thread may wait for notices while
another sends ``release``: whichever reads a datagram files its messages for the other.
"""

from __future__ import annotations

import errno
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from types import TracebackType

from gpukmod._transport import Transport, open_transport
from gpukmod.errors import KmodError
from gpukmod.protocol import (
    MSG_COMMAND,
    MSG_NOTICE,
    NETLINK_UNIT,
    NLM_F_ACK,
    NLM_F_REQUEST,
    NLMSG_ERROR,
    Command,
    CommandRejected,
    Message,
    Verb,
    ack_seq,
    decode_ack,
    decode_notice,
    encode_command,
)
from gpushare.log import kv

log = logging.getLogger(__name__)

_SLICE_S = 0.05  # longest a reader holds the socket lock; bounds how late a command starts
DEFAULT_ACK_TIMEOUT_S = 2.0


class KmodClient:
    """Talk to gpukmod over netlink unit ``unit`` with ``backend`` ("auto", "native", "pyroute2")."""

    def __init__(
        self, *, unit: int = NETLINK_UNIT, backend: str = "auto", ack_timeout_s: float = DEFAULT_ACK_TIMEOUT_S
    ) -> None:
        self._transport: Transport = open_transport(unit, backend)
        self._ack_timeout_s = ack_timeout_s
        self._lock = threading.Lock()
        self._seq = itertools.count(1)
        self._acks: dict[int, int] = {}
        self._notices: deque[int] = deque()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    @property
    def backend(self) -> str:
        """Which backend this client uses ("native" or "pyroute2")."""
        return self._transport.name

    @property
    def portid(self) -> int:
        """This socket's netlink port id (the listener's, after ``register``)."""
        return self._transport.portid

    # -- commands ---------------------------------------------------------------------------

    @classmethod
    def open_flushed(
        cls, *, unit: int = NETLINK_UNIT, backend: str = "auto", ack_timeout_s: float = DEFAULT_ACK_TIMEOUT_S
    ) -> KmodClient:
        """A client on an emptied table (``flush``): what an agent opens when it starts.

        A module older than ``Flush`` answers EINVAL: the client is returned anyway, with a
        WARNING that stale entries may remain until the module is upgraded. Any other failure
        closes the socket and raises.
        """
        client = cls(unit=unit, backend=backend, ack_timeout_s=ack_timeout_s)
        try:
            client.flush()
        except KmodError as exc:
            if exc.errno != errno.EINVAL:
                client.close()
                raise
            log.warning(
                "gpukmod: the loaded module cannot flush its table (older than this client); entries a "
                "previous agent left stay, and an armed one holds its namespace's first GPU ioctl for "
                "max_block_ms; run `gpushare kmod install` to load this version"
            )
        except BaseException:
            client.close()
            raise
        else:
            log.info("gpukmod: table flushed; entries of earlier runs are gone", extra=kv(unit=unit))
        return client

    def register(self) -> None:
        """Make this socket the one listener that notices go to (replaces any earlier one)."""
        self._command(Command(Verb.REGISTER))

    def flush(self) -> None:
        """Delete every entry of the module's table, whoever added it, ending every hold on them.

        A crashed agent leaves its entries behind, some armed; once a new listener registers,
        the first GPU ioctl from such a namespace (or from a new one that got its inode) would be
        held for ``max_block_ms`` on behalf of a plan nobody has any more.
        """
        self._command(Command(Verb.FLUSH))

    def add(self, *ids: int) -> None:
        """Put pid namespaces in the table, watched but not armed (already present is fine)."""
        self._command(Command(Verb.ADD, ids))

    def delete(self, *ids: int) -> None:
        """Take pid namespaces out of the table, ending any hold on them."""
        self._command(Command(Verb.DELETE, ids))

    def detect(self, *ids: int) -> None:
        """Arm: the next GPU ioctl from each namespace sends a notice and is held."""
        self._command(Command(Verb.DETECT, ids))

    def undetect(self, *ids: int) -> None:
        """Disarm, ending any hold on them."""
        self._command(Command(Verb.UNDETECT, ids))

    def release(self, *ids: int) -> None:
        """Let the held GPU ioctls of these namespaces run; later ones pass until ``detect``."""
        self._command(Command(Verb.RELEASE, ids))

    def watch(self, *ids: int) -> None:
        """``add`` then ``detect``: what the controller does when an owner goes away (design §6)."""
        self.add(*ids)
        self.detect(*ids)

    def send_raw(self, payload: bytes, msg_type: int = MSG_COMMAND) -> int:
        """Send any payload and return the kernel's errno (0 = accepted). For tests and tools."""
        return self._request(msg_type, payload)

    def _command(self, command: Command) -> None:
        try:
            payload = encode_command(command)
        except CommandRejected as exc:
            raise KmodError(exc.errno, command.verb.value, exc.reason) from exc
        code = self._request(MSG_COMMAND, payload)
        if code:
            raise KmodError(code, command.verb.value, f"ids {list(command.ids)}" if command.ids else "")
        log.debug("gpukmod command done", extra={"verb": command.verb.value, "ids": list(command.ids)})

    def _request(self, msg_type: int, payload: bytes) -> int:
        seq = next(self._seq) & 0xFFFFFFFF
        with self._lock:
            self._transport.send(msg_type, NLM_F_REQUEST | NLM_F_ACK, seq, payload)
        deadline = time.monotonic() + self._ack_timeout_s
        while True:
            with self._lock:
                if seq in self._acks:
                    return self._acks.pop(seq)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise KmodError(errno.ETIMEDOUT, "command", f"no ACK for message {seq}")
                self._file(self._transport.receive(min(left, _SLICE_S)))

    def _file(self, messages: list[Message]) -> None:
        for msg in messages:
            if msg.type == NLMSG_ERROR:
                self._acks[ack_seq(msg)] = decode_ack(msg)
            elif msg.type == MSG_NOTICE:
                self._notices.append(decode_notice(msg))
            else:
                log.warning("gpukmod: ignoring unexpected netlink message type %d", msg.type)

    # -- notices ------------------------------------------------------------------------------

    def next_notice(self, timeout_s: float | None = None) -> int | None:
        """The next notice's pid-namespace inode, or ``None`` if ``timeout_s`` passes first."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            with self._lock:
                if self._notices:
                    return self._notices.popleft()
                left = _SLICE_S if deadline is None else min(deadline - time.monotonic(), _SLICE_S)
                if left <= 0 or self._stop.is_set():
                    return None
                self._file(self._transport.receive(left))

    def notices(self, timeout_s: float | None = None) -> Iterator[int]:
        """Yield notices as they come; stop after ``timeout_s`` without one (``None``: until closed)."""
        while not self._stop.is_set():
            inode = self.next_notice(timeout_s)
            if inode is None:
                if timeout_s is not None:
                    return
                continue
            yield inode

    def start_notices(self, callback: Callable[[int], None], *, name: str = "gpushare-kmod-notices") -> None:
        """Call ``callback(inode)`` for each notice on a named thread until ``close``."""
        if self._thread is not None:
            raise KmodError(errno.EBUSY, "notices", "a notice thread is already running for this client")

        def run() -> None:
            for inode in self.notices(None):
                try:
                    callback(inode)
                except Exception:  # a broken callback must not end the reader
                    log.exception("gpukmod: notice callback failed for pidns %d", inode)

        self._thread = threading.Thread(target=run, name=name, daemon=True)
        self._thread.start()

    # -- lifetime -----------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the notice thread, close the socket (idempotent). Needed before ``unload``."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None
        with self._lock:
            self._transport.close()

    def __enter__(self) -> KmodClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
