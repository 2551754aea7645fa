"""inotify on the device-plugin directory through ctypes (no extra dependency).

Events are only *hints* that wake the manager's watch thread early: it then re-reads the
truth (``stat`` of kubelet.sock and of every plugin socket), so a missed, merged or
reordered event costs at most one check interval (docs/architecture.md: trust state, not events). When inotify is not
available (or the directory itself is removed and recreated) the watcher re-arms itself on
the next check, and the stat check alone still works.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

log = logging.getLogger(__name__)

_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
_IN_ATTRIB = 0x00000004
_IN_MOVED_FROM = 0x00000040
_IN_MOVED_TO = 0x00000080
_IN_CREATE = 0x00000100
_IN_DELETE = 0x00000200
_IN_DELETE_SELF = 0x00000400
_IN_MOVE_SELF = 0x00000800
_MASK = _IN_ATTRIB | _IN_MOVED_FROM | _IN_MOVED_TO | _IN_CREATE | _IN_DELETE | _IN_DELETE_SELF | _IN_MOVE_SELF


def _load_libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.inotify_init1.argtypes = [ctypes.c_int]
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _load_libc()


class DirWatch:
    """A non-blocking inotify fd on one directory; ``fileno()`` is -1 when unavailable."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = -1
        self._dir_id: tuple[int, int] | None = None
        if _LIBC is not None:
            fd = _LIBC.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
            if fd < 0:
                log.warning("inotify unavailable; using the stat check only", extra={"kv": {"dir": path}})
            self._fd = fd
        self.rearm()

    def fileno(self) -> int:
        return self._fd

    def rearm(self) -> None:
        """(Re)add the watch when the directory is new or was recreated since the last call."""
        if self._fd < 0 or _LIBC is None:
            return
        try:
            st = os.stat(self.path)
        except OSError:
            self._dir_id = None
            return
        dir_id = (st.st_dev, st.st_ino)
        if dir_id == self._dir_id:
            return
        if _LIBC.inotify_add_watch(self._fd, os.fsencode(self.path), _MASK) >= 0:
            self._dir_id = dir_id

    def drain(self) -> None:
        """Discard pending events: their content is not trusted, only the wake-up."""
        if self._fd < 0:
            return
        try:
            while os.read(self._fd, 65536):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
