from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest

from controller.core.actions import (
    REASON_SHADOW_DEMAND,
    REASON_SHADOW_GONE,
    REASON_WARM_POOL,
    AnnotatePod,
    CreateShadow,
    DeleteShadow,
    Evict,
    RecordEvent,
    SetDevices,
)
from controller.core.mapping import MappingCache
from controller.core.model import Pool, ShareKey
from controller.core.pod_facts import PodRef
from controller.share.served import REASON_UNKNOWN_POOL, REASON_UNKNOWN_SPEC
from controller.share.shadow_drain import DRAIN_HOLD_MAX_S
from controller.share.solver import (
    build_shadow_manifest,
    plan_node_shares,
    plan_shadows,
    shadow_is_gone,
    shadow_name,
)
from gpushare import keys
from gpushare.config import Config
from tests.unit.controller.podmaker import NODE, row, shadow, sharer, snap

NOW = 10_000.0
CFG = Config(node_name=NODE)
KEY4 = ShareKey(Pool("nvidia.com/gpu"), keys.KIND_SHARE, 4)


def creates(actions: Any) -> list[CreateShadow]:
    return [a for a in actions if isinstance(a, CreateShadow)]


def deletes(actions: Any) -> list[str]:
    """Shadows whose removal starts (marked draining) or ends (deleted) in this pass."""
    return [
        a.ref.name
        for a in actions
        if isinstance(a, DeleteShadow)
        or (isinstance(a, AnnotatePod) and a.key == keys.ANNOTATION_SHADOW_DRAINING and a.value is not None)
    ]


def used_users(n: int, shadow_name_: str) -> dict[str, list[str]]:
    return {f"default/u{i}/app": [f"gpushare-system/{shadow_name_}-{i}"] for i in range(n)}


# --- demand: shortage = pending + warm*N - free; create ceil(shortage / N) ----------------------------------


@pytest.mark.parametrize(
    ("pending", "spec", "existing_used", "warm", "want"),
    [
        (0, 4, [], 0, 0),
        (1, 4, [], 0, 1),
        (4, 4, [], 0, 1),
        (5, 4, [], 0, 2),
        (8, 4, [], 0, 2),  # the demo: 8 share-gpu-4 pods -> exactly 2 shadows
        (9, 4, [], 0, 3),  # a ninth pod asks for a third
        (1, 4, [3], 0, 0),  # one free slot left on a shadow with 3 users
        (2, 4, [3], 0, 1),
        (5, 4, [0], 0, 1),  # an empty shadow covers 4 of the 5
        (3, 2, [], 0, 2),
        (7, 3, [1], 0, 2),  # free 2, shortage 5, ceil(5/3) = 2
        (0, 4, [], 1, 1),  # the warm pool alone
        (0, 4, [0], 1, 0),  # the warm pool is already there
        (0, 4, [2], 2, 2),  # warm 2x4 slots, free 2: shortage 6 -> 2
        (4, 4, [0], 1, 1),  # pending fill the empty one; warm asks one more
    ],
)
def test_demand_is_exact_ceil(pending: int, spec: int, existing_used: list[int], warm: int, want: int) -> None:
    cfg = Config(node_name=NODE, warm_shadows=warm)
    pods = [sharer(f"p{i}", spec) for i in range(pending)]
    for j, n_used in enumerate(existing_used):
        pods.append(shadow(f"s{j}", spec, users=used_users(n_used, f"s{j}") if n_used else None))
    plan = plan_shadows(snap(pods, cfg), cfg, NOW, {})
    made = [c for c in creates(plan.actions) if c.key.spec == spec and c.key.kind == keys.KIND_SHARE]
    assert len(made) == want
    if made:
        reason = REASON_SHADOW_DEMAND if pending > sum(spec - u for u in existing_used) else REASON_WARM_POOL
        assert {c.reason for c in made} == {reason}


