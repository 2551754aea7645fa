from __future__ import annotations

import dataclasses

import pytest

from controller.core.actions import (
    REASON_OWNER_BACK,
    Action,
    AnnotatePod,
    CreateShadow,
    DeleteShadow,
    Evict,
    KillPods,
    KmodCommand,
    PodToKill,
    RecordEvent,
    RecordNodeEvent,
    SetDevices,
    SetSpotHealth,
    describe,
)
from controller.core.model import Pool, ShareKey
from controller.core.pod_facts import PodRef

REF = PodRef("ns", "p", "u")
KEY = ShareKey(Pool("nvidia.com/gpu"), "share", 4)


@pytest.mark.parametrize(
    ("action", "line"),
    [
        (
            CreateShadow(KEY, "shadow-0", {}),
            "decision=create-shadow shadow=shadow-0 key=nvidia.com/gpu/gpushare/share-gpu-4 reason=ShadowDemand",
        ),
        (DeleteShadow(REF), "decision=delete-shadow shadow=ns/p reason=ShadowIdle"),
        (Evict(REF, REASON_OWNER_BACK, "why"), "decision=evict pod=ns/p reason=OwnerBack"),
        (
            KillPods((PodToKill(REF, 2), PodToKill(PodRef("ns", "q", "v"), 0)), REASON_OWNER_BACK),
            "decision=kill pods=ns/p,ns/q reason=OwnerBack",
        ),
        (
            SetDevices("gpushare/share-gpu-2", ("x-0", "x-1")),
            "decision=set-devices resource=gpushare/share-gpu-2 devices=2",
        ),
        (SetSpotHealth("G", True, "idle"), "decision=spot-health device=spot-G healthy=True reason=idle"),
        (KmodCommand("release", 7), "decision=kmod-release pidns=7"),
        (AnnotatePod(REF, "k", None), "decision=annotate pod=ns/p key=k"),
        (RecordEvent(REF, "R", "m", "Warning"), "decision=event pod=ns/p reason=R"),
        (RecordNodeEvent("SpotLendingBlocked", "m"), "decision=node-event reason=SpotLendingBlocked"),
    ],
)
def test_one_log_line_per_decision(action: Action, line: str) -> None:
    assert describe(action) == line
    with pytest.raises(dataclasses.FrozenInstanceError):
        action.reason = "changed"  # type: ignore[misc,union-attr]


def test_create_shadow_compares_by_name_not_manifest() -> None:
    # The manifest is a dict: equality and hashing go by key and name, so plans compare in tests and sets.
    assert CreateShadow(KEY, "s-0", {"a": 1}) == CreateShadow(KEY, "s-0", {"b": 2})
    assert len({CreateShadow(KEY, "s-0", {}), CreateShadow(KEY, "s-1", {})}) == 2
