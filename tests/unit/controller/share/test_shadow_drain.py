"""Removing an idle shadow: marked, withdrawn and published by its node, answered, then deleted."""

from __future__ import annotations

from typing import Any

from controller.core.actions import AnnotatePod, CreateShadow, DeleteShadow, PublishCapacity, SetDevices
from controller.core.mapping import MappingCache
from controller.share.shadow_drain import (
    DRAIN_SETTLE_S,
    hold_withdrawals,
    published_counts,
    sharers_waiting,
    withdrawn_now,
)
from controller.share.solver import plan_node_shares, plan_shadows
from gpushare import keys
from gpushare.config import Config
from tests.unit.controller.podmaker import NODE, row, shadow, sharer, snap

NOW = 10_000.0
CFG = Config(node_name=NODE)
MARK, ANSWER = keys.ANNOTATION_SHADOW_DRAINING, keys.ANNOTATION_SHADOW_DRAINED
TOKEN = f"{NOW - 100:.3f}"
RESOURCE = "gpushare/share-gpu-4"
IDS = tuple(f"gpushare-system/s-{i}" for i in range(4))


def long_idle(*names: str) -> dict[str, float]:
    return {f"uid-gpushare-system-{n}": NOW - 5000 for n in names}


def marks(actions: Any) -> list[tuple[str, str, str | None]]:
    return [(a.ref.name, a.key, a.value) for a in actions if isinstance(a, AnnotatePod)]


def deleted(actions: Any) -> list[str]:
    return [a.ref.name for a in actions if isinstance(a, DeleteShadow)]


def draining(name: str = "s", *, answered: str | None = None, **kw: Any) -> dict[str, Any]:
    annotations = {MARK: TOKEN} | ({ANSWER: answered} if answered is not None else {})
    return shadow(name, annotations=annotations, **kw)


# --- the leader ----------------------------------------------------------------------------------------------


def test_an_idle_shadow_is_first_marked_draining_never_deleted_at_once() -> None:
    plan = plan_shadows(snap([shadow("s")]), CFG, NOW, long_idle("s"))
    assert marks(plan.actions) == [("s", MARK, f"{NOW:.3f}")]
    assert deleted(plan.actions) == []


def test_a_draining_shadow_is_deleted_only_once_its_node_answered_this_very_mark() -> None:
    for answered, want in ((None, []), ("1.000", []), (TOKEN, ["s"])):
        plan = plan_shadows(snap([draining(answered=answered)]), CFG, NOW, long_idle("s"))
        assert deleted(plan.actions) == want, answered
        assert marks(plan.actions) == []  # no second mark, no un-marking while idle and not needed


def test_a_draining_shadow_offers_no_slots_so_new_demand_takes_it_back_instead_of_creating() -> None:
    pods = [draining(answered=TOKEN), draining("t"), sharer("p")]
    # The scheduler has said it cannot place p: p may not be bound anywhere soon, so only the
    # demand counts. One shadow is needed: the one whose devices are still listed comes back.
    plan = plan_shadows(snap(pods), CFG, NOW, long_idle("s", "t"), unplaceable={"default/p"})
    assert marks(plan.actions) == [("t", MARK, None)]
    assert deleted(plan.actions) == ["s"]
    assert [a for a in plan.actions if isinstance(a, CreateShadow)] == []
    assert plan.demand[0].free_slots == 4


def test_while_a_sharer_waits_for_the_scheduler_every_draining_shadow_goes_back_into_service() -> None:
    """The scheduler may have placed p on either node already, its binding waiting for the
    client's QPS, which no LIST shows: neither shadow's devices may go, the withdrawn ones come back."""
    pods = [draining(answered=TOKEN), draining("t"), sharer("p")]
    plan = plan_shadows(snap(pods), CFG, NOW, long_idle("s", "t"))
    assert marks(plan.actions) == [("t", MARK, None), ("s", MARK, None), ("s", ANSWER, None)]
    assert deleted(plan.actions) == []
    assert [a for a in plan.actions if isinstance(a, CreateShadow)] == []