def test_a_pending_sharer_a_users_record_names_is_bound_already_and_asks_for_nothing() -> None:
    """The pending watch and the shadows' watch keep no order between them: a sharer can show
    pending after its node recorded it on a shadow. Its slot is in the record; counted as asked
    too, it would make one shadow too many."""
    full = shadow("s0", users=used_users(4, "s0"))
    assert creates(plan_shadows(snap([full, sharer("u3")]), CFG, NOW, {}).actions) == []
    made = creates(plan_shadows(snap([full, sharer("u3"), sharer("other")]), CFG, NOW, {}).actions)
    assert len(made) == 1  # a sharer no record names still asks


def test_warm_pool_covers_every_configured_spec_of_the_default_pool() -> None:
    cfg = Config(node_name=NODE, warm_shadows=1, share_specs=(2, 4), dev_share_specs=(8,))
    made = creates(plan_shadows(snap([], cfg), cfg, NOW, {}).actions)
    assert sorted((c.key.kind, c.key.spec, str(c.key.pool)) for c in made) == [
        ("share", 2, "nvidia.com/gpu"),
        ("share", 4, "nvidia.com/gpu"),
        ("share-dev", 8, "nvidia.com/gpu"),
    ]
    assert plan_shadows(snap([]), CFG, NOW, {}).actions == ()  # warmShadows 0: nothing at rest


def test_a_sharer_no_shadow_would_get_placed_asks_for_none_and_holds_no_drain() -> None:
    # The scheduler refused it for its nodeSelector: a shadow holding a whole GPU would never be used.
    plan = plan_shadows(snap([sharer("lost")]), CFG, NOW, {}, unplaceable={"default/lost"}, blocked={"default/lost"})
    assert creates(plan.actions) == []
    assert creates(plan_shadows(snap([sharer("lost")]), CFG, NOW, {}).actions) != []


def test_quantity_counts_slots_not_pods() -> None:
    plan = plan_shadows(snap([sharer("big", 4, qty=3), sharer("small", 4, qty=2)]), CFG, NOW, {})
    assert len(creates(plan.actions)) == 2  # 5 slots of N=4


def test_two_kinds_and_several_n_are_separate_keys() -> None:
    pods = [sharer(f"a{i}", 2) for i in range(3)]  # share-gpu-2: 2 shadows
    pods += [sharer(f"b{i}", 4) for i in range(3)]  # share-gpu-4: 1 shadow
    pods += [sharer(f"c{i}", 8, kind=keys.KIND_SHARE_DEV) for i in range(9)]  # share-dev-gpu-8: 2 shadows
    pods += [sharer(f"d{i}", 2, kind=keys.KIND_SHARE_DEV) for i in range(1)]  # share-dev-gpu-2: 1 shadow
    made = creates(plan_shadows(snap(pods), CFG, NOW, {}).actions)
    counts: dict[tuple[str, int], int] = {}
    for c in made:
        counts[(c.key.kind, c.key.spec)] = counts.get((c.key.kind, c.key.spec), 0) + 1
    assert counts == {("share", 2): 2, ("share", 4): 1, ("share-dev", 8): 2, ("share-dev", 2): 1}
    assert len({c.name for c in made}) == len(made)


def test_pools_do_not_lend_slots_to_each_other() -> None:
    cfg = Config(node_name=NODE, real_resources=("nvidia.com/gpu", "amd.com/gpu"))
    amd = {keys.ANNOTATION_POOL_RESOURCE: "amd.com/gpu"}
    pods = [shadow("nv", 4), sharer("a", 4, annotations=amd), sharer("z", 4, selector={"zone": "z"})]
    made = creates(plan_shadows(snap(pods, cfg), cfg, NOW, {}).actions)
    assert sorted(str(c.key.pool) for c in made) == ["amd.com/gpu", "nvidia.com/gpu{zone=z}"]
    by_pool = {str(c.key.pool): c.manifest for c in made}
    assert by_pool["nvidia.com/gpu{zone=z}"]["spec"]["nodeSelector"] == {"zone": "z"}
    assert by_pool["amd.com/gpu"]["spec"]["containers"][0]["resources"]["limits"] == {"amd.com/gpu": "1"}


