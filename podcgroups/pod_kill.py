"""SIGKILL every task of borrower pods through their pod-level cgroups, and return once none is left.

Every pod is signalled first, then all are watched together, so their exits run in parallel.

- **v2, ``cgroup.kill``** (Linux >= 5.14): one write of ``1`` kills every task below the pod,
  and the kernel kills a task forked while that write runs. Done = ``populated 0`` in the
  pod's ``cgroup.events``.
- **v2 without it** (5.2 to 5.13, or the write refused): freeze the pod (``cgroup.freeze``;
  a frozen task cannot fork, yet SIGKILL still ends it) and SIGKILL every task listed; thaw
  at the end however the kill ended.
- **v1**: SIGKILL every task listed below the pod without freezing: freezing first waits
  until every task has been scheduled (on 2 loaded cores 16 borrowers took 68 ms frozen-first
  against 29 ms).

On every version, once every pod is signalled, ``ExitBoost`` gives the pods (and every cgroup
above them) the highest CPU weight until the kill ends, so the dying tasks are not queued behind
the rest of the node at a BestEffort pod's weight. The calling thread itself runs at real-time
priority (``SCHED_FIFO`` 1) for the kill where it may: CPU weights order only cgroups, and the
node's daemons, busy with the containers the kill ends, kept a normal thread waiting for a CPU for
87 ms of a 150 ms return, long after the pods were empty.

On every version the pod is listed again every round (v1) or every ``RESCAN_S`` while it is
populated (v2), and what was never signalled is killed: a child forked between a read and a
kill, or a container kubelet started after the kill began (v2 writes ``cgroup.kill`` again).
Listing reads the known containers' ``cgroup.procs``; a change in the tree's shape (one
``stat`` per level), every ``WALK_S``, and the last look before "empty" walk it whole. If
such tasks still appear after ``FREEZE_AFTER_S``, v1 freezes the pod before the next kill so
a fork loop cannot stay ahead. Already signalled tasks are only dying and are left alone.

Nothing is raised and nothing logged: ``PodKillReport`` carries every failure (a pod cgroup
that cannot be read, a write or a signal refused), and says when tasks were there but none
could be signalled, so the caller counts an error instead of a fast return.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from podcgroups.cgroups import PodCgroup
from podcgroups.errors import ProcessError
from podcgroups.exit_boost import JOURNAL, ExitBoost
from podcgroups.files import (
    FREEZE,
    FREEZER_STATE,
    KILL,
    PROCS,
    freezer_state,
    is_populated,
    read_pids,
    subdirs,
    tree,
    write_control,
)
from podcgroups.paths import CgroupVersion

FREEZE_AFTER_S = 0.02  # v1: tasks still appearing this long after the first kill freeze the pod first
RESCAN_S = 0.002  # v2: how often a still-populated pod is listed for tasks not yet signalled
WALK_S = 0.01  # how often a pod's directories are walked for new containers (a fresh walk confirms "empty")
FREEZE_TIMEOUT_S = 0.2  # v1: a task in D state can keep a cgroup FREEZING; then kill it unfrozen
_POLL_S = 0.0005  # between looks at the pods; a kill normally ends in a few ms
EXIT_BOOST = ExitBoost(JOURNAL)  # the process's one: kills on several threads share its counts


@dataclass(frozen=True)
class PodKillReport:
    """What one ``kill_pods`` did."""

    signalled: int  # tasks signalled (cgroup.kill: the tasks listed just before writing it)
    took_s: float  # from the call until every pod cgroup was empty, or until the bound
    remaining: tuple[int, ...]  # tasks still listed at the bound (empty on success)
    used_cgroup_kill: bool  # every pod was killed by cgroup.kill
    tasks_at_start: int = 0  # tasks listed in the pods' cgroups before the first signal
    froze: bool = False  # a freezer was used (v2 without cgroup.kill, or v1 against a fork loop)
    emptied_s: tuple[tuple[str, float], ...] = ()  # (pod UID, seconds from the call until its cgroup was empty)
    unconfirmed: tuple[str, ...] = ()  # pod UIDs not seen empty: past the bound, or unreadable
    errors: tuple[str, ...] = ()  # what failed: unreadable cgroups, refused writes and signals
    signalled_s: float = 0.0  # from the call until every pod had its first signal (the rest is the kernel's)
    boosted: int = 0  # CPU weights raised for the kill (pods and QoS cgroups)

    @property
    def timed_out(self) -> bool:
        return bool(self.remaining)

    @property
    def signalled_none(self) -> bool:
        """Tasks were running and not one was signalled: the kill did nothing, an error, not a fast return."""
        return self.signalled == 0 and self.tasks_at_start > 0


@dataclass
class _Pod:
    """One pod during a kill."""

    cg: PodCgroup
    signalled: set[int] = field(default_factory=set)
    how: str = ""  # "cgroup.kill", "freeze" (v2 without it) or "sigkill" (v1); "" while nothing was there to kill
    frozen: bool = False  # v2 cgroup.freeze written: thaw at the end
    emptied_s: float | None = None
    failed: bool = False  # its cgroup could not be read: no longer watched
    scanned_at: float = 0.0  # v2: when the pod was last listed for newcomers
    leaves: list[Path] = field(default_factory=list)  # the pod's container cgroups, as last walked
    walked_at: float = float("-inf")
    shape_checked: bool = True  # False while the leaves come from the lookup, unchecked

    def listed(self, now: float, *, walk: bool = False) -> list[int]:
        """Tasks below the pod. Every ``WALK_S`` (or when asked, or when the tree changed shape) the
        directories are walked and every level read; in between only the containers' cgroups.

        A kill reads this every round: reading the known ``cgroup.procs`` files costs a fraction
        of walking, and on a loaded node the CPU it leaves is what the dying tasks need.
        """
        if not self.shape_checked:
            self.shape_checked = True
            walk = walk or not self.same_shape()
        if walk or now - self.walked_at >= WALK_S:
            found = [entry for top in self.cg.dirs for entry in tree(top)]
            self.leaves = [d for d, is_leaf in found if is_leaf]
            self.walked_at = now
            return [pid for d, _ in found for pid in read_pids(d / PROCS)]
        return [pid for d in self.leaves for pid in read_pids(d / PROCS)]

    def same_shape(self) -> bool:
        """The tree below the pod is still the pod's cgroup and ``leaves`` right below it.

        kernfs counts a directory's links as 2 + its subdirectories, so one ``stat`` per level
        shows a container cgroup made since, or one nested in a container's.
        """
        try:
            if not all(leaf in self.cg.dirs or leaf.parent in self.cg.dirs for leaf in self.leaves):
                return False
            for top in self.cg.dirs:
                if os.stat(top).st_nlink != 2 + sum(leaf.parent == top for leaf in self.leaves):
                    return False
            return all(os.stat(leaf).st_nlink == 2 for leaf in self.leaves)
        except OSError:
            return False  # something vanished: a walk tells what is left

    def recheck(self, now: float) -> list[int]:
        """Called when the containers' cgroups list no task: the tasks anywhere below the pod."""
        if self.same_shape():
            return [pid for top in self.cg.dirs for pid in read_pids(top / PROCS)]
        return self.listed(now, walk=True)

    def first_listed(self, now: float) -> list[int]:
        """The tasks of the pod's containers, for the first signal: those known from the lookup, else
        one directory listing. The tree's shape is checked at the first look, and the whole tree
        walked ``WALK_S`` later or before the pod is taken for empty."""
        if self.cg.containers:
            self.leaves = list(self.cg.containers)
            self.shape_checked = False
        else:
            self.leaves = [c for d in self.cg.dirs for c in subdirs(d)]
        self.walked_at = now
        return [pid for d in self.leaves for pid in read_pids(d / PROCS)]

    @property
    def v2(self) -> bool:
        return self.cg.layout.version is CgroupVersion.V2

    @property
    def watched(self) -> bool:
        return self.emptied_s is None and not self.failed