def test_a_shadow_a_sharer_reached_while_draining_goes_back_into_service() -> None:
    users = {"default/u/app": ["gpushare-system/s-0"]}
    plan = plan_shadows(snap([draining(answered=TOKEN, users=users)]), CFG, NOW, long_idle("s"))
    assert marks(plan.actions) == [("s", MARK, None), ("s", ANSWER, None)]
    assert deleted(plan.actions) == []


def test_a_just_bound_sharer_is_counted_on_a_shadow_in_service_before_a_draining_one() -> None:
    pods = [draining("a"), shadow("b"), sharer("fresh", node=NODE, phase="Running")]
    plan = plan_shadows(snap(pods), CFG, NOW, long_idle("a", "b"))
    assert marks(plan.actions) == [] and deleted(plan.actions) == []  # b is busy, a keeps draining


# --- the node ------------------------------------------------------------------------------------------------


def node(pods: list[dict[str, Any]], rows: list[Any] = (), now: float | None = NOW) -> list[Any]:  # type: ignore[assignment]
    s = snap(pods)
    actions = plan_node_shares(s, MappingCache.rebuild(rows, s.pods, CFG.real_resources), CFG, now=now)
    return [a for a in actions if getattr(a, "resource", RESOURCE) == RESOURCE and not _records(a)]


def _records(a: Any) -> bool:
    return isinstance(a, AnnotatePod) and a.key in (keys.ANNOTATION_SHADOW_USERS, keys.ANNOTATION_SHADOW_OWNER)


PUBLISHED_LONG_AGO = f"{TOKEN} published {NOW - DRAIN_SETTLE_S - 1:.3f}"


def test_first_sight_of_a_mark_publishes_the_lower_count_notes_when_and_keeps_the_devices() -> None:
    (s,) = snap([draining()]).shadows
    assert node([draining()]) == [
        SetDevices(RESOURCE, IDS),
        PublishCapacity(RESOURCE, 0),
        AnnotatePod(s.ref, ANSWER, f"{TOKEN} published {NOW:.3f}"),
    ]


def test_while_settling_the_devices_stay_listed_and_the_lower_count_stays_published() -> None:
    recent = f"{TOKEN} published {NOW - DRAIN_SETTLE_S / 2:.3f}"
    assert node([draining(answered=recent)]) == [SetDevices(RESOURCE, IDS), PublishCapacity(RESOURCE, 0)]


def test_after_settling_withdraw_then_publish_then_answer_in_that_order() -> None:
    (s,) = snap([draining()]).shadows
    assert node([draining(answered=PUBLISHED_LONG_AGO)]) == [
        SetDevices(RESOURCE, ()),
        PublishCapacity(RESOURCE, 0),
        AnnotatePod(s.ref, ANSWER, TOKEN),
    ]
    # Answered already: the list stays empty and the count published, nothing is written again.
    assert node([draining(answered=TOKEN)]) == [SetDevices(RESOURCE, ()), PublishCapacity(RESOURCE, 0)]


def test_a_note_for_an_older_mark_or_unreadable_starts_the_settle_time_again() -> None:
    for note in (f"1.000 published {NOW - 100:.3f}", f"{TOKEN} published soon"):
        actions = node([draining(answered=note)])
        assert actions[0] == SetDevices(RESOURCE, IDS)
        assert actions[-1] == AnnotatePod(snap([draining()]).shadows[0].ref, ANSWER, f"{TOKEN} published {NOW:.3f}")


def test_a_sharer_bound_here_but_not_yet_admitted_keeps_the_devices_listed() -> None:
    pods = [draining(answered=PUBLISHED_LONG_AGO), sharer("landing", node=NODE, phase="Pending")]
    assert node(pods) == [SetDevices(RESOURCE, IDS), PublishCapacity(RESOURCE, 0)]


