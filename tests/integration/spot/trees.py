"""Real process trees in real cgroups v1, standing in for borrower containers.

``CgroupTrees(count, children)`` makes ``count`` cgroups ``/gs-spot-<pid>-<n>/c<i>`` in the
freezer and pids hierarchies (the same relative path in each, as runc's cgroupfs driver
does) and starts one tree per cgroup: a shell that is moved into the cgroup before it
execs, ``children`` sleepers, and a loop that keeps forking so a kill that is not
fork-safe leaves survivors. ``close()`` kills what is left and removes the cgroups.
Root and a mounted v1 freezer are required; ``skip_reason()`` says why not.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from types import TracebackType

from podcgroups.cgroups import CGROUP_ROOT, ContainerCgroup

HIERARCHIES = ("freezer", "pids")


def skip_reason() -> str:
    """Why real cgroup trees cannot be made here ("" when they can)."""
    if os.geteuid() != 0:
        return "needs root to create cgroups: run the tests as root (sudo .venv/bin/python -m pytest ...)"
    missing = [h for h in HIERARCHIES if not Path(CGROUP_ROOT, h, "cgroup.procs").exists()]
    if missing:
        return f"cgroup v1 hierarchies {missing} are not mounted under {CGROUP_ROOT} (mount -t cgroup -o freezer ...)"
    return ""


def tree_script(children: int, forker: bool) -> str:
    """The shell command of one tree (also run inside real containers by bench/spot_return.py)."""
    sleepers = " ".join(["sleep 300 &"] * children)
    # Forks a short-lived child every 10 ms: a fresh task may appear between a read and a kill,
    # while the tree stays the same size however long it runs.
    loop = "while :; do sleep 0.01; done &" if forker else ""
    # trap: a stray SIGTERM must not end the tree early; only SIGKILL is under test.
    return f"trap '' TERM; {sleepers} {loop} wait"


class CgroupTrees:
    """``count`` process trees, one per cgroup; ``cgroups`` are what the killer gets."""

    def __init__(self, count: int, *, children: int = 3, forker: bool = True) -> None:
        self.base = f"/gs-spot-{os.getpid()}-{time.monotonic_ns() % 10**9}"
        self.cgroups: list[ContainerCgroup] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        for h in HIERARCHIES:
            Path(CGROUP_ROOT, h, self.base.lstrip("/")).mkdir()
        try:
            for i in range(count):
                # Leaf names are unique on the host, like container IDs, so an index walk finds them.
                rel = f"{self.base}/{self.base.lstrip('/')}-c{i}"
                for h in HIERARCHIES:
                    Path(CGROUP_ROOT, h, rel.lstrip("/")).mkdir()
                cg = ContainerCgroup(rel.rsplit("/", 1)[1], rel)
                self.cgroups.append(cg)
                files = [str(Path(cg.dir(h), "cgroup.procs")) for h in HIERARCHIES]
                self.procs.append(
                    subprocess.Popen(
                        # The shell joins its cgroup before it starts any child.
                        ["sh", "-c", "".join(f"echo $$ > {f}; " for f in files) + tree_script(children, forker)],
                        start_new_session=True,
                    )
                )
            self.wait_started(children)
        except BaseException:
            self.close()
            raise

    def wait_started(self, children: int, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(len(cg.pids()) >= children + 1 for cg in self.cgroups):
                return
            time.sleep(0.01)
        raise AssertionError(f"trees did not start in {timeout_s}s: {[len(cg.pids()) for cg in self.cgroups]}")

    def all_pids(self) -> list[int]:
        return [p for cg in self.cgroups for p in cg.pids()]

    def reap(self, timeout_s: float = 5.0) -> list[int | None]:
        """Exit codes of the tree roots (our children): -9 when SIGKILL ended them."""
        out: list[int | None] = []
        for p in self.procs:
            try:
                out.append(p.wait(timeout_s))
            except subprocess.TimeoutExpired:
                out.append(None)
        return out

    def close(self) -> None:
        for cg in self.cgroups:
            for pid in cg.pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            state = cg.dir("freezer") / "freezer.state"
            if state.exists():
                state.write_text("THAWED")
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        deadline = time.monotonic() + 5.0
        for cg in [*self.cgroups, ContainerCgroup("", self.base)]:
            for h in HIERARCHIES:
                d = cg.dir(h)
                while d.is_dir():
                    try:
                        d.rmdir()
                    except OSError:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.01)

    def __enter__(self) -> CgroupTrees:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