@dataclass
class _Run:
    """One ``kill_pods`` call: its pods and what went wrong."""

    start: float
    pods: list[_Pod]
    use_cgroup_kill: bool
    errors: list[str] = field(default_factory=list)
    tasks_at_start: int = 0
    froze: bool = False
    signalled_s: float = 0.0
    boosted: int = 0

    def fail(self, pod: _Pod, exc: ProcessError) -> None:
        pod.failed = True
        self.errors.append(f"pod {pod.cg.pod_uid}: {exc}")


def kill_pods(
    pods: Sequence[PodCgroup],
    *,
    timeout_s: float,
    use_cgroup_kill: bool = True,
    exit_boost: ExitBoost | None = None,
) -> PodKillReport:
    """SIGKILL every task of every pod now; return the moment all pod cgroups are empty, or at the bound.

    ``use_cgroup_kill=False`` takes the path of kernels without ``cgroup.kill`` (freeze, then
    SIGKILL each task) where it exists too. ``exit_boost`` defaults to the process's one, which
    every kill shares (a QoS cgroup raised by two kills at once is restored by the last).
    """
    start = time.monotonic()
    run = _Run(start, [_Pod(p) for p in pods], use_cgroup_kill)
    boost = exit_boost if exit_boost is not None else EXIT_BOOST
    raised: list[Path] = []
    with urgent():
        try:
            for pod in run.pods:
                _first_kill(run, pod)
            run.signalled_s = time.monotonic() - start
            raised = boost.raise_for(p.cg for p in run.pods if p.how)
            run.boosted = len(raised)
            _watch(run, start + timeout_s)
        finally:
            boost.restore(raised)
            for pod in run.pods:
                _thaw(run, pod)
    return _report(run, time.monotonic() - start)


