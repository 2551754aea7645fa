from __future__ import annotations

from typing import Any

import pytest

from controller.core.actions import (
    REASON_NOT_LENDABLE,
    REASON_OWNER_BACK,
    REASON_OWNER_LEFT,
    REASON_SPOT_BLOCKED,
    Evict,
    KillPods,
    KmodCommand,
    PodToKill,
    RecordNodeEvent,
    SetSpotHealth,
)
from controller.core.detectors import IdleState, IdleStatus, IdleVerdict, verdict_from_status
from controller.core.mapping import MappingCache
from controller.core.pod_facts import PodRef
from controller.spot.solver import KmodView, ReturnTarget, SpotPlan, SpotState, plan_spot
from gpumetrics.model import Workload
from gpushare import keys
from tests.unit.controller.podmaker import NODE, pod, row, snap

NOW = 50_000.0
WINDOW = 600.0
REAL = ("nvidia.com/gpu",)
PIDNS = 4026532001
OWNER = PodRef("team", "owner", "uid-team-owner")
JOB = PodRef("spot", "job", "uid-spot-job")
KMOD = KmodView(available=True)
NO_KMOD = KmodView(available=False)


def idle(since: float = NOW - WINDOW, users: frozenset[str] | None = None, rid: str = "GPU-0") -> IdleVerdict:
    return IdleVerdict(rid, "idle", since, users)


def active(users: frozenset[str] | None = None, rid: str = "GPU-0") -> IdleVerdict:
    return IdleVerdict(rid, "active", None, users)


def world(
    *,
    lendable: bool = True,
    ns_lendable: bool = False,
    owner: bool = True,
    owner_phase: str = "Running",
    gpus: tuple[str, ...] = ("GPU-0",),
    borrower: bool = False,
    borrower_deleting: bool = False,
    owner_unresolved: bool = False,
    borrower_running: bool = True,
    borrower_also: dict[str, int] | None = None,
) -> tuple[Any, MappingCache]:
    pods: list[dict[str, Any]] = []
    rows = []
    if owner:
        labels = {keys.LABEL_LENDABLE: "true"} if lendable else None
        gpu_req = {"nvidia.com/gpu": len(gpus)}
        ids = {"app": "c-owner"}
        pods.append(
            pod("owner", "team", labels=labels, requests=gpu_req, node=NODE, phase=owner_phase, container_ids=ids)
        )
    if owner or owner_unresolved:
        rows.append(row("team/owner", "app", "nvidia.com/gpu", *gpus))
    if borrower:
        ids = {"app": "c-job", "side": "c-side"}
        spot_req = {keys.RESOURCE_SPOT_GPU: 1, **(borrower_also or {})}
        pods.append(
            pod(
                "job",
                "spot",
                requests=spot_req,
                node=NODE,
                phase="Running",
                container_ids=ids,
                containers=["app", "side"],
                deleting=borrower_deleting,
                running=borrower_running,
            )
        )
        rows.append(row("spot/job", "app", keys.RESOURCE_SPOT_GPU, "spot-GPU-0"))
    s = snap(
        pods,
        pod_resources=rows,
        allocatable={"nvidia.com/gpu": ("GPU-0", "GPU-1")},
        pidns_by_container={"c-owner": PIDNS},
        lendable_namespaces=["team"] if ns_lendable else [],
    )
    return s, MappingCache.rebuild(rows, s.pods, REAL)


def run(
    w: tuple[Any, MappingCache],
    *verdicts: IdleVerdict,
    notices: tuple[int, ...] = (),
    kmod: KmodView = KMOD,
    back_at: dict[str, float] | None = None,
    now: float = NOW,
    blocked: str = "",
) -> SpotPlan:
    s, m = w
    return plan_spot(
        s,
        m,
        real_resources=REAL,
        verdicts={v.real_id: v for v in verdicts},
        notices=notices,
        kmod=kmod,
        back_at=back_at or {},
        now=now,
        idle_window_s=WINDOW,
        lending_blocked=blocked,
    )


def state(plan: SpotPlan, rid: str = "GPU-0") -> SpotState:
    return next(g.state for g in plan.gpus if g.real_id == rid)


