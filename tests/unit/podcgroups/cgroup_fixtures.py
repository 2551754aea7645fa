"""Recorded cgroup inputs (tests/fixtures/cgroups/) made into directory trees, and a stand-in kernel for them.

``load_tree`` reads a ``trees/*.tsv`` file (one cgroup per line: path, TAB, its pids);
``materialize`` builds it under a tmp dir with the control files each version has, as plain
files. ``FakeKernel`` then plays the kernel's part on such a tree so the killer's control
flow runs without root: it acts on ``cgroup.kill`` and ``cgroup.freeze`` writes, drops dead
tasks from ``cgroup.procs`` and keeps ``cgroup.events`` right. Its tasks are real child
processes of the test, so the killer's SIGKILLs are real; the only other pids it lists are
above the kernel's highest possible pid, which no signal can reach.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "cgroups"
GHOST_PID = 4 * 1024 * 1024 + 1000  # above PID_MAX_LIMIT: kill() answers ESRCH, nothing can be hit
V1_HIERARCHIES = ("freezer", "pids")


@dataclass(frozen=True)
class RecordedTree:
    name: str
    version: str  # "v1" | "v2"
    hierarchy: str  # the v1 hierarchy it was recorded in; "" for v2
    kubelet_root: str | None
    cgroups: dict[str, list[int]]  # path from the hierarchy root -> pids in its cgroup.procs


def load_tree(name: str) -> RecordedTree:
    meta: dict[str, str] = {}
    cgroups: dict[str, list[int]] = {}
    for line in (FIXTURES / "trees" / name).read_text().splitlines():
        if line.startswith("# ") and ": " in line and " " not in line[2:].split(": ", 1)[0]:
            key, value = line[2:].split(": ", 1)
            meta[key] = value
        elif line and not line.startswith("#"):
            path, _, pids = line.partition("\t")
            cgroups[path] = [int(p) for p in pids.split()]
    return RecordedTree(name, meta["version"], meta.get("hierarchy", ""), meta.get("kubelet-root"), cgroups)


def proc_text(name: str) -> str:
    return (FIXTURES / "proc" / name).read_text()


def _populated(cgroups: dict[str, list[int]], path: str) -> bool:
    return any(pids for p, pids in cgroups.items() if p == path or p.startswith(path + "/"))


def write_cgroup(d: Path, version: str, pids: list[int], *, populated: bool, hierarchy: str = "") -> None:
    """One cgroup directory with the files its version has, as plain files."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "cgroup.procs").write_text("".join(f"{p}\n" for p in pids))
    if version == "v2":
        (d / "cgroup.events").write_text(f"populated {int(populated)}\nfrozen 0\n")
        (d / "cgroup.kill").write_text("")
        (d / "cgroup.freeze").write_text("0\n")
        (d / "cgroup.type").write_text("domain\n")
    else:
        (d / "tasks").write_text("".join(f"{p}\n" for p in pids))
        (d / "notify_on_release").write_text("0\n")
        if hierarchy == "freezer":
            (d / "freezer.state").write_text("THAWED\n")


