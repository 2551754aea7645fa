"""gpukmod errors.

    GpushareError
    └── KmodError(errno, op)         a module, netlink or build operation failed
        └── KmodUnavailable          neither backend can run here (extension and pyroute2 missing)

The message names the operation, the errno and what to do about it: the
C helper only returns ``-errno``; this is the one place that turns codes into advice.
"""

from __future__ import annotations

import errno as _errno
import os

from gpushare.errors import GpushareError

# (op, errno) first, then errno alone: the same code means different things per operation.
_HINTS: dict[tuple[str | None, int], str] = {
    ("unload", _errno.EAGAIN): "a netlink socket on the gpukmod unit is still open; close the listener socket "
    "(stop `gpushare kmod watch` or the agent) before unloading",
    ("unload", _errno.EBUSY): "the module is in use; close the listener socket before unloading",
    ("unload", _errno.ENOENT): "gpukmod is not loaded; nothing to unload",
    ("load", _errno.EEXIST): "gpukmod is already loaded; use `gpushare kmod install` to replace a different version",
    ("load", _errno.ENOEXEC): "the .ko was built for another kernel; rebuild with `gpushare kmod install`",
    ("load", _errno.EBUSY): "another IPMODIFY ftrace user (livepatch or a hook module) holds __x64_sys_ioctl, "
    "or the netlink unit is taken; see dmesg",
    ("load", _errno.ENOENT): "the .ko file does not exist; build it with `gpushare kmod install`",
    ("load", _errno.EINVAL): "a module parameter was refused (see dmesg for which)",
    ("open", _errno.EPROTONOSUPPORT): "gpukmod is not loaded; run `gpushare kmod load`",
    ("version", _errno.ENOENT): "gpukmod is not loaded; run `gpushare kmod load`",
    ("backend", _errno.ENOSYS): "reinstall with `pip install -e .` (builds the C helper) or install pyroute2",
    (None, _errno.EPERM): "this needs root (CAP_SYS_MODULE to load, CAP_NET_ADMIN to send commands)",
    (None, _errno.ENOENT): "an id is not in the module's table (add it first), or the module is not loaded "
    "(run `gpushare kmod load`)",
    (None, _errno.ENOSPC): "the module's table is full (256 namespaces); delete ids that are no longer watched",
    (None, _errno.EINVAL): "the kernel refused the command as malformed; see docs/gpukmod.md for the grammar",
    (None, _errno.ETIMEDOUT): "the kernel did not answer in time; is gpukmod loaded (`gpushare kmod status`)?",
    (None, _errno.ECONNREFUSED): "the module is gone; run `gpushare kmod load`",
}


def hint_for(op: str, code: int) -> str:
    """What to do about ``code`` during ``op`` (empty when we have no advice)."""
    return _HINTS.get((op, code)) or _HINTS.get((None, code)) or ""


class KmodError(GpushareError):
    """A gpukmod operation failed with ``errno`` (positive) during ``op``."""

    def __init__(self, errno: int, op: str, detail: str = "") -> None:
        self.errno = errno
        self.op = op
        self.detail = detail
        self.hint = hint_for(op, errno)
        name = _errno.errorcode.get(errno, str(errno))
        text = f"gpukmod: {op} failed: {os.strerror(errno)} ({name})"
        if detail:
            text += f": {detail}"
        if self.hint:
            text += f"; {self.hint}"
        super().__init__(text)


class KmodUnavailable(KmodError):
    """No backend can talk to the module: the C extension is not built and pyroute2 is missing."""

    def __init__(self, detail: str) -> None:
        super().__init__(_errno.ENOSYS, "backend", detail)