def health(plan: SpotPlan) -> dict[str, bool]:
    return {a.device_id: a.is_healthy for a in plan.actions if isinstance(a, SetSpotHealth)}


def kmod_ops(plan: SpotPlan) -> list[tuple[str, int]]:
    return [(a.op, a.pidns) for a in plan.actions if isinstance(a, KmodCommand)]


def evictions_of(plan: SpotPlan) -> list[Evict]:
    return [a for a in plan.actions if isinstance(a, Evict)]


def evictions(plan: SpotPlan) -> list[tuple[str, str]]:
    return [(a.ref.key, a.reason) for a in plan.actions if isinstance(a, Evict)]


# --- busy and away ------------------------------------------------------------------------------------------------


def test_busy_by_default_unhealthy_and_watched_but_not_detected() -> None:
    plan = run(world(), active())
    assert state(plan) == SpotState.BUSY and state(plan, "GPU-1") == SpotState.BUSY
    assert health(plan) == {"spot-GPU-0": False, "spot-GPU-1": False}
    assert kmod_ops(plan) == [("add", PIDNS)]  # kept in step with the owner container; no detect


@pytest.mark.parametrize(
    "verdicts",
    [
        (),  # no metrics at all
        (IdleVerdict("GPU-0", "unknown"),),
        (IdleVerdict("GPU-0", "idle", None),),  # "idle" without a streak start is not idle
        (idle(NOW - WINDOW + 1),),  # one second short of the window
    ],
)
def test_unknown_or_short_metrics_never_make_an_owner_away(verdicts: tuple[IdleVerdict, ...]) -> None:
    plan = run(world(), *verdicts)
    assert state(plan) == SpotState.BUSY and health(plan)["spot-GPU-0"] is False
    assert ("detect", PIDNS) not in kmod_ops(plan)


def test_away_after_the_window_kernel_watches_before_the_device_turns_healthy() -> None:
    plan = run(world(), idle())
    assert state(plan) == SpotState.AWAY and health(plan)["spot-GPU-0"] is True
    assert health(plan)["spot-GPU-1"] is False  # no owner: nothing to lend
    ops = list(plan.actions)
    detect = ops.index(KmodCommand("detect", PIDNS))
    assert ops.index(KmodCommand("add", PIDNS)) < detect < ops.index(SetSpotHealth("GPU-0", True, "idle for 600s"))


@pytest.mark.parametrize(
    ("kmod", "users", "want"),
    [
        (NO_KMOD, None, SpotState.BUSY),  # no way to see the owner return: never lend
        (NO_KMOD, frozenset(), SpotState.AWAY),  # utilization alone, attributed to pods
        (KMOD, None, SpotState.AWAY),  # the kernel module watches the pid namespace
    ],
)
def test_lending_needs_a_return_signal(kmod: KmodView, users: frozenset[str] | None, want: SpotState) -> None:
    plan = run(world(), idle(users=users), kmod=kmod)
    assert state(plan) == want
    if not kmod.available:
        assert kmod_ops(plan) == []


@pytest.mark.parametrize(
    ("kw", "want"),
    [
        ({"lendable": False}, SpotState.BUSY),
        ({"lendable": False, "ns_lendable": True}, SpotState.AWAY),  # the namespace label is enough
        ({"owner_phase": "Pending"}, SpotState.BUSY),
    ],
)
def test_only_running_lendable_owners_lend(kw: dict[str, Any], want: SpotState) -> None:
    assert state(run(world(**kw), idle())) == want


def test_multi_gpu_owner_is_away_only_when_every_gpu_is_idle() -> None:
    w = world(gpus=("GPU-0", "GPU-1"))
    assert {g.state for g in run(w, idle(), active(rid="GPU-1")).gpus} == {SpotState.BUSY}
    assert {g.state for g in run(w, idle(), idle(rid="GPU-1")).gpus} == {SpotState.AWAY}


# --- stolen and back ----------------------------------------------------------------------------------------------

LENT = KmodView(True, frozenset({PIDNS}), frozenset({PIDNS}))


