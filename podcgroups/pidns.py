"""The pid-namespace inode of a container's first process: the id gpukmod's table holds for an owner.

``stat(/proc/<pid>/ns/pid).st_ino`` of the container's init, found through its cgroup. A
container's pid namespace never changes, so ``PidnsCache`` keeps what it found; one whose
cgroup is not there yet (not started) or any more is looked for again only after a pause.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

from podcgroups.cgroups import PROC_ROOT, CgroupIndex
from podcgroups.errors import ProcessError

log = logging.getLogger(__name__)

PIDNS_RETRY_S = 5.0  # how long a container whose cgroup was not found is not looked for again
_MAX_ENTRIES = 4096  # containers come and go; neither map grows without bound


def pidns_inode(pid: int, *, proc_root: str = PROC_ROOT) -> int:
    """The pid-namespace inode of ``pid`` (what gpukmod's table holds)."""
    path = f"{proc_root}/{pid}/ns/pid"
    try:
        return os.stat(path).st_ino
    except FileNotFoundError as exc:
        raise ProcessError(f"gpushare: {path} does not exist: process {pid} has exited") from exc
    except OSError as exc:
        raise ProcessError(f"gpushare: cannot stat {path}: {exc.strerror}; the agent needs root and hostPID") from exc


class PidnsCache:
    """Container ID -> pid-namespace inode of its first process, through the killer's ``CgroupIndex``.

    Sharing the killer's index means an owner's cgroup, once located here, is not walked for again.
    """

    def __init__(
        self,
        index: CgroupIndex,
        *,
        proc_root: str = PROC_ROOT,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._index = index
        self._proc_root = proc_root
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._pidns: dict[str, int] = {}
        self._missing: dict[str, float] = {}

    def lookup(self, container_id: str) -> int | None:
        """The inode, or None while the container has no cgroup or no process."""
        now = self._monotonic()
        with self._lock:
            if container_id in self._pidns:
                return self._pidns[container_id]
            # The loop asks for every container every pass; one not found (exited, not started)
            # is looked for again only after a pause, so the cgroup walk stays off most passes.
            if now - self._missing.get(container_id, -PIDNS_RETRY_S) < PIDNS_RETRY_S:
                return None
        cg = self._index.locate([container_id]).get(container_id)
        if cg is None:
            with self._lock:
                if len(self._missing) > _MAX_ENTRIES:
                    self._missing.clear()
                self._missing[container_id] = now
            return None
        try:
            pid = cg.first_pid(proc_root=self._proc_root)
            inode = None if pid is None else pidns_inode(pid, proc_root=self._proc_root)
        except ProcessError as exc:
            log.debug("spot: no pidns for %s: %s", container_id, exc)
            return None
        if inode is not None:
            with self._lock:
                if len(self._pidns) > _MAX_ENTRIES:
                    self._pidns.clear()
                self._pidns[container_id] = inode
        return inode


__all__ = ["PIDNS_RETRY_S", "PidnsCache", "pidns_inode"]