@contextlib.contextmanager
def urgent() -> Iterator[bool]:
    """The calling thread at ``SCHED_FIFO`` 1 inside, and as it was after; False where not permitted
    (no CAP_SYS_NICE, or an RT-throttled cgroup): the kill then runs at the thread's own priority.

    The thread sleeps ``_POLL_S`` between looks, so it never holds a CPU for long, and a kill
    ends at its bound whatever happens; the kernel's RT throttling bounds it besides.
    """
    try:
        policy, param = os.sched_getscheduler(0), os.sched_getparam(0)
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    except OSError:
        yield False
        return
    try:
        yield True
    finally:
        with contextlib.suppress(OSError):
            os.sched_setscheduler(0, policy, param)


def _first_kill(run: _Run, pod: _Pod) -> None:
    try:
        pids = pod.first_listed(time.monotonic())
        if not pids and pod.cg.is_empty():
            return  # gone or empty: nothing to kill, and the first look confirms it
    except ProcessError as exc:
        run.fail(pod, exc)
        return
    run.tasks_at_start += len(pids)
    if not pod.v2:
        pod.how = "sigkill"
        pod.signalled.update(_sigkill(run, pids))
        return
    if run.use_cgroup_kill and all((d / KILL).exists() for d in pod.cg.dirs) and _write_all(run, pod, KILL, "1"):
        pod.how = "cgroup.kill"
        pod.signalled.update(pids)
        return
    # No cgroup.kill (or it was refused): freeze, so nothing forks between our read and our kill.
    pod.how = "freeze"
    pod.frozen = _write_all(run, pod, FREEZE, "1")
    run.froze |= pod.frozen
    try:
        pids = pod.listed(time.monotonic(), walk=True) if pod.frozen else pids
    except ProcessError as exc:
        run.fail(pod, exc)
        return
    pod.signalled.update(_sigkill(run, pids))


def _watch(run: _Run, deadline: float) -> None:
    """Look at every pod not yet empty until none is left or the bound passes."""
    while True:
        now = time.monotonic()
        for pod in run.pods:
            if pod.watched:
                try:
                    _look(run, pod, now)
                except ProcessError as exc:
                    run.fail(pod, exc)
        if not any(p.watched for p in run.pods) or now >= deadline:
            return
        time.sleep(_POLL_S)