def test_stolen_keeps_lending_and_evicts_nobody() -> None:
    plan = run(world(borrower=True), active(), kmod=LENT)  # the borrower's own work: not attributed
    assert state(plan) == SpotState.STOLEN and evictions(plan) == []
    assert kmod_ops(plan) == []  # already added and detecting
    assert plan.gpus[0].borrowers == ("spot/job",)
    assert plan.lent_real_ids == ("GPU-0",)  # the spot plugin's preference hint


def test_back_by_kernel_notice_runs_the_return_sequence_in_order() -> None:
    plan = run(world(borrower=True), idle(), notices=(PIDNS,), kmod=LENT)
    assert state(plan) == SpotState.BACK
    assert list(plan.actions[:5]) == [
        SetSpotHealth("GPU-0", False, REASON_OWNER_BACK),
        KillPods((PodToKill(JOB, 2),), REASON_OWNER_BACK),
        Evict(JOB, REASON_OWNER_BACK, plan.actions[2].message),  # type: ignore[union-attr]
        KmodCommand("release", PIDNS),
        KmodCommand("undetect", PIDNS),
    ]
    assert "kernel notice" in plan.actions[2].message  # type: ignore[union-attr]
    assert kmod_ops(plan) == [("release", PIDNS), ("undetect", PIDNS)]  # no second undetect, no re-detect
    assert plan.back_at == {"GPU-0": NOW}
    assert health(plan)["spot-GPU-0"] is False


def test_a_pod_whose_mix_the_node_refuses_is_reclaimed_with_the_borrowers() -> None:
    # Admitted while the policy only warned: it asks for a share too, so it is no SpotPod, but
    # kubelet says it holds spot-GPU-0, and that makes it a borrower when the owner comes back.
    w = world(borrower=True, borrower_also={"gpushare/share-gpu-4": 1})
    assert w[0].spot_pods == () and [p.ref.key for p in w[0].refused] == ["spot/job"]
    plan = run(w, idle(), notices=(PIDNS,), kmod=LENT)
    assert state(plan) == SpotState.BACK
    assert KillPods((PodToKill(JOB, 2),), REASON_OWNER_BACK) in plan.actions
    assert evictions(plan) == [("spot/job", REASON_OWNER_BACK)]


@pytest.mark.parametrize(
    ("users", "want"),
    [
        (frozenset({"team/owner"}), SpotState.BACK),  # the owner's own process
        (frozenset({"spot/job", "team/other"}), SpotState.BACK),  # anyone who is not a borrower
        (frozenset({"spot/job"}), SpotState.STOLEN),  # only the borrower: still lent
        (None, SpotState.STOLEN),  # cannot attribute: the kernel notice is the signal
    ],
)
def test_back_by_utilization_from_a_non_borrower(users: frozenset[str] | None, want: SpotState) -> None:
    plan = run(world(borrower=True), active(users=users), kmod=NO_KMOD)
    assert state(plan) == want
    assert bool(evictions(plan)) == (want == SpotState.BACK)
    assert kmod_ops(plan) == []


def test_not_away_again_until_a_full_window_after_the_return() -> None:
    back_at = {"GPU-0": NOW - 100}
    # The tracker's streak began before the return (the held ioctl showed no utilization).
    assert state(run(world(), idle(NOW - 5000), back_at=back_at)) == SpotState.BUSY
    assert state(run(world(), idle(NOW - 5000), back_at=back_at, now=NOW - 100 + WINDOW)) == SpotState.AWAY


def test_notice_while_away_without_borrower_releases_at_once() -> None:
    plan = run(world(), idle(), notices=(PIDNS,), kmod=LENT)
    assert state(plan) == SpotState.BACK and evictions(plan) == []
    assert kmod_ops(plan) == [("release", PIDNS), ("undetect", PIDNS)]
    assert health(plan)["spot-GPU-0"] is False