def test_shadows_being_deleted_or_finished_supply_nothing() -> None:
    pods = [shadow("gone", deleting=True), shadow("done", phase="Failed"), sharer("p")]
    assert len(creates(plan_shadows(snap(pods), CFG, NOW, {}).actions)) == 1


def test_pending_shadow_counts_as_supply_so_a_stuck_one_is_not_multiplied() -> None:
    pods = [shadow("stuck", phase="Pending", node=""), *(sharer(f"p{i}") for i in range(4))]
    assert creates(plan_shadows(snap(pods), CFG, NOW, {}).actions) == []


@pytest.mark.parametrize(
    ("pods", "why"),
    [
        ([sharer("p", 7)], REASON_UNKNOWN_SPEC),  # share-gpu-7 is not in shareSpecs
        ([sharer("p", 4, annotations={keys.ANNOTATION_POOL_RESOURCE: "acme.com/gpu"})], REASON_UNKNOWN_POOL),
    ],
)
def test_unserved_spec_or_pool_gets_a_warning_not_a_shadow(pods: list[dict[str, Any]], why: str) -> None:
    plan = plan_shadows(snap(pods), CFG, NOW, {})
    assert creates(plan.actions) == []
    (event,) = plan.actions
    assert isinstance(event, RecordEvent) and event.reason == why and event.type == "Warning"
    assert event.message.startswith("gpushare: ")


def test_shadows_of_a_spec_no_longer_served_still_idle_out() -> None:
    cfg = Config(node_name=NODE, share_specs=(2,), warm_shadows=1)
    pods = [shadow("old", 4), shadow("old-used", 4, users=used_users(1, "old-used"))]
    since = {"uid-gpushare-system-old": NOW - 5000, "uid-gpushare-system-old-used": NOW - 5000}
    plan = plan_shadows(snap(pods, cfg), cfg, NOW, since)
    assert deletes(plan.actions) == ["old"]  # the warm pool does not apply to an unserved spec
    assert [c for c in creates(plan.actions) if c.key.kind == keys.KIND_SHARE and c.key.spec == 4] == []


# --- names and the manifest ----------------------------------------------------------------------------------


def test_names_are_deterministic_unique_and_skip_taken_or_still_referenced() -> None:
    name0, name1, name2 = (shadow_name(KEY4, i) for i in range(3))
    assert re.fullmatch(r"shadow-share-4-[0-9a-f]{8}-0", name0)
    assert shadow_name(KEY4, 0) == name0  # deterministic
    assert shadow_name(ShareKey(Pool("amd.com/gpu"), "share", 4), 0) != name0
    # ordinal 0 is a live shadow (full); ordinal 1 is gone but a sharer's owner record still names it.
    owner = {keys.ANNOTATION_SHADOW_OWNER: f'{{"gpushare-system/{name1}":"old-uid"}}'}
    pods = [
        shadow(name0, users=used_users(4, name0)),
        sharer("bound", node="node-b", phase="Running", annotations=owner),
        sharer("p1"),
        sharer("p2", qty=4),
    ]
    made = creates(plan_shadows(snap(pods), CFG, NOW, {}).actions)
    assert [c.name for c in made] == [name2, shadow_name(KEY4, 3)]


def test_an_owner_record_with_an_odd_ordinal_is_no_ordinal_and_stops_nothing() -> None:
    # Owner records are annotations a tenant can write; "²" is a digit that int() refuses.
    odd = shadow_name(KEY4, 0)[:-1] + "²"
    owner = {keys.ANNOTATION_SHADOW_OWNER: f'{{"gpushare-system/{odd}":"u"}}'}
    pods = [sharer("bound", node="node-b", phase="Running", annotations=owner), sharer("p1")]
    made = creates(plan_shadows(snap(pods), CFG, NOW, {}).actions)
    assert [c.name for c in made] == [shadow_name(KEY4, 0)]


