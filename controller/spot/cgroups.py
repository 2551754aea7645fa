"""Where a container's processes are: its cgroup (v1, cgroupfs or systemd driver), found by container ID.

Spot kills a borrower container whole, and watches the pid namespace of an owner
container's first process; both start from the container's cgroup. runc puts a container
in the same relative path in every v1 hierarchy: ``.../<container id>`` with the cgroupfs
driver, ``.../cri-containerd-<id>.scope`` with the systemd one. A cgroup's ``cgroup.procs``
lists its live tasks; the kernel drops an exiting task from that list in ``cgroup_exit``
(zombies are not listed), which is what "dead" means to spot.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from controller.errors import ProcessError

CGROUP_ROOT = "/sys/fs/cgroup"
PROC_ROOT = "/proc"
# Hierarchies that list a container's tasks, best first: the freezer one can also stop forks.
_TASK_HIERARCHIES = ("freezer", "pids", "memory", "devices", "systemd")  # not cpu: ExitBoost moves tasks there


def _read_pids(path: Path) -> list[int]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []  # the cgroup is gone: runc removed it after the last task died
    except OSError as exc:
        raise ProcessError(f"gpushare: cannot read {path}: {exc.strerror}") from exc
    return [int(x) for x in text.split()]


@dataclass(frozen=True)
class ContainerCgroup:
    """Where one container's tasks live: ``<root>/<hierarchy><rel_path>`` for each v1 hierarchy."""

    container_id: str
    rel_path: str  # "/kubepods/besteffort/pod<uid>/<id>", the same in every v1 hierarchy
    cgroup_root: str = CGROUP_ROOT

    def dir(self, hierarchy: str) -> Path:
        return Path(self.cgroup_root, hierarchy, self.rel_path.lstrip("/"))

    @property
    def freezer_dir(self) -> Path | None:
        d = self.dir("freezer")
        return d if (d / "freezer.state").exists() else None

    @property
    def tasks_file(self) -> Path:
        """The ``cgroup.procs`` of the first hierarchy holding this cgroup."""
        for h in _TASK_HIERARCHIES:
            f = self.dir(h) / "cgroup.procs"
            if f.exists():
                return f
        return self.dir(_TASK_HIERARCHIES[0]) / "cgroup.procs"

    def pids(self) -> list[int]:
        """Thread-group ids now in the cgroup (empty when it is gone)."""
        return _read_pids(self.tasks_file)

    def first_pid(self, *, proc_root: str = PROC_ROOT) -> int | None:
        """The container's first process: the task whose parent is outside the cgroup (runc's init).

        ``None`` when the cgroup is empty. With several such tasks (``exec``'d ones have the
        shim as parent too) the oldest by start time wins, which is the container's init.
        """
        pids = self.pids()
        inside = set(pids)
        roots: list[tuple[int, int]] = []
        for pid in pids:
            stat = _proc_stat(pid, proc_root)
            if stat is None:
                continue
            ppid, start = stat
            if ppid not in inside:
                roots.append((start, pid))
        return min(roots)[1] if roots else None


def _proc_stat(pid: int, proc_root: str) -> tuple[int, int] | None:
    """(ppid, start time in ticks) of ``pid``, or None if it has exited."""
    try:
        text = Path(proc_root, str(pid), "stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: split after the last ')'.
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[1]), int(fields[19])


def _matches(name: str, container_id: str) -> bool:
    # cgroupfs driver: the directory is the ID; systemd driver: cri-containerd-<id>.scope.
    return name == container_id or (name.endswith(".scope") and name.removesuffix(".scope").endswith(container_id))


class CgroupIndex:
    """Finds a container's cgroup by its ID, by walking one v1 hierarchy; caches what it found.

    The walk happens when a borrower is first seen (``locate``), so the kill itself only
    reads the cached path. A cached path whose directory vanished is looked up again.
    """

    def __init__(self, *, cgroup_root: str = CGROUP_ROOT, hierarchy: str | None = None) -> None:
        self._root = cgroup_root
        self._hierarchy = hierarchy or next(
            (h for h in _TASK_HIERARCHIES if Path(cgroup_root, h).is_dir()), _TASK_HIERARCHIES[0]
        )
        self._cache: dict[str, ContainerCgroup] = {}

    def locate(self, container_ids: Iterable[str]) -> dict[str, ContainerCgroup]:
        """``{id: cgroup}`` for the IDs found; missing IDs (container gone or not started) are left out."""
        wanted = [c for c in container_ids if c]
        out: dict[str, ContainerCgroup] = {}
        missing: set[str] = set()
        for cid in wanted:
            cg = self._cache.get(cid)
            if cg is not None and cg.dir(self._hierarchy).is_dir():
                out[cid] = cg
            else:
                self._cache.pop(cid, None)
                missing.add(cid)
        if missing:
            base = Path(self._root, self._hierarchy)
            for dirpath, dirnames, _ in os.walk(base):
                for name in dirnames:
                    hit = next((c for c in missing if _matches(name, c)), None)
                    if hit is not None:
                        rel = "/" + str(Path(dirpath, name).relative_to(base))
                        out[hit] = self._cache[hit] = ContainerCgroup(hit, rel, self._root)
                        missing.discard(hit)
                if not missing:
                    break
        return out

    def forget(self, container_ids: Iterable[str]) -> None:
        for cid in container_ids:
            self._cache.pop(cid, None)


__all__ = ["CGROUP_ROOT", "PROC_ROOT", "CgroupIndex", "ContainerCgroup"]