def test_a_spot_pod_is_not_admitted_while_the_owner_is_busy() -> None:
    # Busy owner: the device is Unhealthy, so kubelet admits no spot pod there...
    assert health(run(world(), active(users=frozenset({"team/owner"})), kmod=NO_KMOD))["spot-GPU-0"] is False
    # ...and one that slipped in (a race with the return) is reclaimed at once.
    plan = run(world(borrower=True), active(users=frozenset({"team/owner"})), kmod=NO_KMOD)
    assert evictions(plan) == [("spot/job", REASON_OWNER_BACK)]


def test_terminating_borrower_is_killed_but_not_deleted_twice() -> None:
    plan = run(world(borrower=True, borrower_deleting=True), idle(), notices=(PIDNS,), kmod=LENT)
    assert [a for a in plan.actions if isinstance(a, KillPods)] == [KillPods((PodToKill(JOB, 2),), REASON_OWNER_BACK)]
    assert evictions(plan) == []


def test_the_pass_after_a_return_does_not_lend_again_while_the_borrower_is_being_deleted() -> None:
    # The notice was handled and the delete accepted; kubelet can still restart the killed container
    # until the delete reaches it. With no return signal left and the owner idle, lending again now
    # would hand the owner's GPU to that restarted container.
    plan = run(world(borrower=True, borrower_deleting=True), idle(), kmod=LENT)
    assert state(plan) == SpotState.BACK
    assert health(plan)["spot-GPU-0"] is False
    assert [a for a in plan.actions if isinstance(a, KillPods)] == [KillPods((PodToKill(JOB, 2),), REASON_OWNER_BACK)]
    assert evictions(plan) == [] and plan.lent_real_ids == ()


@pytest.mark.parametrize(
    ("kw", "reason"),
    [
        ({"owner": False}, REASON_OWNER_LEFT),  # owner pod gone: its GPU is free in kubelet's eyes
        ({"lendable": False}, REASON_NOT_LENDABLE),  # label withdrawn while lent
        ({"owner_phase": "Failed"}, REASON_OWNER_LEFT),
    ],
)
def test_borrower_loses_a_gpu_nobody_lends(kw: dict[str, Any], reason: str) -> None:
    plan = run(world(borrower=True, **kw), idle(), kmod=LENT)
    assert evictions(plan) == [("spot/job", reason)]
    assert plan.actions[0] == SetSpotHealth("GPU-0", False, reason)
    # Only after the kill: release any held caller, stop watching, forget the namespace.
    assert kmod_ops(plan) == [("release", PIDNS), ("undetect", PIDNS), ("delete", PIDNS)]
    assert plan.actions.index(KmodCommand("release", PIDNS)) > plan.actions.index(evictions_of(plan)[0])


def test_holder_not_yet_in_the_pod_cache_is_unknown_not_gone() -> None:
    plan = run(world(owner=False, owner_unresolved=True, borrower=True), idle())
    assert evictions(plan) == [] and health(plan)["spot-GPU-0"] is False


def test_restart_while_lent_continues_lending_without_false_eviction() -> None:
    # Fresh process: the kernel module view is empty and the idle tracker has no samples yet.
    plan = run(world(borrower=True), kmod=KMOD)
    assert state(plan) == SpotState.STOLEN and evictions(plan) == []
    assert [a for a in plan.actions if isinstance(a, KillPods)] == []
    assert kmod_ops(plan) == [("add", PIDNS), ("detect", PIDNS)]  # the watch is restored
    assert health(plan)["spot-GPU-0"] is False  # fail closed while metrics are unknown
    # Same without the kernel module: still no eviction.
    assert evictions(run(world(borrower=True), kmod=NO_KMOD)) == []


def test_stray_notice_is_released_so_no_caller_waits_for_the_timeout() -> None:
    plan = run(world(), active(), notices=(999,), kmod=KmodView(True, frozenset({999}), frozenset({999})))
    assert kmod_ops(plan) == [("release", 999), ("undetect", 999), ("delete", 999), ("add", PIDNS)]