def materialize(tree: RecordedTree, root: Path) -> Path:
    """Build ``tree`` under ``root`` as a cgroup mount point would look; returns the cgroup root to use."""
    if tree.version == "v2":
        root.mkdir(parents=True, exist_ok=True)
        (root / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids rdma misc\n")
        (root / "cgroup.procs").write_text("")
        for path, pids in tree.cgroups.items():
            write_cgroup(root / path, "v2", pids, populated=_populated(tree.cgroups, path))
        return root
    for h in V1_HIERARCHIES:
        (root / h).mkdir(parents=True, exist_ok=True)
        (root / h / "cgroup.procs").write_text("")
        for path, pids in tree.cgroups.items():
            write_cgroup(root / h / path, "v1", pids, populated=True, hierarchy=h)
    return root


@dataclass
class FakeKernel:
    """The kernel's side of a tmp cgroup tree whose tasks are this test's child processes."""

    top: Path  # the pod's (or any) cgroup: everything below it is looked after
    version: str
    children: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    kill_writes: int = 0
    freeze_values: list[str] = field(default_factory=list)
    on_first_kill: list[Callable[[], None]] = field(default_factory=list)  # run once, at the first death
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _killed_once: bool = False

    def spawn(self, cgroup: Path) -> int:
        """A real sleeper, listed in ``cgroup`` (made if needed)."""
        if not cgroup.is_dir():
            write_cgroup(cgroup, self.version, [], populated=False, hierarchy="freezer")
        p = subprocess.Popen(["sleep", "300"])
        self.children[p.pid] = p
        with (cgroup / "cgroup.procs").open("a") as f:
            f.write(f"{p.pid}\n")
        return p.pid

    def start(self) -> FakeKernel:
        self._tick()
        self._thread = threading.Thread(target=self._run, name="fake-cgroup-kernel")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        for p in self.children.values():
            if p.poll() is None:
                p.kill()
            p.wait(5)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._tick()
            time.sleep(0.001)

    def _dirs(self) -> list[Path]:
        return [self.top, *sorted(d for d in self.top.rglob("*") if d.is_dir())] if self.top.is_dir() else []

    def _tick(self) -> None:
        kill = self.top / "cgroup.kill"
        if self.version == "v2" and kill.is_file():
            with kill.open("r+") as f:
                if f.read().strip() == "1":
                    f.seek(0)
                    f.truncate()
                    self.kill_writes += 1
                    for d in self._dirs():
                        for pid in _pids(d):
                            self._kill(pid)
        self._refresh()

    def _kill(self, pid: int) -> None:
        p = self.children.get(pid)
        if p is not None and p.poll() is None:
            p.send_signal(signal.SIGKILL)

    def _refresh(self) -> None:
        """Drop dead children from every cgroup.procs; recompute cgroup.events bottom-up."""
        dead = {pid for pid, p in self.children.items() if p.poll() is not None}  # one look, used throughout
        if not self._killed_once and dead:
            # Before the tree is read: what a hook adds is in this very refresh, so the pod is never
            # shown empty while the newcomer runs.
            self._killed_once = True
            for hook in self.on_first_kill:
                hook()
        populated: dict[Path, bool] = {}
        for d in reversed(self._dirs()):
            pids = _pids(d)
            alive = [p for p in pids if p not in dead]
            if alive != pids:
                _replace(d / "cgroup.procs", "".join(f"{p}\n" for p in alive))
            populated[d] = bool(alive) or any(v for c, v in populated.items() if c.parent == d)
            if self.version == "v2":
                if d == self.top and (d / "cgroup.freeze").is_file():
                    # Read after the deaths above and before "populated 0" is written: the killer
                    # thaws only once it sees that, so a freeze during the kill is always seen here.
                    value = (d / "cgroup.freeze").read_text().strip()
                    if not self.freeze_values or self.freeze_values[-1] != value:
                        self.freeze_values.append(value)
                frozen = (d / "cgroup.freeze").is_file() and self._frozen(d)
                _replace(d / "cgroup.events", f"populated {int(populated[d])}\nfrozen {int(frozen)}\n")

    def _frozen(self, d: Path) -> bool:
        for level in [d, *d.parents]:
            f = level / "cgroup.freeze"
            if f.exists() and f.read_text().strip() == "1":
                return True
            if level == self.top:
                break
        return False


def _pids(d: Path) -> list[int]:
    try:
        return [int(x) for x in (d / "cgroup.procs").read_text().split()]
    except FileNotFoundError:
        return []


def _replace(path: Path, text: str) -> None:
    """Swap the file whole, so the killer reading it never sees half of it."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(text)
    os.replace(tmp, path)


@contextlib.contextmanager
def running(kernel: FakeKernel) -> Iterator[FakeKernel]:
    kernel.start()
    try:
        yield kernel
    finally:
        kernel.stop()
