"""Module load/unload without the C helper, through libc's syscall(2) (fallback only)."""

from __future__ import annotations

import ctypes
import errno
import os
from pathlib import Path

from gpukmod.errors import KmodError

_SYS_FINIT_MODULE = 313  # x86_64
_SYS_DELETE_MODULE = 176


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


class SyscallModuleOps:
    """The same operations as the C helper's, for when the extension is not built."""

    def load(self, path: str, params: str) -> None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise KmodError(exc.errno or errno.EIO, "load", path) from exc
        try:
            if _libc().syscall(_SYS_FINIT_MODULE, fd, params.encode(), 0) < 0:
                raise KmodError(ctypes.get_errno(), "load", path)
        finally:
            os.close(fd)

    def unload(self, name: str) -> None:
        if _libc().syscall(_SYS_DELETE_MODULE, name.encode(), os.O_NONBLOCK) < 0:
            code = ctypes.get_errno()
            raise KmodError(errno.EAGAIN if code == errno.EWOULDBLOCK else code, "unload", name)

    def version(self, name: str) -> str | None:
        try:
            return Path(f"/sys/module/{name}/version").read_text().strip()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise KmodError(exc.errno or errno.EIO, "version", name) from exc