@pytest.mark.parametrize(
    ("state", "idle_since", "process_level", "want"),
    [
        (IdleState.IDLE, 10.0, True, IdleVerdict("GPU-0", "idle", 10.0, frozenset({"team/owner"}))),
        (IdleState.IDLING, 10.0, False, IdleVerdict("GPU-0", "idle", 10.0, None)),  # the solver checks the window
        (IdleState.BUSY, None, True, IdleVerdict("GPU-0", "active", None, frozenset({"team/owner"}))),
        (IdleState.BUSY, None, False, IdleVerdict("GPU-0", "active", None, None)),  # allocation-level labels
        (IdleState.UNKNOWN, None, True, IdleVerdict("GPU-0", "unknown", None, None)),
    ],
)
def test_idle_detector_status_becomes_a_verdict(
    state: IdleState, idle_since: float | None, process_level: bool, want: IdleVerdict
) -> None:
    status = IdleStatus("uuid-0", state, idle_since, 0.0, 5.0, "r", 0.0, (Workload("team", "owner", "app"),))
    assert verdict_from_status("GPU-0", status, is_process_level=process_level) == want


def test_an_owner_busy_again_without_a_notice_is_released_before_it_is_unwatched() -> None:
    # Away and watched; now active with no notice yet (it may be in flight while the kernel holds a call).
    plan = run(world(), active(), kmod=LENT)
    assert state(plan) == SpotState.BUSY
    assert kmod_ops(plan) == [("release", PIDNS), ("undetect", PIDNS)]


# --- the return table, lending blocked, the next deadline -------------------------------------------------------


def test_the_return_table_names_each_watched_owners_borrowers() -> None:
    # Away: armed, nothing to kill (a notice releases the owner at once).
    assert run(world(), idle(), kmod=LENT).returns == {PIDNS: ReturnTarget(PIDNS, "team/owner/app", ("GPU-0",), None)}
    # Stolen: a notice kills the borrower pod (both containers running) before the owner runs.
    plan = run(world(borrower=True), active(), kmod=LENT)
    assert plan.returns == {
        PIDNS: ReturnTarget(PIDNS, "team/owner/app", ("GPU-0",), KillPods((PodToKill(JOB, 2),), REASON_OWNER_BACK))
    }
    # Not watched (busy, no module, or back in this pass): no entry, the pass decides.
    assert run(world(), active(), kmod=LENT).returns == {}
    assert run(world(borrower=True), active(users=frozenset({"team/owner"})), kmod=NO_KMOD).returns == {}
    assert run(world(borrower=True), idle(), notices=(PIDNS,), kmod=LENT).returns == {}


def test_a_borrower_not_running_yet_is_killed_but_counts_no_running_container() -> None:
    plan = run(world(borrower=True, borrower_running=False), idle(), notices=(PIDNS,), kmod=LENT)
    assert [a for a in plan.actions if isinstance(a, KillPods)] == [KillPods((PodToKill(JOB, 0),), REASON_OWNER_BACK)]


def test_lending_blocked_lends_nothing_and_says_so_on_the_node() -> None:
    why = "no kubepods cgroup under /x (cgroup v2)"
    plan = run(world(), idle(), kmod=LENT, blocked=why)
    assert state(plan) == SpotState.BUSY and health(plan) == {"spot-GPU-0": False, "spot-GPU-1": False}
    assert why in plan.gpus[0].reason and ("detect", PIDNS) not in kmod_ops(plan)
    assert plan.actions[-1] == RecordNodeEvent(REASON_SPOT_BLOCKED, f"gpushare: spot lends no GPU on this node: {why}")
    # A borrower admitted before keeps running (no false eviction) but no new one is admitted.
    plan = run(world(borrower=True), active(), kmod=LENT, blocked=why)
    assert state(plan) == SpotState.STOLEN and health(plan)["spot-GPU-0"] is False and evictions(plan) == []
    assert not any(isinstance(a, RecordNodeEvent) for a in run(world(), idle(), kmod=LENT).actions)


def test_the_next_pass_is_due_when_an_idle_owners_window_ends() -> None:
    assert run(world(), idle(NOW - WINDOW + 30)).next_change_at == NOW + 30
    assert run(world(), idle(NOW - 5000), back_at={"GPU-0": NOW - 100}).next_change_at == NOW - 100 + WINDOW
    assert run(world(), idle()).next_change_at is None  # away already
    assert run(world(), active()).next_change_at is None  # nothing is counting
