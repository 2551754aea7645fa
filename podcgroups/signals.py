"""SIGKILL every task of borrower cgroups without racing ``fork``, and wait until none is listed.

Pod level, every cgroup version: ``kill_pods`` (``pod_kill.py``) over the pods' cgroups
(``cgroups.find_pod_cgroup``). Container level, cgroup v1, below: freeze the cgroup (v1
freezer), SIGKILL every task it lists, thaw (a frozen task only dies once thawed), then wait
until the cgroup lists no task. Without a freezer hierarchy the kill repeats until the cgroup
is empty; a task that forks after our read is caught by the next round. Both are bounded by
``timeout_s``; a task that outlives it (stuck in D state) raises ``KillTimeout``.
``ExitBoost`` lets killed tasks run their exit at once on a busy v1 node.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from podcgroups.cgroups import ContainerCgroup
from podcgroups.errors import KillTimeout, ProcessError
from podcgroups.exit_boost import ExitBoost
from podcgroups.files import freezer_state, write_control
from podcgroups.pod_kill import PodKillReport, kill_pods

log = logging.getLogger(__name__)

_POLL_S = 0.0005  # between reads of freezer.state / cgroup.procs; a kill normally ends in ~1 ms
DEFAULT_KILL_TIMEOUT_S = 2.0
DEFAULT_FREEZE_TIMEOUT_S = 0.2  # a task in D state can keep a cgroup FREEZING; then kill unfrozen


@dataclass(frozen=True)
class KillReport:
    """What one ``kill_cgroups`` did: tasks signalled, rounds, whether the freezer was used."""

    signalled: int
    rounds: int
    frozen: bool
    took_s: float


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


def _freeze(cgroups: Sequence[ContainerCgroup], freeze_timeout_s: float) -> list[Path]:
    """Freeze what has a freezer and wait (bounded) until it is FROZEN; the freezer dirs written."""
    start = time.monotonic()
    frozen: list[Path] = []
    for cg in cgroups:
        d = cg.freezer_dir
        if d is not None and write_control(d / "freezer.state", "FROZEN"):
            frozen.append(d)
    pending = list(frozen)
    while pending and time.monotonic() < start + freeze_timeout_s:
        pending = [d for d in pending if freezer_state(d) == "FREEZING"]
        if pending:
            time.sleep(_POLL_S)
    if pending:
        log.warning(
            "spot kill: cgroups still FREEZING after %.0f ms; killing them unfrozen",
            freeze_timeout_s * 1000,
            extra={"cgroups": [str(d) for d in pending]},
        )
    return frozen


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
    frozen = _freeze(cgroups, freeze_timeout_s) if use_freezer else []
    signalled: set[int] = set()
    try:
        for cg in cgroups:
            signalled.update(_sigkill_all(cg.pids()))
    finally:
        for d in frozen:  # frozen tasks die only once thawed; a failure must not leave them frozen
            write_control(d / "freezer.state", "THAWED")
    return signalled, bool(frozen)


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
    "DEFAULT_FREEZE_TIMEOUT_S",
    "DEFAULT_KILL_TIMEOUT_S",
    "ExitBoost",
    "KillReport",
    "PodKillReport",
    "kill_cgroups",
    "kill_pods",
    "signal_cgroups",
    "wait_cgroups_empty",
]
