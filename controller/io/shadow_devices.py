"""``ShadowDevices``: the device nodes each running shadow's ``main`` container really has.

A shadow holds its GPU for its sharers, but the node's container stack decides whether the
container gets the GPU: NVIDIA's device plugin in its ``envvar`` strategy under plain runc gives no
container a GPU at all, and a runtime that adds the GPU does so after the NRI plugin has seen the
container (docs/nvidia.md). So the only place to see it is the running container: the character
devices under ``/proc/<pid>/root/dev`` (and ``dev/dri``) once NRI says the container started.

The NRI plugin calls ``note(shadow, container_id, pid, uid)`` (PostStartContainer, and
Synchronize's running containers after a restart); the loop reads ``observed()`` each pass and uses
an entry only for the container kubelet reports as that shadow's ``main`` now, so a reading of an
earlier shadow of the same name, or of an earlier container of it, is never taken for the current
one. Until kubelet reports the container at all (its pod status follows the start by up to a
second: PLEG's relist), ``started()`` takes the reading of the pod with the shadow's uid.

The NRI plugin also calls ``note_created(shadow, uid)`` once the shadow's ``main`` is in its cache
(CreateContainer): from then on a sharer's container can take its GPU from it, so ``created()``
is what lets the node offer the shadow's slots before kubelet says it runs (the first sharer of a
share key waits for them). Reading is a few ``scandir`` calls; a container that exited before it
was read is simply not observed.
"""

from __future__ import annotations

import logging
import os
import stat
import threading

from gpushare.log import kv

log = logging.getLogger(__name__)

PROC_ROOT = "/proc"
_DEV_DIRS = ("dev", "dev/dri")
_MAX_SHADOWS = 4096


def device_nodes(pid: int, *, proc_root: str = PROC_ROOT) -> tuple[str, ...]:
    """The character devices of a process's root under ``/dev`` and ``/dev/dri``, as paths in it."""
    found: list[str] = []
    for sub in _DEV_DIRS:
        try:
            entries = list(os.scandir(f"{proc_root}/{pid}/root/{sub}"))
        except OSError:
            continue
        for entry in entries:
            try:
                if stat.S_ISCHR(entry.stat(follow_symlinks=False).st_mode):
                    found.append(f"/{sub}/{entry.name}")
            except OSError:
                continue
    return tuple(sorted(found))


class ShadowDevices:
    def __init__(self, *, proc_root: str = PROC_ROOT) -> None:
        self._proc_root = proc_root
        self._lock = threading.Lock()
        self._seen: dict[str, tuple[str, tuple[str, ...]]] = {}  # shadow -> (container ID, its nodes)
        self._uids: dict[str, str] = {}  # shadow -> the pod uid of the container last noted
        self._created: dict[str, str] = {}  # shadow -> the pod uid whose main container the NRI plugin holds

    def note(self, shadow: str, container_id: str, pid: int, uid: str = "") -> None:
        nodes = device_nodes(pid, proc_root=self._proc_root)
        if not nodes and not os.path.exists(f"{self._proc_root}/{pid}"):
            return  # it exited before it could be read: nothing is known
        with self._lock:
            if len(self._seen) >= _MAX_SHADOWS and shadow not in self._seen:
                self._uids.pop(oldest := next(iter(self._seen)), None)
                self._seen.pop(oldest)
            self._seen[shadow] = (container_id, nodes)
            self._uids[shadow] = uid
        log.info("shadow started", extra=kv(shadow=shadow, container=container_id[:12], device_nodes=len(nodes)))

    def observed(self, current: dict[str, str] | None = None) -> dict[str, tuple[str, ...]]:
        """Shadow -> its main container's nodes; with ``current`` (shadow -> the main container ID
        kubelet reports), only readings of exactly those containers."""
        with self._lock:
            seen = dict(self._seen)
        return {k: nodes for k, (cid, nodes) in seen.items() if current is None or current.get(k) == cid}

    def note_created(self, shadow: str, uid: str) -> None:
        with self._lock:
            if len(self._created) >= _MAX_SHADOWS and shadow not in self._created:
                self._created.pop(next(iter(self._created)))
            self._created[shadow] = uid
        log.info("shadow created", extra=kv(shadow=shadow))

    def created(self, uids: dict[str, str]) -> frozenset[str]:
        """The shadows of ``uids`` (shadow -> pod uid) whose main container the NRI plugin holds."""
        with self._lock:
            return frozenset(k for k, uid in uids.items() if uid and self._created.get(k) == uid)

    def started(self, uids: dict[str, str]) -> dict[str, tuple[str, ...]]:
        """Shadow -> its main container's nodes, for the shadows in ``uids`` (shadow -> pod uid, those
        whose main container kubelet does not report yet) whose container was noted for that uid."""
        with self._lock:
            return {
                k: self._seen[k][1] for k, uid in uids.items() if uid and k in self._seen and self._uids.get(k) == uid
            }

    def keep_only(self, shadows: set[str]) -> None:
        """Forget shadows that are gone (the loop's list of this node's shadows)."""
        with self._lock:
            for key in [k for k in self._seen if k not in shadows]:
                del self._seen[key]
                self._uids.pop(key, None)
            for key in [k for k in self._created if k not in shadows]:
                del self._created[key]
