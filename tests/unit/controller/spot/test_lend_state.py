"""Whether a spot lend is active now (the NRI plugin's LendState): a table over the agent's view."""

from __future__ import annotations

import pytest

from controller.spot.lend_state import AgentLendState, LendStateUnknown
from controller.spot.solver import GpuSpot, SpotState
from nri_plugin import LendState, OracleUnavailable

STOLEN = GpuSpot("g0", SpotState.STOLEN, "team/owner/main", ("spot/job",), "lent")
BACK = GpuSpot("g0", SpotState.BACK, "team/owner/main", ("spot/job",), "owner returned (kernel notice)")
AWAY = GpuSpot("g0", SpotState.AWAY, "team/owner/main", (), "idle 12s")


def state(gpus: tuple[GpuSpot, ...] | None, healthy: bool, reclaimed: frozenset[str] = frozenset()) -> AgentLendState:
    return AgentLendState(lambda: gpus, lambda dev: healthy and dev == "spot-g0", lambda uid: uid in reclaimed)


@pytest.mark.parametrize(
    ("lends", "pod", "uid", "want"),
    [
        # Healthy device: kubelet may give it to a borrower now (away, or lent with known metrics).
        (state((AWAY,), True), "job", "u1", None),
        (state((STOLEN,), True), "job", "u1", None),
        # Lent to this pod while the device is closed to newcomers (metrics unknown): the lend goes on.
        (state((STOLEN,), False), "job", "u1", None),
        # ... but not to another pod.
        (state((STOLEN,), False), "other", "u2", "the GPU is stolen and closed to borrowers: lent"),
        # The owner came back: the lend ended.
        (state((BACK,), False), "job", "u1", "the GPU is back and closed to borrowers: owner returned"),
        # A reclaimed pod never gets it again, even once the GPU is lendable again.
        (state((AWAY,), True, frozenset({"u1"})), "job", "u1", "the pod was reclaimed"),
        (state((), False), "job", "u1", "the agent's last pass does not know GPU g0"),
    ],
)
def test_lend_ended(lends: AgentLendState, pod: str, uid: str, want: str | None) -> None:
    assert isinstance(lends, LendState)
    got = lends.lend_ended("g0", "spot", pod, uid)
    assert got == want if want is None else (got is not None and got.startswith(want)), got


def test_before_the_first_pass_it_cannot_answer() -> None:
    with pytest.raises(LendStateUnknown, match="not planned spot") as info:
        state(None, True).lend_ended("g0", "spot", "job", "u1")
    assert isinstance(info.value, OracleUnavailable)  # the NRI plugin refuses: fail closed
