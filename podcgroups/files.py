"""Reading and writing cgroupfs control files, v1 and v2, with one rule for a cgroup that is gone.

A cgroup directory vanishes when its last task has died and its owner (runc, kubelet) removes
it; a file of it then reads as absent (ENOENT), or as ENODEV through a descriptor opened
before. Both mean "no task left", never an error. Any other failure (EACCES, EROFS, EPERM)
becomes ``ProcessError`` naming the file, chained to the ``OSError``.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from podcgroups.errors import ProcessError

PROCS = "cgroup.procs"  # v1 and v2: the thread-group ids of the cgroup's own tasks
EVENTS = "cgroup.events"  # v2: "populated 0|1" (this cgroup or any below holds a task), "frozen 0|1"
KILL = "cgroup.kill"  # v2, Linux >= 5.14: writing "1" SIGKILLs every task below, forks included
FREEZE = "cgroup.freeze"  # v2, Linux >= 5.2: "1" freezes every task below, "0" thaws
FREEZER_STATE = "freezer.state"  # v1 freezer hierarchy: FROZEN / FREEZING / THAWED
_GONE = (errno.ENOENT, errno.ENODEV)


def _read(path: Path) -> bytes | None:
    """The file's bytes; None when the cgroup is gone. os-level: a kill reads many of these per ms."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in _GONE:
            return None
        raise ProcessError(f"gpushare: cannot read {path}: {exc.strerror}") from exc
    try:
        chunks: list[bytes] = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError as exc:
        if exc.errno in _GONE:
            return None
        raise ProcessError(f"gpushare: cannot read {path}: {exc.strerror}") from exc
    finally:
        os.close(fd)


def read_pids(path: Path) -> list[int]:
    """The pids a ``cgroup.procs`` lists; empty when the cgroup is gone."""
    data = _read(path)
    if data is None:
        return []
    try:
        return [int(x) for x in data.split()]
    except ValueError as exc:
        raise ProcessError(f"gpushare: {path} holds something other than pids: {data[:80]!r}") from exc


def subdirs(d: Path) -> list[Path]:
    """The cgroups right below ``d``; empty when it is gone."""
    try:
        with os.scandir(d) as entries:
            return [Path(e.path) for e in entries if e.is_dir(follow_symlinks=False)]
    except OSError as exc:
        if exc.errno in (*_GONE, errno.ENOTDIR):
            return []
        raise ProcessError(f"gpushare: cannot list {d}: {exc.strerror}") from exc


def tree_dirs(top: Path) -> list[Path]:
    """``top`` and every cgroup below it, parents first; empty when ``top`` is gone."""
    return [d for d, _ in tree(top)]


def tree(top: Path) -> list[tuple[Path, bool]]:
    """``(cgroup, is_leaf)`` for ``top`` and every cgroup below it, parents first; empty when ``top`` is gone.

    cgroupfs (kernfs) gives a directory 2 + its subdirectories as link count, so a container's
    cgroup (``st_nlink`` 2) is known to be a leaf from one ``stat``, without listing its files.
    """
    out: list[tuple[Path, bool]] = []
    stack = [top]
    while stack:
        d = stack.pop()
        try:
            with os.scandir(d) as entries:
                subdirs = [e for e in entries if e.is_dir(follow_symlinks=False)]
            for e in subdirs:
                if e.stat(follow_symlinks=False).st_nlink == 2:
                    out.append((Path(e.path), True))
                else:
                    stack.append(Path(e.path))
        except OSError as exc:
            if exc.errno in (*_GONE, errno.ENOTDIR):
                continue
            raise ProcessError(f"gpushare: cannot list {d}: {exc.strerror}") from exc
        out.append((d, not subdirs))
    return out


def tree_pids(top: Path) -> list[int]:
    """Every task in ``top`` and in every cgroup below it (a pod: all its containers, ones made meanwhile)."""
    return [pid for d in tree_dirs(top) for pid in read_pids(d / PROCS)]


def write_control(path: Path, value: str) -> bool:
    """Write a control file; False if the cgroup is gone (its tasks are then gone too)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)  # O_TRUNC: what a shell's ">" does
        try:
            os.write(fd, value.encode())
        finally:
            os.close(fd)
        return True
    except OSError as exc:
        if exc.errno in _GONE:
            return False
        raise ProcessError(f"gpushare: cannot write {value!r} to {path}: {exc.strerror}") from exc


def read_events(d: Path) -> dict[str, int] | None:
    """A v2 cgroup's ``cgroup.events`` as ``{"populated": 0|1, "frozen": 0|1}``; None when it is gone."""
    path = d / EVENTS
    data = _read(path)
    if data is None:
        return None
    text = data.decode("ascii", "replace")
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if not value.strip().isdigit():
            raise ProcessError(f"gpushare: {path} line is not '<key> <number>': {line!r}")
        out[key] = int(value)
    return out


def is_populated(d: Path) -> bool:
    """True while a task is in the v2 cgroup ``d`` or below it (``populated 1``); False once gone.

    The kernel drops an exiting task in ``cgroup_exit``, before it is reaped, so a zombie
    does not keep its cgroup populated: ``populated 0`` is "every task has died".
    """
    events = read_events(d)
    if events is None:
        return False
    if "populated" not in events:
        raise ProcessError(f"gpushare: {d / EVENTS} has no 'populated' line: not a cgroup v2 directory?")
    return events["populated"] != 0


def freezer_state(d: Path) -> str:
    """A v1 freezer cgroup's state; ``GONE`` when it no longer exists."""
    try:
        return (d / FREEZER_STATE).read_text().strip()
    except FileNotFoundError:
        return "GONE"


__all__ = [
    "EVENTS",
    "FREEZE",
    "FREEZER_STATE",
    "KILL",
    "PROCS",
    "freezer_state",
    "is_populated",
    "read_events",
    "read_pids",
    "subdirs",
    "tree",
    "tree_dirs",
    "tree_pids",
    "write_control",
]