def test_shadow_manifest_follows_design_section_3() -> None:
    cfg = Config(node_name=NODE, shadow_priority_class="gs-high", shadow_image="pause:test")
    key = ShareKey(Pool("nvidia.com/gpu", (("gpu", "a100"),)), keys.KIND_SHARE_DEV, 8)
    m = build_shadow_manifest(key, "shadow-x-0", cfg)
    assert m["metadata"]["namespace"] == "gpushare-system" and m["metadata"]["name"] == "shadow-x-0"
    assert m["metadata"]["labels"] == {
        "gpushare.k8s.io/role": "shadow",
        "gpushare.k8s.io/share-spec": "8",
        "gpushare.k8s.io/share-kind": "share-dev",
    }
    spec = m["spec"]
    assert spec["priorityClassName"] == "gs-high" and spec["nodeSelector"] == {"gpu": "a100"}
    (main,) = spec["containers"]
    assert main["name"] == "main" and main["image"] == "pause:test"
    assert main["resources"] == {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}
    # The manifest reads back as a shadow of the same key (the model and the builder agree).
    m["metadata"]["uid"] = "u"
    assert snap([m], cfg).shadows[0].key == key


# --- idle shadows, warm pool, restart ---------------------------------------------------------------------------


def test_empty_shadow_first_seen_only_starts_its_clock() -> None:
    s = snap([shadow("s")])
    uid = s.shadows[0].ref.uid
    first = plan_shadows(s, CFG, NOW, {})  # e.g. right after a restart: no stored clock
    assert deletes(first.actions) == [] and first.empty_since == {uid: NOW}
    early = plan_shadows(s, CFG, NOW + 599, first.empty_since)
    assert deletes(early.actions) == [] and early.empty_since == {uid: NOW}
    late = plan_shadows(s, CFG, NOW + 600, early.empty_since)
    assert deletes(late.actions) == ["s"]


def test_a_user_resets_the_clock() -> None:
    busy = snap([shadow("s", users=used_users(1, "s"))])
    assert plan_shadows(busy, CFG, NOW, {"uid-gpushare-system-s": NOW - 9999}).empty_since == {}


@pytest.mark.parametrize(
    ("warm", "idle_names", "pending", "want_deleted"),
    [
        (0, ["a", "b"], 0, ["a", "b"]),
        (1, ["a", "b"], 0, ["a"]),  # the longest-idle goes, one stays warm
        (2, ["a", "b"], 0, []),
        (0, ["a", "b"], 3, ["a"]),  # a pending sharer keeps one (it will schedule there)
    ],
)
def test_idle_deletion_beyond_the_warm_pool(
    warm: int, idle_names: list[str], pending: int, want_deleted: list[str]
) -> None:
    cfg = Config(node_name=NODE, warm_shadows=warm)
    pods = [shadow(n) for n in idle_names] + [sharer(f"p{i}") for i in range(pending)]
    since = {f"uid-gpushare-system-{n}": NOW - 1000 - i for i, n in enumerate(reversed(idle_names))}
    # The pending sharers are ones the scheduler cannot place (below: ones it may be binding).
    refused = {f"default/p{i}" for i in range(pending)}
    plan = plan_shadows(snap(pods, cfg), cfg, NOW, since, unplaceable=refused)
    assert deletes(plan.actions) == want_deleted
    # Deleting never triggers a create of the same key in the same pass.
    assert [c for c in creates(plan.actions) if c.key == KEY4] == []


def test_no_idle_shadow_starts_draining_while_a_sharer_of_its_kind_waits_for_the_scheduler() -> None:
    """One spare shadow, but p is pending with no word from the scheduler: it may be placed on
    either shadow already, its binding queued behind the scheduler's QPS. Once the scheduler
    says it cannot place p, p holds nothing up: a sharer that never fits keeps no GPU."""
    pods = [shadow("a"), shadow("b"), sharer("p")]
    since = {"uid-gpushare-system-a": NOW - 1001, "uid-gpushare-system-b": NOW - 1000}
    assert deletes(plan_shadows(snap(pods), CFG, NOW, since).actions) == []
    assert deletes(plan_shadows(snap(pods), CFG, NOW, since, unplaceable={"default/p"}).actions) == ["a"]
    other_kind = [shadow("a"), shadow("b"), sharer("p", spec=2)]  # waits for another key's shadows
    assert deletes(plan_shadows(snap(other_kind), CFG, NOW, since).actions) == ["a", "b"]


