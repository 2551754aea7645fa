"""The hook points spot lends the reconcile loop.

The loop calls them; ``controller.spot.runtime.SpotRuntime`` provides them. This module sits
below both, so spot never imports the loop.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from controller.core.actions import KillPods, KmodCommand
from controller.core.detectors import IdleVerdict
from controller.spot.solver import KmodView, ReturnTarget


def _no_table(_returns: Mapping[int, ReturnTarget]) -> None:
    return None


@dataclass(frozen=True)
class SpotHooks:
    """Everything spot lends the loop; the loop calls ``plan_spot`` only when these are given."""

    verdicts: Callable[[float], Mapping[str, IdleVerdict]]  # once per pass, with `now` (wall clock)
    notices: Callable[[], Sequence[int]]  # DRAIN kernel notices (pid-ns inodes) since the last call
    kmod_view: Callable[[], KmodView]  # what the kernel module has now
    kmod: Callable[[KmodCommand], None]  # apply one command; raise GpushareError on failure
    killer: Callable[[KillPods], None]  # SIGKILL those pods' tasks now; returns without waiting
    pidns_of: Callable[[str], int | None] = lambda _cid: None  # container id -> pid-ns inode
    # The pass's return table (SpotPlan.returns), handed over before its actions are applied.
    arm: Callable[[Mapping[int, ReturnTarget]], None] = _no_table
    # Why nothing may be lent on this node ("" when lending is possible), asked once per pass.
    blocked: Callable[[], str] = lambda: ""


__all__ = ["SpotHooks"]
