"""Where a borrower's processes are: its pod's cgroup (v1 or v2, cgroupfs or systemd driver), and a
container's cgroup by container ID.

Spot kills a borrower pod whole, through the pod-level cgroup kubelet makes
(``paths.py`` has the naming rules): every container of the pod, the sandbox,
ephemeral containers and ones started while the kill runs are below it. ``detect_layout``
finds which hierarchy and driver kubelet uses once, at start, or says in one line why pod
cgroups cannot be found (then nothing may be lent). ``find_pod_cgroup`` maps a pod UID to
its cgroup with at most three ``stat`` calls per kubepods cgroup, so nothing is walked on a
return. A cgroup's ``cgroup.procs`` lists its live tasks; the kernel drops an exiting task
there in ``cgroup_exit`` (zombies are not listed), which is what "dead" means to spot.

The owner side still goes by container: runc puts a container in the same relative path in
every v1 hierarchy (and once in v2): ``.../<container id>`` with the cgroupfs driver,
``.../cri-containerd-<id>.scope`` with the systemd one; ``CgroupIndex`` finds it by ID.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from podcgroups.errors import ProcessError
from podcgroups.files import PROCS, is_populated, read_pids, subdirs, tree_pids
from podcgroups.paths import (
    CgroupDriver,
    CgroupVersion,
    check_pod_uid,
    is_kubepods_name,
    parse_pod_path,
    parse_proc_cgroup,
    pod_dir_candidates,
)

CGROUP_ROOT = "/sys/fs/cgroup"
PROC_ROOT = "/proc"
# Hierarchies that list a container's tasks, best first: the freezer one can also stop forks.
_TASK_HIERARCHIES = ("freezer", "pids", "memory", "devices", "systemd")  # not cpu: ExitBoost writes weights there
_V2_MARKER = "cgroup.controllers"  # only the unified hierarchy has it at its root


@dataclass(frozen=True)
class ContainerCgroup:
    """Where one container's tasks live: ``<root>/<hierarchy><rel_path>`` for each v1 hierarchy."""

    container_id: str
    rel_path: str  # "/kubepods/besteffort/pod<uid>/<id>", the same in every v1 hierarchy
    cgroup_root: str = CGROUP_ROOT

    def dir(self, hierarchy: str) -> Path:
        return Path(self.cgroup_root, hierarchy, self.rel_path.lstrip("/"))

    @property
    def tasks_file(self) -> Path:
        """The ``cgroup.procs`` of the first hierarchy holding this cgroup."""
        for h in (*_TASK_HIERARCHIES, ""):  # "": the unified hierarchy mounted at the root itself (v2)
            f = self.dir(h) / PROCS
            if f.exists():
                return f
        return self.dir(_TASK_HIERARCHIES[0]) / PROCS

    def pids(self) -> list[int]:
        """Thread-group ids now in the cgroup (empty when it is gone)."""
        return read_pids(self.tasks_file)

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
        if hierarchy is None and Path(cgroup_root, _V2_MARKER).is_file():
            hierarchy = ""  # v2: the one hierarchy is the mount itself
        self._hierarchy = (
            hierarchy
            if hierarchy is not None
            else next((h for h in _TASK_HIERARCHIES if Path(cgroup_root, h).is_dir()), _TASK_HIERARCHIES[0])
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


@dataclass(frozen=True)
class CgroupLayout:
    """The hierarchy kubelet's pods live in, found once by ``detect_layout``."""

    version: CgroupVersion
    driver: CgroupDriver
    root: Path  # the v2 unified mount, or the v1 hierarchy used to find pods (freezer first)
    # kubelet's top pod cgroups (``kubepods``/``kubepods.slice``, under its cgroupRoot); empty: at ``root``
    kubepods: tuple[Path, ...] = ()

    def kubepods_dirs(self) -> tuple[Path, ...]:
        if self.kubepods:
            return self.kubepods
        return (self.root / ("kubepods" if self.driver is CgroupDriver.CGROUPFS else "kubepods.slice"),)

    def describe(self) -> str:
        """One line for logs and status: version, driver, where pods are and how they are killed."""
        tops = ", ".join(str(d) for d in self.kubepods_dirs())
        if self.version is CgroupVersion.V2:
            how = "cgroup.kill" if (self.kubepods_dirs()[0] / "cgroup.kill").exists() else "cgroup.freeze + SIGKILL"
        else:
            how = "SIGKILL each task, v1 freezer" if self.root.name == "freezer" else "SIGKILL each task, no freezer"
        return f"cgroup {self.version}, {self.driver} driver, pods under {tops}; kill: {how}"


@dataclass(frozen=True)
class PodCgroup:
    """One pod's cgroup: the pod-level directory, holding every container of the pod below it."""

    pod_uid: str
    layout: CgroupLayout
    dirs: tuple[Path, ...]  # the pod's cgroup directory (one; a tuple so a layout may name more)
    # The cgroups below it when it was looked up (its containers then): a kill reads these first,
    # without listing the directory on the return path, and checks right after whether more came.
    containers: tuple[Path, ...] = ()

    def pids(self) -> list[int]:
        """Every task below the pod's cgroup, all containers included, sorted; empty when it is gone."""
        return sorted({pid for d in self.dirs for pid in tree_pids(d)})

    def is_empty(self) -> bool:
        """No task left: v2 ``populated 0`` (or gone), v1 no task listed anywhere below."""
        if self.layout.version is CgroupVersion.V2:
            return not any(is_populated(d) for d in self.dirs)
        return not self.pids()


def detect_layout(cgroup_root: Path = Path(CGROUP_ROOT), *, kubelet_root: str | None = None) -> CgroupLayout | str:
    """The layout kubelet's pods live in, or a one-line reason why pod cgroups cannot be found.

    ``kubelet_root`` is kubelet's ``cgroupRoot`` when it is not ``/``; without it, kubepods
    cgroups are looked for at the top of the hierarchy and one level down (all of them: a
    host running several kubelets, as the test clusters do, has one per kubelet). A hybrid
    host (v1 hierarchies plus ``unified``) is v1: kubelet puts its limits there. Never raises
    for a missing or unreadable tree: the reason names the path and the failure.
    """
    try:
        found = _hierarchy(cgroup_root)
        if isinstance(found, str):
            return found
        version, hierarchies = found
        for hier in hierarchies:
            tops = _kubepods_tops(hier, kubelet_root)
            drivers = sorted({driver for _, driver in tops})
            if len(drivers) > 1:
                return (
                    f"kubepods cgroups of both drivers under {hier}: {', '.join(str(d) for d, _ in tops)}; "
                    "remove the stale ones or name kubelet's cgroupRoot"
                )
            if tops:
                return CgroupLayout(version, drivers[0], hier, tuple(d for d, _ in tops))
    except OSError as exc:
        return f"cannot read {exc.filename or cgroup_root}: {exc.strerror}; the agent needs the host's cgroup tree"
    where = f"{hierarchies[0]}/{(kubelet_root or '').strip('/')}".rstrip("/")
    return (
        f"no kubepods cgroup under {where} (cgroup {version}): kubelet is not running on this host, "
        "runs with cgroupsPerQOS=false, or a cgroupRoot this agent was not told of"
    )


def _hierarchy(cgroup_root: Path) -> tuple[CgroupVersion, list[Path]] | str:
    if not cgroup_root.exists():
        return f"cgroup root {cgroup_root} does not exist: mount the host's /sys/fs/cgroup there"
    if not cgroup_root.is_dir():
        return f"cgroup root {cgroup_root} is not a directory"
    if (cgroup_root / _V2_MARKER).is_file():
        return CgroupVersion.V2, [cgroup_root]
    v1 = [cgroup_root / h for h in _TASK_HIERARCHIES if (cgroup_root / h / PROCS).is_file()]
    if not v1:
        return (
            f"no cgroup hierarchy under {cgroup_root}: neither a cgroup2 mount ({_V2_MARKER}) "
            f"nor a v1 hierarchy of {', '.join(_TASK_HIERARCHIES)}"
        )
    return CgroupVersion.V1, v1


def _kubepods_tops(hier: Path, kubelet_root: str | None) -> list[tuple[Path, CgroupDriver]]:
    """kubepods cgroups in ``hier``: directly in ``kubelet_root``, or at the top and one level down."""
    if kubelet_root is not None:
        parents = [hier / kubelet_root.strip("/")]
    else:
        parents = [hier, *(Path(e.path) for e in _subdirs(hier) if is_kubepods_name(e.name) is None)]
    tops: list[tuple[Path, CgroupDriver]] = []
    for parent in parents:
        for entry in _subdirs(parent):
            driver = is_kubepods_name(entry.name)
            if driver is not None and (Path(entry.path) / PROCS).is_file():
                tops.append((Path(entry.path), driver))
    return sorted(tops)


def _subdirs(d: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(d) as entries:
            return [e for e in entries if e.is_dir(follow_symlinks=False)]
    except FileNotFoundError:
        return []  # a cgroup removed while we looked, or a kubelet_root that is not there


def find_pod_cgroup(pod_uid: str, layout: CgroupLayout) -> PodCgroup | None:
    """The pod's cgroup, or None if it has none (not started yet, or gone). ``ValueError`` for a bad UID.

    cgroupfs: ``kubepods[/burstable|/besteffort]/pod<uid>``; systemd:
    ``kubepods.slice[/kubepods-<qos>.slice]/kubepods[-<qos>]-pod<uid with - as _>.slice``.
    """
    check_pod_uid(pod_uid)
    for top in layout.kubepods_dirs():
        for rel in pod_dir_candidates(top.name, layout.driver, pod_uid):
            d = top / rel
            try:
                if d.is_dir():
                    return PodCgroup(pod_uid, layout, (d,), tuple(subdirs(d)))
            except OSError as exc:
                raise ProcessError(f"gpushare: cannot look at {d}: {exc.strerror}") from exc
    return None


def pod_cgroup_of_pid(pid: int, layout: CgroupLayout, *, proc_root: str = PROC_ROOT) -> PodCgroup | None:
    """The cgroup of the pod process ``pid`` runs in; None when it has exited or is in no pod.

    The pod is recognised in ``/proc/<pid>/cgroup`` and then looked up by UID, so a path the
    kernel shows relative to the agent's cgroup namespace (``/../..``) works too.
    """
    try:
        text = Path(proc_root, str(pid), "cgroup").read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ProcessError(f"gpushare: cannot read {proc_root}/{pid}/cgroup: {exc.strerror}") from exc
    path = parse_proc_cgroup(text).path_in(layout.version, layout.root.name)
    pod = parse_pod_path(path) if path is not None else None
    return find_pod_cgroup(pod.pod_uid, layout) if pod is not None else None


__all__ = [
    "CGROUP_ROOT",
    "PROC_ROOT",
    "CgroupDriver",
    "CgroupIndex",
    "CgroupLayout",
    "CgroupVersion",
    "ContainerCgroup",
    "PodCgroup",
    "detect_layout",
    "find_pod_cgroup",
    "pod_cgroup_of_pid",
]