def test_a_sharer_the_scheduler_never_answers_holds_the_drains_for_a_bounded_time() -> None:
    """A tenant's sharer naming a scheduler that does not exist stays pending with no answer: it
    holds its key's drains only until DRAIN_HOLD_MAX_S after the leader first saw it pending."""
    pods = [shadow("a"), shadow("b"), sharer("p")]
    since = {"uid-gpushare-system-a": NOW - 1001, "uid-gpushare-system-b": NOW - 1000}
    first = plan_shadows(snap(pods), CFG, NOW, since)
    assert deletes(first.actions) == [] and first.placing["default/p"].since == NOW
    still = plan_shadows(snap(pods), CFG, NOW + DRAIN_HOLD_MAX_S - 1, since, first.placing)
    assert deletes(still.actions) == [] and still.placing["default/p"].since == NOW  # kept, not restarted
    later = plan_shadows(snap(pods), CFG, NOW + DRAIN_HOLD_MAX_S, since, still.placing)
    assert deletes(later.actions) == ["a"]


def test_bound_sharer_not_yet_recorded_keeps_its_shadow() -> None:
    # The node agent has not written the users record yet; the sharer is bound to the shadow's node.
    pods = [shadow("s", node="node-b"), sharer("fresh", node="node-b", phase="Running")]
    plan = plan_shadows(snap(pods), CFG, NOW, {"uid-gpushare-system-s": NOW - 5000})
    assert deletes(plan.actions) == [] and plan.empty_since == {}
    assert plan.demand[0].free_slots == 3


# --- node-local: device lists, cascade eviction, records ---------------------------------------------------------


def node_plan(pods: list[dict[str, Any]], rows: list[Any] = (), **kw: Any) -> list[Any]:  # type: ignore[assignment]
    s = snap(pods, **kw)
    return plan_node_shares(s, MappingCache.rebuild(rows, s.pods, CFG.real_resources), CFG)


def test_device_lists_cover_every_configured_resource_from_running_shadows_here() -> None:
    pods = [
        shadow("s4", 4),
        shadow("d2", 2, kind=keys.KIND_SHARE_DEV),
        shadow("elsewhere", 4, node="node-b"),
        shadow("starting", 4, phase="Pending"),
        shadow("leaving", 4, deleting=True),
    ]
    lists = {a.resource: a.ids for a in node_plan(pods) if isinstance(a, SetDevices)}
    assert set(lists) == {keys.share_resource("share", n) for n in CFG.share_specs} | {
        keys.share_resource("share-dev", n) for n in CFG.dev_share_specs
    }
    assert lists["gpushare/share-gpu-4"] == tuple(f"gpushare-system/s4-{i}" for i in range(4))
    assert lists["gpushare/share-dev-gpu-2"] == ("gpushare-system/d2-0", "gpushare-system/d2-1")
    assert lists["gpushare/share-gpu-2"] == ()


def test_a_shadow_whose_container_the_nri_plugin_holds_is_offered_before_kubelet_reports_it_running() -> None:
    pods = [shadow("starting", 4, phase="Pending"), shadow("leaving", 4, phase="Pending", deleting=True)]
    s = dataclasses.replace(
        snap(pods), shadows_created=frozenset({"gpushare-system/starting", "gpushare-system/leaving"})
    )
    lists = {
        a.resource: a.ids
        for a in plan_node_shares(s, MappingCache.rebuild([], s.pods, CFG.real_resources), CFG)
        if isinstance(a, SetDevices)
    }
    # A shadow being deleted serves nothing, whatever was seen of it.
    assert lists["gpushare/share-gpu-4"] == tuple(f"gpushare-system/starting-{i}" for i in range(4))


