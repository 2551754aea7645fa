"""A sharer that left the leader's pending view keeps its slot until its node records it."""

from __future__ import annotations

from controller.core.actions import CreateShadow
from controller.core.model import Pool, ShareKey
from controller.share.placing import PLACING_TTL_S, Seen, placing_slots, track_placing
from controller.share.solver import plan_shadows
from gpushare import keys
from gpushare.config import Config
from tests.unit.controller.podmaker import NODE, shadow, sharer, snap

NOW = 10_000.0
CFG = Config(node_name=NODE)
KEY4 = ShareKey(Pool("nvidia.com/gpu"), keys.KIND_SHARE, 4)


def creates(plan_actions: object) -> int:
    return sum(isinstance(a, CreateShadow) for a in plan_actions)  # type: ignore[attr-defined]


def burst_then_four_bound() -> tuple[dict[str, Seen], list[dict[str, object]]]:
    """Eight sharers were pending with one empty shadow out; four of them are now bound elsewhere."""
    first = plan_shadows(snap([shadow("s0"), *(sharer(f"p{i}") for i in range(8))]), CFG, NOW, {})
    assert creates(first.actions) == 1  # 8 asked, 4 free
    return dict(first.placing), [shadow("s0"), shadow("s1"), *(sharer(f"p{i}") for i in range(4, 8))]


def test_a_sharer_bound_out_of_sight_still_takes_its_slot() -> None:
    placing, pods = burst_then_four_bound()
    # s0's four slots went to p0..p3, whose node has not written s0's users record yet: without
    # the memory, s0 looks empty and p4..p7 would be sent to it, with s1 idle beside it.
    plan = plan_shadows(snap(pods), CFG, NOW + 1, {}, placing)
    assert creates(plan.actions) == 0
    demand = {d.key: d for d in plan.demand}[KEY4]
    assert (demand.free_slots, demand.pending) == (4, 4)  # s1's four, for p4..p7
    assert placing_slots(plan.placing) == {KEY4: 4}
    # Forgetting it: s0 counts as free, so when a ninth sharer comes, no shadow is made for it.
    pods_9 = [*pods, sharer("p8")]
    assert creates(plan_shadows(snap(pods_9), CFG, NOW + 1, {}).actions) == 0
    assert creates(plan_shadows(snap(pods_9), CFG, NOW + 1, {}, placing).actions) == 1


def test_the_users_record_takes_over_from_the_memory() -> None:
    placing, pods = burst_then_four_bound()
    users = {f"default/p{i}/app": [f"gpushare-system/s0-{i}"] for i in range(4)}
    recorded = [shadow("s0", users=users), *pods[1:]]
    plan = plan_shadows(snap(recorded), CFG, NOW + 1, {}, placing)
    assert placing_slots(plan.placing) == {}  # counted once, by the record
    assert {d.key: d for d in plan.demand}[KEY4].free_slots == 4


def test_an_unrecorded_sharer_is_forgotten_after_the_ttl() -> None:
    placing, pods = burst_then_four_bound()
    held = plan_shadows(snap(pods), CFG, NOW + 1, {}, placing).placing
    assert placing_slots(plan_shadows(snap(pods), CFG, NOW + PLACING_TTL_S, {}, held).placing) == {KEY4: 4}
    later = plan_shadows(snap(pods), CFG, NOW + 1 + PLACING_TTL_S, {}, held)
    assert placing_slots(later.placing) == {}  # deleted while pending looks the same; it stops costing
    assert {d.key: d for d in later.demand}[KEY4].free_slots == 8


def test_pending_visible_and_terminating_sharers_are_not_on_their_way() -> None:
    previous = {f"default/p{i}": Seen(KEY4, 1) for i in range(4)}
    pods = [
        sharer("p0"),  # still pending
        sharer("p1", node=NODE, phase="Running"),  # bound on the leader's own node: counted there
        sharer("p2", deleting=True),  # being deleted before it was placed
    ]
    facts = snap(pods, CFG)
    out = track_placing(previous, facts.sharers, (), NOW)
    assert out == {"default/p0": Seen(KEY4, 1), "default/p3": Seen(KEY4, 1, NOW)}
    assert placing_slots(out) == {KEY4: 1}
    # The time it left is kept, not renewed, on later passes.
    assert track_placing(out, facts.sharers, (), NOW + 5)["default/p3"] == Seen(KEY4, 1, NOW)


def test_slots_count_the_quantity_per_key() -> None:
    key2 = ShareKey(Pool("nvidia.com/gpu"), keys.KIND_SHARE, 2)
    placing = {"a/x": Seen(KEY4, 3, NOW), "a/y": Seen(KEY4, 1, NOW), "a/z": Seen(key2, 2, NOW), "a/w": Seen(key2, 1)}
    assert placing_slots(placing) == {KEY4: 4, key2: 2}
