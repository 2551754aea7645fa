"""The values ``plan_spot`` (controller/core/spot_solver.py) takes and returns, apart from the rules.

KmodView       what the kernel module does now, as the loop last applied it
SpotState      busy / away / stolen / back (design §6)
GpuSpot        one real GPU's state, owner, borrowers and why
ReturnTarget   what to do the moment one watched owner's notice arrives, without a pass
SpotPlan       a pass's spot actions, GPU states, return table and next timer
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from controller.core.actions import Action, KillPods
from gpushare.ids import format_spot_id


@dataclass(frozen=True)
class KmodView:
    """What the kernel module does now, as the loop last applied it (empty after a restart)."""

    available: bool
    added: frozenset[int] = frozenset()
    detecting: frozenset[int] = frozenset()


class SpotState(StrEnum):
    BUSY = "busy"
    AWAY = "away"
    STOLEN = "stolen"
    BACK = "back"


@dataclass(frozen=True)
class GpuSpot:
    """The outcome for one real GPU, for logs and ``gpushare status``."""

    real_id: str
    state: SpotState
    owner: str  # "ns/pod/container", or "" when no lendable owner holds it
    borrowers: tuple[str, ...]
    reason: str

    @property
    def device_id(self) -> str:
        return format_spot_id(self.real_id)


@dataclass(frozen=True)
class ReturnTarget:
    """A watched owner (its pid namespace armed in the kernel module) and what its return costs.

    The spot runtime keeps the latest pass's table of these, so a kernel notice starts the kill at
    once and releases the owner as soon as ``kill``'s pods have no task left, without a pass.
    ``kill`` is None when nothing is lent (the owner is only away): the owner is released at once.
    """

    pidns: int
    owner: str  # "ns/pod/container"
    real_ids: tuple[str, ...]
    kill: KillPods | None


@dataclass(frozen=True)
class SpotPlan:
    actions: tuple[Action, ...]
    gpus: tuple[GpuSpot, ...]
    # Real ID -> when its owner last came back; store it (state.py) and pass it back.
    back_at: Mapping[str, float]
    # Pid namespace -> what its notice must do now (ReturnTarget); hand it to the spot runtime.
    returns: Mapping[int, ReturnTarget] = field(default_factory=dict)
    # Wall-clock time at which an idle owner completes its window (the next pass is due then), if any.
    next_change_at: float | None = None

    @property
    def lent_real_ids(self) -> tuple[str, ...]:
        """GPUs lent out now (``PluginManager.set_spot_lent``: prefer idle devices over lent ones)."""
        return tuple(g.real_id for g in self.gpus if g.state == SpotState.STOLEN)


__all__ = ["GpuSpot", "KmodView", "ReturnTarget", "SpotPlan", "SpotState"]