def test_a_shadow_kubelet_gave_its_gpu_is_not_offered_before_its_container_exists() -> None:
    # A sharer's container takes its GPU from the shadow's: the NRI plugin would refuse it, and
    # kubelet would retry only after a back-off.
    pods = [shadow("admitted", 4, phase="Pending")]
    rows = [row("gpushare-system/admitted", "main", "nvidia.com/gpu", "GPU-1")]
    lists = {a.resource: a.ids for a in node_plan(pods, rows) if isinstance(a, SetDevices)}
    assert lists["gpushare/share-gpu-4"] == ()


def test_a_sharer_of_an_unserved_pool_bound_here_gets_the_warning_from_its_node() -> None:
    """The scheduler places it on a free slot before the leader's pass sees it pending (it knows no
    pools), so only its node can tell it why its pool has no shadow."""
    stranger = sharer("x", node=NODE, phase="Pending", annotations={keys.ANNOTATION_POOL_RESOURCE: "acme.com/gpu"})
    served = sharer("ok", node=NODE, phase="Running")
    done = sharer("old", node=NODE, phase="Succeeded", annotations={keys.ANNOTATION_POOL_RESOURCE: "acme.com/gpu"})
    elsewhere = sharer("far", node="node-b", phase="Running", annotations={keys.ANNOTATION_POOL_RESOURCE: "a.com/gpu"})
    events = [a for a in node_plan([shadow("s"), stranger, served, done, elsewhere]) if isinstance(a, RecordEvent)]
    assert [(e.ref.name, e.reason, e.type) for e in events] == [("x", REASON_UNKNOWN_POOL, "Warning")]
    assert "'acme.com/gpu'" in events[0].message


HELD = [row("default/a", "app", "gpushare/share-gpu-4", "gpushare-system/s-0")]


def bound(name: str = "a", **kw: Any) -> dict[str, Any]:
    return sharer(name, node=NODE, phase="Running", **kw)


@pytest.mark.parametrize(
    ("pods", "kw", "evicted"),
    [
        ([shadow("s"), bound()], {}, False),  # alive
        ([bound()], {}, False),  # missing from a cache that may be stale: never evict
        ([bound()], {"shadow_list_fresh": True}, True),  # absent from a fresh full LIST
        ([bound()], {"deleted_shadows": [PodRef("gpushare-system", "s", "uid-gpushare-system-s")]}, True),
        ([shadow("s", deleting=True), bound()], {}, True),  # deleted by hand: terminating
        ([shadow("s", phase="Failed"), bound()], {}, True),
        # the owner record names another uid: the name was reused by a new shadow
        ([shadow("s"), bound(annotations={keys.ANNOTATION_SHADOW_OWNER: '{"gpushare-system/s":"old"}'})], {}, True),
        ([bound(deleting=True)], {"shadow_list_fresh": True}, False),  # already going
    ],
)
def test_cascade_eviction_only_when_the_api_says_the_shadow_is_gone(
    pods: list[dict[str, Any]], kw: dict[str, Any], evicted: bool
) -> None:
    evicts = [a for a in node_plan(pods, HELD, **kw) if isinstance(a, Evict)]
    assert bool(evicts) == evicted
    if evicted:
        (e,) = evicts
        assert e.ref == PodRef("default", "a", "uid-default-a") and e.reason == REASON_SHADOW_GONE
        assert "gpushare-system/s" in e.message


def test_every_sharer_of_a_vanished_shadow_is_evicted_once() -> None:
    rows = [
        row("default/a", "app", "gpushare/share-gpu-4", "gpushare-system/s-0"),
        row("default/a", "side", "gpushare/share-gpu-4", "gpushare-system/s-1"),
        row("default/b", "app", "gpushare/share-gpu-4", "gpushare-system/s-2"),
        row("default/c", "app", "gpushare/share-gpu-4", "gpushare-system/t-0"),
    ]
    pods = [shadow("t"), bound("a"), bound("b"), bound("c")]
    evicts = [
        a.ref.name
        for a in node_plan(pods, rows, deleted_shadows=[PodRef("gpushare-system", "s", "x")])
        if isinstance(a, Evict)
    ]
    assert evicts == ["a", "b"]


