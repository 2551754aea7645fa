"""``KillContainers`` done on the host: SIGKILL a borrower's cgroups now, then confirm every task died.

``CgroupKiller.signal`` kills and returns at once; the ``Reaper`` thread (gpushare-spot-reaper)
watches each killed pod's cgroups until they list no task. It kills again any task forked
after the first read (freezing the cgroup first once that has gone on for ``FREEZE_AFTER_S``),
moves killed tasks still waiting for CPU into ``ExitBoost``'s cgroup, and gives up with an
ERROR after the killer's ``timeout_s``. Signalling every borrower of a return first and
waiting once lets their exits run in parallel (16 borrowers die in about the time of one).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from controller.core.actions import KillContainers
from controller.errors import KillTimeout
from controller.spot.cgroups import CgroupIndex, ContainerCgroup
from controller.spot.signals import ExitBoost, signal_cgroups, wait_cgroups_empty
from gpushare.log import kv

log = logging.getLogger(__name__)

# The first SIGKILL goes without freezing (freezing waits for every task to be scheduled:
# 16 borrowers took 68 ms p50 frozen vs 29 ms not, on 2 loaded cores); a cgroup still not
# empty after this long is frozen before the next round.
FREEZE_AFTER_S = 0.02
# Killed tasks still listed this long after the signal are waiting for CPU: move them to the
# highest-weight cpu cgroup (signals.ExitBoost) so they run their exit now.
BOOST_AFTER_S = 0.002
_REAP_POLL_S = 0.0005

# Called once per pod whose cgroups were seen empty: (action, return-signal time, time signalled, time dead).
OnDead = Callable[[KillContainers, float | None, float, float], None]


class CgroupKiller:
    """``KillContainers`` -> SIGKILL to every process of those containers, through their cgroups."""

    def __init__(self, *, index: CgroupIndex | None = None, timeout_s: float = 2.0, use_freezer: bool = False) -> None:
        self.index = index or CgroupIndex()
        self.use_freezer = use_freezer
        self._timeout_s = timeout_s

    def prepare(self, container_ids: Iterable[str]) -> None:
        """Find cgroups ahead of a kill (the walk then is not on the return path)."""
        self.index.locate(container_ids)

    @property
    def timeout_s(self) -> float:
        """How long a killed pod's tasks may take to die before the reaper gives up on them."""
        return self._timeout_s

    def signal(self, action: KillContainers) -> tuple[list[ContainerCgroup], set[int]]:
        """SIGKILL every task of the containers' cgroups without waiting: (cgroups to watch, pids signalled)."""
        found = self.index.locate(action.container_ids)
        cgroups = list(found.values())
        signalled, _ = signal_cgroups(cgroups, use_freezer=self.use_freezer)
        self.index.forget(action.container_ids)
        log.info(
            "spot kill",
            extra=kv(
                pod=action.ref.key,
                reason=action.reason,
                containers=len(found),
                not_found=len(set(action.container_ids) - set(found)),
                signalled=len(signalled),
            ),
        )
        return cgroups, signalled


@dataclass
class _Killed:
    """One killed pod the reaper still watches."""

    action: KillContainers
    cgroups: list[ContainerCgroup]
    signal_at: float | None  # the return signal that caused the kill, if one did
    signalled_at: float
    signalled: set[int]
    boosted: set[int] = field(default_factory=set)


class Reaper:
    """Watches killed pods' cgroups until they are empty, on a thread that runs while any is left."""

    def __init__(
        self, killer: CgroupKiller, on_dead: OnDead, *, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self._killer = killer
        self._on_dead = on_dead
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._killed: list[_Killed] = []
        self._thread: threading.Thread | None = None
        self._reaped = threading.Event()
        self.exit_boost = ExitBoost()

    def watch(
        self, action: KillContainers, cgroups: list[ContainerCgroup], signal_at: float | None, signalled: set[int]
    ) -> None:
        """Confirm the deaths of a pod just signalled; starts the thread if it is not running."""
        with self._lock:
            self._killed.append(_Killed(action, cgroups, signal_at, self._monotonic(), signalled))
            if self._thread is None:
                self._reaped.clear()
                self._thread = threading.Thread(target=self._run, name="gpushare-spot-reaper", daemon=True)
                self._thread.start()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until every watched pod is confirmed dead (or given up on); False on timeout."""
        with self._lock:
            if self._thread is None:
                return True
        return self._reaped.wait(self._killer.timeout_s + 1.0 if timeout_s is None else timeout_s)

    def _run(self) -> None:
        while True:
            with self._lock:
                batch = list(self._killed)
                if not batch:
                    self._thread = None
                    self._reaped.set()
                    return
            done = [entry for entry in batch if self._check(entry)]
            with self._lock:
                self._killed = [e for e in self._killed if e not in done]
            if len(done) < len(batch):
                time.sleep(_REAP_POLL_S)

    def _check(self, entry: _Killed) -> bool:
        """One look at a killed pod's cgroups; True once it needs no more watching."""
        listed = [(cg, cg.pids()) for cg in entry.cgroups]
        left = [cg for cg, pids in listed if pids]
        now = self._monotonic()
        is_done = False
        if not left:
            is_done = True
            self._on_dead(entry.action, entry.signal_at, entry.signalled_at, now)
        elif now - entry.signalled_at > self._killer.timeout_s:
            is_done = True
            try:
                wait_cgroups_empty(left, timeout_s=0.0)
            except KillTimeout as exc:
                log.error("spot: %s", exc, extra=kv(pod=entry.action.ref.key, reason=entry.action.reason))
        elif now - entry.signalled_at > BOOST_AFTER_S and (
            slow := [p for _, pids in listed for p in pids if p in entry.signalled and p not in entry.boosted]
        ):
            # Signalled but not yet gone: waiting for CPU behind their pod's weight.
            entry.boosted.update(slow)
            self.exit_boost.move(slow)
        if any(p not in entry.signalled for _, pids in listed for p in pids):
            # Tasks we never signalled: children forked between our read and our signal.
            # Kill them; if forks still come after FREEZE_AFTER_S, freeze first so a fork
            # loop cannot stay ahead. Tasks already signalled are only dying: wait.
            again, _ = signal_cgroups(left, use_freezer=now - entry.signalled_at > FREEZE_AFTER_S)
            entry.signalled |= again
        return is_done


__all__ = ["BOOST_AFTER_S", "FREEZE_AFTER_S", "CgroupKiller", "OnDead", "Reaper"]
