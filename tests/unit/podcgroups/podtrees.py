"""Borrower pods made of real processes in real cgroups, shaped as kubelet shapes them.

``RealPods(version, driver, count)`` makes a private kubelet-like cgroup root
``gs-pods-<pid>-<n>`` holding ``kubepods`` (cgroupfs) or ``kubepods.slice`` (systemd) and
``count`` BestEffort pods, each with ``containers`` containers named as runc names them
(``<id>`` or ``cri-containerd-<id>.scope``). Every container runs one process tree (a shell
that joins its cgroup before it execs, sleepers, a fork loop: ``tree_script``). v1 uses the
freezer and pids hierarchies under /sys/fs/cgroup; v2 uses a cgroup2 mount: the ``unified``
one of a hybrid host, /sys/fs/cgroup on a v2 host, or one mounted for the tests. Root needed.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

from podcgroups.cgroups import CGROUP_ROOT, CgroupLayout, PodCgroup, detect_layout, find_pod_cgroup
from podcgroups.paths import CgroupDriver, CgroupVersion, pod_dir_candidates
from tests.integration.spot.trees import tree_script

V1_HIERARCHIES = ("freezer", "pids")


def cgroup2_mounted() -> Path | None:
    """Where a cgroup2 hierarchy is mounted on this host, if anywhere."""
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[2] == "cgroup2":
            return Path(fields[1])
    return None


@contextlib.contextmanager
def cgroup2_root() -> Iterator[Path]:
    """A cgroup2 mount for the tests: the host's, else one mounted now (any kernel >= 4.5 can, as root)."""
    found = cgroup2_mounted()
    if found is not None:
        yield found
        return
    d = Path(tempfile.mkdtemp(prefix="gs-cgroup2-"))
    subprocess.run(["mount", "-t", "cgroup2", "none", str(d)], check=True, capture_output=True, timeout=10)
    try:
        yield d
    finally:
        subprocess.run(["umount", str(d)], check=False, capture_output=True, timeout=10)
        d.rmdir()


def skip_reason(version: CgroupVersion) -> str:
    """Why real pod cgroups of this version cannot be made here ("" when they can)."""
    if os.geteuid() != 0:
        return "needs root to create cgroups: run the tests as root"
    if version is CgroupVersion.V1:
        missing = [h for h in V1_HIERARCHIES if not Path(CGROUP_ROOT, h, "cgroup.procs").exists()]
        if missing:
            return f"cgroup v1 hierarchies {missing} are not mounted under {CGROUP_ROOT}"
    return ""


class RealPods:
    """``count`` pods of real process trees; ``pods`` (from ``find_pod_cgroup``) are what the killer gets."""

    def __init__(
        self,
        version: CgroupVersion,
        driver: CgroupDriver,
        count: int,
        *,
        v2_root: Path | None = None,
        containers: int = 2,
        children: int = 3,
        forker: bool = True,
    ) -> None:
        self.version = version
        self.cgroup_root = Path(CGROUP_ROOT) if version is CgroupVersion.V1 else _required(v2_root)
        self.hierarchies = (
            [self.cgroup_root / h for h in V1_HIERARCHIES] if version is CgroupVersion.V1 else [self.cgroup_root]
        )
        self.kubelet_root = f"gs-pods-{os.getpid()}-{time.monotonic_ns() % 10**9}"
        top = "kubepods" if driver is CgroupDriver.CGROUPFS else "kubepods.slice"
        self.uids = [str(uuid.uuid4()) for _ in range(count)]
        self.procs: list[subprocess.Popen[bytes]] = []
        self._containers: list[str] = []  # container cgroups, relative to each hierarchy
        for uid in self.uids:
            pod = f"{self.kubelet_root}/{top}/{pod_dir_candidates(top, driver, uid)[0]}"
            for _ in range(containers):
                cid = secrets.token_hex(32)
                self._containers.append(
                    f"{pod}/{cid if driver is CgroupDriver.CGROUPFS else f'cri-containerd-{cid}.scope'}"
                )
        try:
            for rel in self._containers:
                for h in self.hierarchies:
                    (h / rel).mkdir(parents=True)
                joins = "".join(f"echo $$ > {h / rel / 'cgroup.procs'}; " for h in self.hierarchies)
                self.procs.append(
                    subprocess.Popen(["sh", "-c", joins + tree_script(children, forker)], start_new_session=True)
                )
            self._wait_started(children)
        except BaseException:
            self.close()
            raise

    def layout(self) -> CgroupLayout:
        found = detect_layout(self.cgroup_root, kubelet_root=self.kubelet_root)
        assert isinstance(found, CgroupLayout), found
        return found

    def pods(self) -> list[PodCgroup]:
        layout = self.layout()
        found = [find_pod_cgroup(uid, layout) for uid in self.uids]
        assert all(p is not None for p in found)
        return [p for p in found if p is not None]

    def container_pids(self) -> list[list[int]]:
        return [_read(self.hierarchies[0] / rel / "cgroup.procs") for rel in self._containers]

    def all_pids(self) -> list[int]:
        return sorted(p for pids in self.container_pids() for p in pids)

    def _wait_started(self, children: int, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(len(pids) >= children + 1 for pids in self.container_pids()):
                return
            time.sleep(0.01)
        raise AssertionError(f"trees did not start in {timeout_s}s: {[len(p) for p in self.container_pids()]}")

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
        for pid in self.all_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        base = self.hierarchies[0] / self.kubelet_root
        for d in [base, *(d for d in base.rglob("*") if d.is_dir())] if base.is_dir() else []:
            for name, thawed in (("freezer.state", "THAWED"), ("cgroup.freeze", "0")):
                if (d / name).is_file():
                    (d / name).write_text(thawed)
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        deadline = time.monotonic() + 5.0
        for h in self.hierarchies:
            dirs = sorted((d for d in (h / self.kubelet_root).rglob("*") if d.is_dir()), key=lambda d: -len(d.parts))
            for d in [*dirs, h / self.kubelet_root]:
                while d.is_dir():
                    try:
                        d.rmdir()
                    except OSError:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.01)

    def __enter__(self) -> RealPods:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _required(v2_root: Path | None) -> Path:
    if v2_root is None:
        raise ValueError("a v2 RealPods needs v2_root (from cgroup2_root())")
    return v2_root


def _read(path: Path) -> list[int]:
    try:
        return [int(x) for x in path.read_text().split()]
    except FileNotFoundError:
        return []
