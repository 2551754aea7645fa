"""The cffi backend: the C helper in cffi_build/ (the only module that touches cffi)."""

from __future__ import annotations

import errno

from gpukmod._native_c import (  # type: ignore[import-not-found,unused-ignore]  # built by cffi
    ffi,
    lib,
)  # ImportError when the extension is not built
from gpukmod.errors import KmodError
from gpukmod.protocol import Message, decode_messages, encode_message

_RECV_BUF = 65536
_VERSION_BUF = 128


def _check(code: int, op: str, detail: str = "") -> int:
    if code < 0:
        raise KmodError(-code, op, detail)
    return code


class NativeTransport:
    """A netlink socket opened, bound and driven by the C helper."""

    name = "native"

    def __init__(self, unit: int) -> None:
        fd = ffi.new("int *")
        portid = ffi.new("unsigned int *")
        _check(lib.gk_nl_open(unit, 0, fd, portid), "open", f"netlink unit {unit}")
        self._fd: int | None = fd[0]
        self.portid = int(portid[0])
        self._buf = ffi.new("char[]", _RECV_BUF)

    def _live_fd(self) -> int:
        if self._fd is None:
            raise KmodError(errno.EBADF, "netlink", "the socket is closed")
        return self._fd

    def send(self, msg_type: int, flags: int, seq: int, payload: bytes) -> None:
        data = encode_message(msg_type, payload, seq=seq, pid=self.portid, flags=flags)
        _check(lib.gk_nl_send(self._live_fd(), data, len(data)), "send")

    def receive(self, timeout_s: float) -> list[Message]:
        n = lib.gk_nl_recv(self._live_fd(), self._buf, _RECV_BUF, max(0, int(timeout_s * 1000)))
        if n == -errno.ETIMEDOUT:
            return []
        _check(n, "receive")
        try:
            return decode_messages(bytes(ffi.buffer(self._buf, n)))
        except ValueError as exc:
            raise KmodError(errno.EPROTO, "receive", str(exc)) from exc

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            lib.gk_nl_close(fd)


class NativeModuleOps:
    """finit_module / delete_module / sysfs version through the C helper."""

    def load(self, path: str, params: str) -> None:
        _check(lib.gk_module_load(path.encode(), params.encode()), "load", path)

    def unload(self, name: str) -> None:
        code = lib.gk_module_unload(name.encode())
        if code == -errno.EWOULDBLOCK:
            code = -errno.EAGAIN
        _check(code, "unload", name)

    def version(self, name: str) -> str | None:
        buf = ffi.new("char[]", _VERSION_BUF)
        code = lib.gk_module_version(name.encode(), buf, _VERSION_BUF)
        if code == -errno.ENOENT:
            return None
        _check(code, "version", name)
        return str(ffi.string(buf).decode("utf-8", "replace"))