def test_a_draining_shadow_someone_holds_stays_offered_and_nothing_is_published() -> None:
    pods = [draining(answered=PUBLISHED_LONG_AGO), sharer("a", node=NODE, phase="Running")]
    held = [row("default/a", "app", RESOURCE, IDS[0])]
    assert node(pods, held) == [SetDevices(RESOURCE, IDS)]


def test_other_shadows_keep_their_devices_and_count() -> None:
    pods = [draining(answered=PUBLISHED_LONG_AGO), shadow("t")]
    other = tuple(f"gpushare-system/t-{i}" for i in range(4))
    assert node(pods)[:2] == [SetDevices(RESOURCE, other), PublishCapacity(RESOURCE, 4)]


def test_without_a_draining_shadow_no_count_is_published() -> None:
    assert node([shadow("s")]) == [SetDevices(RESOURCE, IDS)]


def test_without_a_clock_there_is_no_settle_time() -> None:
    assert node([draining()], now=None)[0] == SetDevices(RESOURCE, ())


# --- the fresh-LIST confirmation before a withdrawal -----------------------------------------------------------


def test_a_withdrawal_is_the_bare_answer_not_the_note_of_a_publish() -> None:
    (s,) = snap([draining()]).shadows
    withdrawing = node([draining(answered=PUBLISHED_LONG_AGO)])
    assert withdrawn_now(withdrawing) == [AnnotatePod(s.ref, ANSWER, TOKEN)]
    assert withdrawn_now(node([draining()])) == []  # the first sight only notes the publish
    assert withdrawn_now(node([draining(answered=TOKEN)])) == []  # withdrawn in an earlier pass
    assert published_counts(withdrawing) == {RESOURCE: 0}
    assert published_counts(node([shadow("s")])) == {}


def test_sharers_waiting_are_those_bound_here_unfinished_and_holding_no_device() -> None:
    pods = [
        sharer("landing", node=NODE, phase="Pending"),
        sharer("admitted", node=NODE, phase="Running"),
        sharer("failed", node=NODE, phase="Failed"),
        sharer("unbound"),
        sharer("other-spec", node=NODE, phase="Pending", spec=2),
    ]
    sharers = snap(pods).sharers_on(NODE)
    assert sharers_waiting(sharers, frozenset({"default/admitted"})) == {RESOURCE, "gpushare/share-gpu-2"}
    no_landing = [s for s in sharers if s.ref.name not in ("landing", "other-spec")]
    assert sharers_waiting(no_landing, frozenset({"default/admitted"})) == frozenset()
    assert sharers_waiting(no_landing, frozenset()) == {RESOURCE}  # running, but PodResources shows no device


def test_a_withdrawal_on_a_resource_a_sharer_waits_on_is_taken_back_whole() -> None:
    pods = [draining(answered=PUBLISHED_LONG_AGO), shadow("t")]
    s = {x.ref.name: x for x in snap(pods).shadows}
    planned = node(pods)
    other = tuple(f"gpushare-system/t-{i}" for i in range(4))
    assert planned == [
        SetDevices(RESOURCE, other),
        PublishCapacity(RESOURCE, 4),
        AnnotatePod(s["s"].ref, ANSWER, TOKEN),
    ]
    kept = hold_withdrawals(planned, s.values(), frozenset({RESOURCE}))
    # The devices stay listed, the count published stays as it was, and no answer lets the leader delete.
    assert kept == [SetDevices(RESOURCE, tuple(sorted(IDS + other))), PublishCapacity(RESOURCE, 4)]
    assert hold_withdrawals(planned, s.values(), None) == kept  # the LIST failed: keep them all
    assert hold_withdrawals(planned, s.values(), frozenset({"gpushare/share-gpu-2"})) == planned
    assert hold_withdrawals(planned, s.values(), frozenset()) == planned