def _look(run: _Run, pod: _Pod, now: float) -> None:
    """One look at a killed pod: note it empty, or kill what it holds that was never signalled."""
    elapsed = now - run.start
    if pod.v2:
        if not any(is_populated(d) for d in pod.cg.dirs):
            pod.emptied_s = time.monotonic() - run.start
            return
        if now - pod.scanned_at < RESCAN_S:
            return  # dying tasks keep a pod populated for a while: do not list it every round
        pod.scanned_at = now
    listed = pod.listed(now, walk=pod.v2 and not pod.same_shape())
    if not pod.v2 and not listed and not (listed := pod.recheck(now)):
        # Empty only if the whole tree agrees: a container made since the last walk is not missed.
        pod.emptied_s = time.monotonic() - run.start
        return
    new = [p for p in listed if p not in pod.signalled]
    if new:
        _kill_again(run, pod, new, elapsed)


def _kill_again(run: _Run, pod: _Pod, new: list[int], elapsed: float) -> None:
    """Tasks never signalled (forked meanwhile, or a container started since): kill them."""
    if pod.how == "cgroup.kill" and _write_all(run, pod, KILL, "1"):
        pod.signalled.update(new)
        return
    freezer = pod.cg.dirs[0] if (pod.cg.dirs[0] / FREEZER_STATE).exists() else None
    if pod.v2 or freezer is None or elapsed <= FREEZE_AFTER_S:
        pod.signalled.update(_sigkill(run, new))
        return
    # v1, still forking after FREEZE_AFTER_S: freeze the whole pod so the next read is complete.
    frozen = _freeze_v1(run, freezer)
    try:
        pod.signalled.update(
            _sigkill(run, [p for p in pod.listed(time.monotonic(), walk=True) if p not in pod.signalled])
        )
    finally:
        if frozen:
            _try_write(run, freezer / FREEZER_STATE, "THAWED")  # a frozen v1 task dies only once thawed


def _freeze_v1(run: _Run, d: Path) -> bool:
    if not _try_write(run, d / FREEZER_STATE, "FROZEN"):
        return False
    run.froze = True
    until = time.monotonic() + FREEZE_TIMEOUT_S
    while freezer_state(d) == "FREEZING" and time.monotonic() < until:
        time.sleep(_POLL_S)
    return True


def _thaw(run: _Run, pod: _Pod) -> None:
    if pod.frozen:
        for d in pod.cg.dirs:
            _try_write(run, d / FREEZE, "0")


def _write_all(run: _Run, pod: _Pod, name: str, value: str) -> bool:
    return all([_try_write(run, d / name, value) for d in pod.cg.dirs])


def _try_write(run: _Run, path: Path, value: str) -> bool:
    """Write a control file; a gone cgroup counts as written (nothing left to act on), a refusal is an error."""
    try:
        write_control(path, value)
        return True
    except ProcessError as exc:
        run.errors.append(str(exc))
        return False


def _sigkill(run: _Run, pids: Iterable[int]) -> list[int]:
    done: list[int] = []
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
            done.append(pid)
        except ProcessLookupError:
            pass  # exited between the read and the kill
        except PermissionError:
            run.errors.append(f"gpushare: SIGKILL to pid {pid} refused: the agent must run as root")
    return done


def _report(run: _Run, took_s: float) -> PodKillReport:
    remaining: list[int] = []
    for pod in run.pods:
        if pod.watched:
            try:
                remaining.extend(pod.cg.pids())
            except ProcessError as exc:
                run.fail(pod, exc)
    emptied = [(p.cg.pod_uid, p.emptied_s) for p in run.pods if p.emptied_s is not None]
    hows = {p.how for p in run.pods} - {""}
    if emptied and len(emptied) == len(run.pods):
        took_s = max(s for _, s in emptied)
    return PodKillReport(
        signalled=len(set().union(*(p.signalled for p in run.pods))),
        took_s=took_s,
        remaining=tuple(sorted(set(remaining))),
        used_cgroup_kill=hows == {"cgroup.kill"},
        tasks_at_start=run.tasks_at_start,
        froze=run.froze,
        emptied_s=tuple(emptied),
        unconfirmed=tuple(p.cg.pod_uid for p in run.pods if p.emptied_s is None),
        errors=tuple(run.errors),
        signalled_s=run.signalled_s,
        boosted=run.boosted,
    )


__all__ = ["EXIT_BOOST", "FREEZE_AFTER_S", "RESCAN_S", "WALK_S", "PodKillReport", "kill_pods", "urgent"]