def test_shadow_is_gone_unknown_uid_uses_the_name() -> None:
    s = snap([], deleted_shadows=[PodRef("gpushare-system", "s", "whatever")])
    assert shadow_is_gone(s, "gpushare-system/s", None)
    assert not shadow_is_gone(s, "gpushare-system/t", None)


def test_records_are_written_once_then_steady() -> None:
    pods = [shadow("s"), bound("a")]
    records = [a for a in node_plan(pods, HELD) if isinstance(a, AnnotatePod)]
    assert {(r.ref.name, r.key) for r in records} == {
        ("s", keys.ANNOTATION_SHADOW_USERS),
        ("a", keys.ANNOTATION_SHADOW_OWNER),
    }
    # Apply them: the next pass writes nothing, and the leader now sees 1 used slot.
    written = {r.ref.name: {r.key: r.value} for r in records}
    pods2 = [shadow("s", annotations=None), bound("a", annotations=written["a"])]
    pods2[0]["metadata"]["annotations"] = written["s"]
    assert [a for a in node_plan(pods2, HELD) if isinstance(a, AnnotatePod)] == []
    assert snap(pods2).shadows[0].used_slots == 1


def test_restart_rebuild_evicts_nothing_and_advertises_the_same() -> None:
    pods = [shadow("s"), bound("a")]
    before = node_plan(pods, HELD)
    # A restarted agent: nothing remembered, a fresh full LIST, the same kubelet truth.
    after = node_plan(pods, HELD, shadow_list_fresh=True)
    assert [a for a in after if isinstance(a, Evict)] == []
    assert [a for a in before if isinstance(a, SetDevices)] == [a for a in after if isinstance(a, SetDevices)]


def test_a_shadow_whose_gpu_is_unhealthy_at_its_vendor_lists_its_slots_unhealthy_and_says_why() -> None:
    pods = [shadow("s4", 4), shadow("t4", 4)]
    rows = [
        row("gpushare-system/s4", "main", "nvidia.com/gpu", "GPU-3"),
        row("gpushare-system/t4", "main", "nvidia.com/gpu", "GPU-5"),
    ]
    s = dataclasses.replace(snap(pods), vendor_unhealthy={"GPU-3": "is Unhealthy at the nvidia.com/gpu device plugin"})
    actions = plan_node_shares(s, MappingCache.rebuild(rows, s.pods, CFG.real_resources), CFG)
    [listed] = [a for a in actions if isinstance(a, SetDevices) and a.resource == "gpushare/share-gpu-4"]
    # Still listed, so kubelet keeps the sharers running on it, but none is admitted on it anew.
    assert len(listed.ids) == 8
    assert listed.unhealthy == tuple(f"gpushare-system/s4-{i}" for i in range(4))
    [event] = [a for a in actions if isinstance(a, RecordEvent)]
    assert event.ref.key == "gpushare-system/s4" and event.reason == "GPUUnhealthy" and event.type == "Warning"
    assert "GPU GPU-3 (nvidia.com/gpu) is Unhealthy at the nvidia.com/gpu device plugin" in event.message


def test_healthy_gpus_list_every_slot_healthy() -> None:
    pods = [shadow("s4", 4)]
    rows = [row("gpushare-system/s4", "main", "nvidia.com/gpu", "GPU-3")]
    s = dataclasses.replace(snap(pods), vendor_unhealthy={"GPU-9": "is Unhealthy at the nvidia.com/gpu device plugin"})
    actions = plan_node_shares(s, MappingCache.rebuild(rows, s.pods, CFG.real_resources), CFG)
    assert all(a.unhealthy == () for a in actions if isinstance(a, SetDevices))
    assert not [a for a in actions if isinstance(a, RecordEvent)]
