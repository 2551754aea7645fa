"""Whether a spot lend is active now: the ``nri_plugin.LendState`` the agent gives its NRI plugin.

A borrower's container may be created again after its lend ended: kubelet restarts a container
it saw die (the reclaim's SIGKILL), or creates one while the pod waits for deletion. The NRI
plugin asks this before it injects a lent GPU (design §6, §8), and refuses unless the lend is
active now, by the one rule ``gpushare.rules.may_borrow`` that the spot device plugin's
Allocate also follows. This module gathers what the rule reads and says why not.

Before the loop's first pass there is no plan to ask: that is ``OracleUnavailable``, and the
NRI plugin refuses (fail closed).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from controller.spot.solver import GpuSpot, SpotState
from gpushare.ids import format_spot_id
from gpushare.rules import may_borrow
from nri_plugin.errors import OracleUnavailable


class LendStateUnknown(OracleUnavailable):
    """The agent has no spot plan yet."""


class AgentLendState:
    """``lend_ended(real_id, namespace, pod, uid)``: None while lent to that pod, else why not.

    ``gpus`` returns the last pass's spot outcome (None before the first pass); ``healthy`` says
    whether a ``spot-<id>`` device is advertised Healthy now; ``reclaimed`` whether the spot
    runtime killed the pod with that uid.
    """

    def __init__(
        self,
        gpus: Callable[[], Iterable[GpuSpot] | None],
        healthy: Callable[[str], bool],
        reclaimed: Callable[[str], bool],
    ) -> None:
        self._gpus = gpus
        self._healthy = healthy
        self._reclaimed = reclaimed

    def lend_ended(self, real_id: str, namespace: str, pod: str, uid: str) -> str | None:
        reclaimed = bool(uid) and self._reclaimed(uid)
        if reclaimed:
            return "the pod was reclaimed (its GPU's owner came back, left or stopped lending)"
        gpus = self._gpus()
        if gpus is None:
            raise LendStateUnknown("gpushare: the agent has not planned spot on this node yet (no pass so far)")
        healthy = self._healthy(format_spot_id(real_id))
        spot = next((g for g in gpus if g.real_id == real_id), None)
        lent_here = spot is not None and spot.state == SpotState.STOLEN and f"{namespace}/{pod}" in spot.borrowers
        if may_borrow(device_healthy=healthy, lent_to_this_pod=lent_here, reclaimed=reclaimed):
            return None
        if spot is None:
            return f"the agent's last pass does not know GPU {real_id}"
        why = f": {spot.reason}" if spot.reason else ""
        return f"the GPU is {spot.state} and closed to borrowers{why}"


__all__ = ["AgentLendState", "LendStateUnknown"]
