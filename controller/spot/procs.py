"""Host process facts for spot: pid namespaces, a container's cgroup, and killing it whole.

Spot needs three things from the host that the API server cannot give in time (design §6):

- the pid-namespace inode of an owner container (``stat(/proc/<pid>/ns/pid).st_ino``), which
  gpukmod watches;
- every process of a borrower container, found through its cgroup (cgroups v1 with the
  cgroupfs driver: runc puts a container in the same relative path in every hierarchy,
  ``.../<container id>``; the systemd driver names it ``cri-containerd-<id>.scope``);
- killing them all with SIGKILL without racing ``fork``: freeze the cgroup (v1 freezer),
  SIGKILL every task it lists, thaw (a frozen task only dies once thawed), then wait until
  the cgroup lists no task. Without a freezer hierarchy the kill repeats until the cgroup is
  empty; a task that forks after our read is caught by the next round. Both are bounded by
  ``timeout_s``; a task that outlives it (stuck in D state) raises ``KillTimeout``.

"Dead" means the cgroup's ``cgroup.procs`` lists no task: the kernel drops an exiting task
from that list in ``cgroup_exit`` (zombies are not listed), i.e. it runs no more code.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from controller.errors import KillTimeout, ProcessError

log = logging.getLogger(__name__)

CGROUP_ROOT = "/sys/fs/cgroup"
PROC_ROOT = "/proc"
# Hierarchies that list a container's tasks, best first: the freezer one can also stop forks.
_TASK_HIERARCHIES = ("freezer", "pids", "memory", "devices", "systemd")  # not cpu: ExitBoost moves tasks there
_POLL_S = 0.0005  # between reads of freezer.state / cgroup.procs; a kill normally ends in ~1 ms
DEFAULT_KILL_TIMEOUT_S = 2.0
DEFAULT_FREEZE_TIMEOUT_S = 0.2  # a task in D state can keep a cgroup FREEZING; then kill unfrozen


def pidns_inode(pid: int, *, proc_root: str = PROC_ROOT) -> int:
    """The pid-namespace inode of ``pid`` (what gpukmod's table holds)."""
    path = f"{proc_root}/{pid}/ns/pid"
    try:
        return os.stat(path).st_ino
    except FileNotFoundError as exc:
        raise ProcessError(f"gpushare: {path} does not exist: process {pid} has exited") from exc
    except OSError as exc:
        raise ProcessError(f"gpushare: cannot stat {path}: {exc.strerror}; the agent needs root and hostPID") from exc


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """``/proc/<pid>/cgroup`` as ``{hierarchy: path}`` ("" names the v2 unified line).

    A v1 line ``6:freezer:/kubepods/pod1/abc`` gives ``{"freezer": "/kubepods/pod1/abc"}``;
    ``1:name=systemd:/x`` gives ``{"systemd": "/x"}``; co-mounted ``2:cpu,cpuacct:/y`` gives
    both names. Lines that do not have three fields are skipped.
    """
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if not controllers:
            out[""] = path
            continue
        for name in controllers.split(","):
            out[name.removeprefix("name=")] = path
    return out


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

    def exists(self) -> bool:
        return any(self.dir(h).is_dir() for h in _TASK_HIERARCHIES)

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


def cgroup_of_pid(
    pid: int, container_id: str = "", *, proc_root: str = PROC_ROOT, cgroup_root: str = CGROUP_ROOT
) -> ContainerCgroup:
    """The v1 cgroup ``pid`` lives in (freezer's path, else the first task hierarchy's)."""
    path = f"{proc_root}/{pid}/cgroup"
    try:
        paths = parse_proc_cgroup(Path(path).read_text())
    except FileNotFoundError as exc:
        raise ProcessError(f"gpushare: {path} does not exist: process {pid} has exited") from exc
    except OSError as exc:
        raise ProcessError(f"gpushare: cannot read {path}: {exc.strerror}") from exc
    for h in _TASK_HIERARCHIES:
        if h in paths:
            return ContainerCgroup(container_id, paths[h], cgroup_root)
    raise ProcessError(
        f"gpushare: {path} names no cgroup v1 hierarchy of {list(_TASK_HIERARCHIES)}; "
        "spot needs cgroups v1 (freezer or pids mounted under /sys/fs/cgroup)"
    )


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

    @property
    def hierarchy(self) -> str:
        return self._hierarchy

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
class KillReport:
    """What one ``kill_cgroups`` did: tasks signalled, rounds, whether the freezer was used."""

    signalled: int
    rounds: int
    frozen: bool
    took_s: float


def _write(path: Path, value: str) -> bool:
    """Write a control file; False if the cgroup is gone (its tasks are then gone too)."""
    try:
        path.write_text(value)
        return True
    except FileNotFoundError:
        return False
    except OSError as exc:
        if exc.errno in (errno.ENODEV, errno.ENOENT):
            return False
        raise ProcessError(f"gpushare: cannot write {value!r} to {path}: {exc.strerror}") from exc


def _freezer_state(d: Path) -> str:
    try:
        return (d / "freezer.state").read_text().strip()
    except FileNotFoundError:
        return "GONE"


def _sigkill_all(pids: Iterable[int]) -> list[int]:
    done: list[int] = []
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
            done.append(pid)
        except ProcessLookupError:
            pass  # exited between the read and the kill
        except PermissionError as exc:
            raise ProcessError(f"gpushare: SIGKILL to pid {pid} refused: the agent must run as root") from exc
    return done


def signal_cgroups(
    cgroups: Sequence[ContainerCgroup],
    *,
    freeze_timeout_s: float = DEFAULT_FREEZE_TIMEOUT_S,
    use_freezer: bool = True,
) -> tuple[set[int], bool]:
    """Freeze all cgroups together, SIGKILL every task they list, thaw; do not wait for the deaths.

    Freezing first means no task forks or migrates between our read and our signal, so one
    round reaches every task. A cgroup that stays FREEZING past ``freeze_timeout_s`` (a task
    in D state) is signalled unfrozen; ``wait_cgroups_empty`` signals its survivors again.
    Returns the pids signalled and whether the freezer was used.
    """
    start = time.monotonic()
    frozen: list[Path] = []
    if use_freezer:
        for cg in cgroups:
            d = cg.freezer_dir
            if d is not None and _write(d / "freezer.state", "FROZEN"):
                frozen.append(d)
        pending = list(frozen)
        while pending and time.monotonic() < start + freeze_timeout_s:
            pending = [d for d in pending if _freezer_state(d) == "FREEZING"]
            if pending:
                time.sleep(_POLL_S)
        if pending:
            log.warning(
                "spot kill: cgroups still FREEZING after %.0f ms; killing them unfrozen",
                freeze_timeout_s * 1000,
                extra={"cgroups": [str(d) for d in pending]},
            )
    signalled: set[int] = set()
    try:
        for cg in cgroups:
            signalled.update(_sigkill_all(cg.pids()))
    finally:
        for d in frozen:  # frozen tasks die only once thawed; a failure must not leave them frozen
            _write(d / "freezer.state", "THAWED")
    return signalled, bool(frozen)


class ExitBoost:
    """Moves SIGKILLed tasks into one top-level cpu cgroup of the highest weight, so they run their
    exit at once instead of waiting for CPU behind their pod's weight.

    A container's tasks share their pod's cpu weight (a BestEffort pod: ``cpu.shares`` 2 under
    kubepods); on a busy node a killed task can wait tens of ms before it runs its exit path.
    Only tasks that already have SIGKILL pending are moved, so none runs its own code there.
    Each move is one cgroup migration (~0.5 ms on a loaded 2-core VM), hence only for tasks
    still listed a moment after the kill. Without a writable cpu hierarchy this does nothing.
    """

    NAME = "gpushare-reaping"
    MAX_SHARES = 262144  # the cgroup v1 maximum

    def __init__(self, *, cgroup_root: str = CGROUP_ROOT) -> None:
        self._root = cgroup_root
        self._dir: Path | None = None
        self._is_disabled = False

    def _ensure(self) -> Path | None:
        if self._dir is not None or self._is_disabled:
            return self._dir
        base = next(
            (Path(self._root, h) for h in ("cpu", "cpu,cpuacct") if Path(self._root, h, "cpu.shares").exists()), None
        )
        try:
            if base is None:
                raise FileNotFoundError(f"no cpu hierarchy under {self._root}")
            d = base / self.NAME
            d.mkdir(exist_ok=True)
            (d / "cpu.shares").write_text(str(self.MAX_SHARES))
        except OSError as exc:
            log.warning("spot kill: no CPU boost for dying tasks (%s); they exit at their pod's CPU weight", exc)
            self._is_disabled = True
            return None
        self._dir = d
        return d

    def move(self, pids: Iterable[int]) -> int:
        """Move these (already SIGKILLed) tasks; returns how many moved (gone ones are skipped)."""
        d = self._ensure()
        if d is None:
            return 0
        moved = 0
        for pid in pids:
            try:
                (d / "cgroup.procs").write_text(str(pid))
                moved += 1
            except OSError:
                pass  # exited meanwhile (ESRCH), or a kernel thread: nothing to speed up
        return moved


def wait_cgroups_empty(
    cgroups: Sequence[ContainerCgroup], *, timeout_s: float = DEFAULT_KILL_TIMEOUT_S, resignal: bool = True
) -> tuple[int, set[int]]:
    """Poll until every cgroup lists no task, SIGKILLing what is still listed each round.

    Re-signalling catches a child forked after an unfrozen read. Returns (rounds, pids signalled);
    raises ``KillTimeout`` naming the survivors after ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    live = list(cgroups)
    rounds = 0
    signalled: set[int] = set()
    while True:
        rounds += 1
        batch = [(cg, cg.pids()) for cg in live]
        live = [cg for cg, pids in batch if pids]
        if not live:
            return rounds, signalled
        if time.monotonic() >= deadline:
            left = {cg.container_id or cg.rel_path: pids for cg, pids in batch if pids}
            raise KillTimeout(
                f"gpushare: tasks survived SIGKILL for {timeout_s:g}s: {left}; "
                "a task stuck in the kernel (D state) ends only when its I/O does"
            )
        if resignal:
            for _, pids in batch:
                signalled.update(_sigkill_all(pids))
        time.sleep(_POLL_S)


def kill_cgroups(
    cgroups: Sequence[ContainerCgroup],
    *,
    timeout_s: float = DEFAULT_KILL_TIMEOUT_S,
    freeze_timeout_s: float = DEFAULT_FREEZE_TIMEOUT_S,
    use_freezer: bool = True,
) -> KillReport:
    """SIGKILL every task of every cgroup and return once all of them list no task.

    ``signal_cgroups`` then ``wait_cgroups_empty``. Without the freezer the kill is repeated
    until the cgroup is empty. Raises ``KillTimeout`` naming what survived.
    """
    start = time.monotonic()
    signalled, frozen = signal_cgroups(cgroups, freeze_timeout_s=freeze_timeout_s, use_freezer=use_freezer)
    left_s = max(0.0, timeout_s - (time.monotonic() - start))
    rounds, again = wait_cgroups_empty(cgroups, timeout_s=left_s)
    return KillReport(len(signalled | again), rounds, frozen, time.monotonic() - start)


__all__ = [
    "CGROUP_ROOT",
    "CgroupIndex",
    "ContainerCgroup",
    "ExitBoost",
    "KillReport",
    "cgroup_of_pid",
    "kill_cgroups",
    "parse_proc_cgroup",
    "pidns_inode",
    "signal_cgroups",
    "wait_cgroups_empty",
]
