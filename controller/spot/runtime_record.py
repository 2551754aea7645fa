"""What one kill or return adds to spot's counters, ``dead`` list and ``last_return`` (controller/spot/runtime.py).

A kill counts as a return only when it did its job: an error (no task found although kubelet
reports the pod running, no pod cgroup, a failed write) or the kill bound passing is counted
on its own and never enters ``gpushare_spot_return_seconds`` as a fast return. The release
time is observed whenever the owner's held call was let go, since that is what the owner waited.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from controller.spot.counters import SpotCounters
from controller.spot.killer import KillOutcome
from gpushare.log import kv

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReturnRecord:
    outcome: KillOutcome | None  # None: nothing was lent, so nothing was killed
    first: frozenset[str]  # uids of the pods killed for the first time
    signal_at: float | None  # monotonic arrival of the return signal; None for a reclaim without one
    released_at: float | None  # monotonic time the owner's held call was released (notice path only)
    owner: str  # "ns/pod/container" when known

    @property
    def is_clean(self) -> bool:
        """The kill reached every task: no error, nothing left at the bound."""
        return self.outcome is not None and not self.outcome.error and not self.outcome.timed_out

    def count(self, counters: SpotCounters) -> None:
        """Add to the counters (under the runtime's lock); pods killed again count no error."""
        if self.outcome is not None and self.first:
            if self.outcome.error:
                counters.kill_errors[self.outcome.error] += 1
            elif self.outcome.timed_out:
                counters.bound_exceeded += 1
        if self.signal_at is None:
            return
        if self.released_at is not None:
            counters.observe_release(self.released_at - self.signal_at)
        if self.outcome is not None and self.first and self.is_clean:
            counters.observe_return(self.outcome.dead_at - self.signal_at)

    def dead(self) -> list[tuple[str, float]]:
        """(pod, time its tasks were seen gone) for each pod of a clean kill."""
        if self.outcome is None or not self.is_clean:
            return []
        return [(ref.key, self.outcome.dead_at) for ref in self.outcome.action.refs]

    def summary(self) -> dict[str, Any]:
        """``last_return`` for ``gpushare status``; {} for a kill that was no return."""
        if self.signal_at is None or (self.outcome is not None and not self.first):
            return {}
        out: dict[str, Any] = {"owner": self.owner, "at": time.time(), "pods": [], "borrowers": 0}
        if self.released_at is not None:
            out["release_ms"] = round((self.released_at - self.signal_at) * 1000, 2)
        if self.outcome is None:
            return out
        out.update(
            pods=[ref.key for ref in self.outcome.action.refs],
            borrowers=len(self.outcome.action.pods),
            signalled=self.outcome.signalled,
            kill_ms=round(self.outcome.took_s * 1000, 2),
        )
        if self.outcome.error:
            out["error"] = f"{self.outcome.error}: {self.outcome.detail}"
        elif self.outcome.timed_out:
            out["bound_exceeded"] = True
        else:
            out["return_to_dead_ms"] = round((self.outcome.dead_at - self.signal_at) * 1000, 2)
        return out


def log_return_failure(what: str, who: str, exc: Exception) -> None:
    """A step of the return path failed (closing a device, releasing the owner); the path goes on."""
    log.error("spot: %s: %s", what, exc, extra=kv(target=who))


__all__ = ["ReturnRecord", "log_return_failure"]
