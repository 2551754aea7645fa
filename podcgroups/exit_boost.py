"""A CPU boost for tasks already SIGKILLed: their exit runs now instead of behind their pod's CPU weight.

Only on cgroup v1, where the cpu hierarchy is separate from the ones that decide "dead" (the
freezer or pids hierarchy): moving a task there changes nothing of what the killer watches.
On v2 there is one hierarchy, and moving a dying task out of its pod's cgroup would make the
pod look empty while the task still runs, so v2 kills go without it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

from podcgroups.cgroups import CGROUP_ROOT

log = logging.getLogger(__name__)


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


__all__ = ["ExitBoost"]
