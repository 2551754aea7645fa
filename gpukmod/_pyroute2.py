"""The pyroute2 backend: the same protocol framed and parsed by pyroute2's own classes.

It is the fallback when the C extension is missing, and the independent peer in the guest
tests: header layout, ACK and notice parsing here come from pyroute2, not from
``gpukmod.protocol``'s codec, so the two backends check each other against the kernel.
"""

from __future__ import annotations

import errno
import select

from pyroute2.netlink import nlmsg, nlmsgerr  # ImportError when pyroute2 is missing
from pyroute2.netlink.nlsocket import NetlinkSocket

from gpukmod.errors import KmodError
from gpukmod.protocol import MSG_NOTICE, NLMSG_ERROR, Message

_RECV_BUF = 65536


class _Notice(nlmsg):  # type: ignore[misc]
    fields = (("inode", "Q"),)


def _command_class(size: int) -> type[nlmsg]:
    # A fixed-size raw field keeps any bytes (the garbage tests send NULs and high bytes).
    return type("GpukmodCommand", (nlmsg,), {"fields": (("payload", f"{size}s"),)})


def _parse(buf: bytes) -> list[Message]:
    out: list[Message] = []
    pos = 0
    while pos < len(buf):
        head = nlmsg(buf[pos:])
        head.decode()
        hdr = head["header"]
        length = int(hdr["length"])
        if length < 16 or pos + length > len(buf):
            raise KmodError(errno.EPROTO, "receive", f"pyroute2: bad message length {length} at {pos}")
        chunk = buf[pos : pos + length]
        if hdr["type"] == NLMSG_ERROR:
            err = nlmsgerr(chunk)
            err.decode()
            payload = int(err["error"]).to_bytes(4, "little", signed=True) + chunk[20:]
        elif hdr["type"] == MSG_NOTICE and length == 24:
            notice = _Notice(chunk)
            notice.decode()
            payload = int(notice["inode"]).to_bytes(8, "little")
        else:
            payload = chunk[16:]
        out.append(Message(int(hdr["type"]), int(hdr["flags"]), int(hdr["sequence_number"]), int(hdr["pid"]), payload))
        pos += (length + 3) & ~3
    return out


class Pyroute2Transport:
    """A pyroute2 ``NetlinkSocket`` on the gpukmod unit."""

    name = "pyroute2"

    def __init__(self, unit: int) -> None:
        try:
            self._sock: NetlinkSocket | None = NetlinkSocket(family=unit)
            self._sock.bind()
            self._raw = self._sock.asyncore.socket
            self.portid = int(self._raw.getsockname()[0])
        except OSError as exc:
            raise KmodError(exc.errno or errno.EIO, "open", f"netlink unit {unit} (pyroute2)") from exc

    def send(self, msg_type: int, flags: int, seq: int, payload: bytes) -> None:
        if self._sock is None:
            raise KmodError(errno.EBADF, "netlink", "the socket is closed")
        msg = _command_class(len(payload))()
        msg["header"]["type"] = msg_type
        msg["header"]["flags"] = flags
        msg["header"]["sequence_number"] = seq
        msg["header"]["pid"] = self.portid
        msg["payload"] = payload
        msg.encode()
        try:
            self._raw.sendto(bytes(msg.data), (0, 0))
        except OSError as exc:
            raise KmodError(exc.errno or errno.EIO, "send") from exc

    def receive(self, timeout_s: float) -> list[Message]:
        if self._sock is None:
            raise KmodError(errno.EBADF, "netlink", "the socket is closed")
        try:
            ready, _, _ = select.select([self._raw], [], [], max(0.0, timeout_s))
            if not ready:
                return []
            return _parse(self._raw.recv(_RECV_BUF))
        except OSError as exc:
            raise KmodError(exc.errno or errno.EIO, "receive") from exc

    def close(self) -> None:
        if self._sock is not None:
            sock, self._sock = self._sock, None
            self._raw.close()
            sock.close()
