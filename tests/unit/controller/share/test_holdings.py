"""Which shadow a sharer holds, by uid: bound by the agent, kept in its state file, never taken from the
tenant's own record. A forged or removed ``shadow-owner`` annotation may get the forger's pod evicted,
and nothing else."""

from __future__ import annotations

from typing import Any

from controller.core.actions import AnnotatePod, Evict
from controller.core.mapping import MappingCache
from controller.share.holdings import bind_holdings, decode_bindings, encode_bindings
from controller.share.solver import plan_node_shares
from gpushare import keys
from gpushare.config import Config
from tests.unit.controller.podmaker import NODE, row, shadow, sharer, snap

CFG = Config(node_name=NODE)
OLD = "uid-gpushare-system-s"  # the shadow "s" the sharers were allocated from
NEW = "uid-of-a-namesake"  # a later shadow that took the name "s"
ROWS = [
    row("default/a", "app", "gpushare/share-gpu-4", "gpushare-system/s-0"),
    row("default/b", "app", "gpushare/share-gpu-4", "gpushare-system/s-1"),
]


def bound(name: str, record: str | None = None) -> dict[str, Any]:
    annotations = {keys.ANNOTATION_SHADOW_OWNER: record} if record is not None else None
    return sharer(name, node=NODE, phase="Running", annotations=annotations)


def plan(pods: list[dict[str, Any]], bindings: dict[tuple[str, str], str] | None) -> list[Any]:
    s = snap(pods, shadow_list_fresh=True)
    mapping = MappingCache.rebuild(ROWS, s.pods, CFG.real_resources)
    return plan_node_shares(s, mapping, CFG, bindings=bindings)


def evicted(actions: list[Any]) -> list[str]:
    return sorted(a.ref.name for a in actions if isinstance(a, Evict))


def test_a_holding_is_bound_at_first_sight_and_the_binding_is_kept() -> None:
    s = snap([shadow("s"), bound("a"), bound("b")])
    mapping = MappingCache.rebuild(ROWS, s.pods, CFG.real_resources)
    first = bind_holdings(s, mapping, {})
    assert first == {("uid-default-a", "gpushare-system/s"): OLD, ("uid-default-b", "gpushare-system/s"): OLD}
    # Later, a namesake holds the name: the stored binding still names the shadow it came from.
    renamed = shadow("s", uid=NEW)
    s2 = snap([renamed, bound("a"), bound("b")])
    assert bind_holdings(s2, mapping, first) == first
    # A holding that ended drops its binding; one first seen with no shadow alive stays unbound.
    only_a = MappingCache.rebuild(ROWS[:1], s2.pods, CFG.real_resources)
    assert bind_holdings(s2, only_a, first) == {("uid-default-a", "gpushare-system/s"): OLD}
    assert bind_holdings(snap([bound("a")]), only_a, {}) == {}


def test_bindings_survive_the_state_file_and_keep_when_they_were_made() -> None:
    bindings = {("uid-a", "gpushare-system/s"): "uid-s", ("uid-b", "gpushare-system/t"): "uid-t"}
    timers = encode_bindings(bindings, {}, 100.0)
    assert timers == {"uid-a gpushare-system/s uid-s": 100.0, "uid-b gpushare-system/t uid-t": 100.0}
    assert decode_bindings(timers) == bindings
    assert encode_bindings(bindings, timers, 500.0) == timers  # unchanged: nothing to write
    assert decode_bindings({"one two": 1.0, "a b c d": 2.0, " b c": 3.0}) == {}


def test_a_replaced_shadow_evicts_its_sharers_whatever_their_records_say() -> None:
    """The tenant removes or rewrites its record to the namesake's uid: it still loses the old GPU."""
    stored = {("uid-default-a", "gpushare-system/s"): OLD, ("uid-default-b", "gpushare-system/s"): OLD}
    forged = '{"gpushare-system/s":"' + NEW + '"}'
    pods = [shadow("s", uid=NEW), bound("a", record=None), bound("b", record=forged)]
    assert evicted(plan(pods, stored)) == ["a", "b"]


def test_a_forged_uid_in_a_record_evicts_the_forger_and_nobody_else() -> None:
    honest = '{"gpushare-system/s":"' + OLD + '"}'
    pods = [shadow("s"), bound("a", record='{"gpushare-system/s":"made-up"}'), bound("b", record=honest)]
    assert evicted(plan(pods, None)) == ["a"]
    stored = {("uid-default-a", "gpushare-system/s"): OLD, ("uid-default-b", "gpushare-system/s"): OLD}
    assert evicted(plan(pods, stored)) == ["a"]


def test_a_damaged_record_changes_nothing_and_is_rewritten_from_the_binding() -> None:
    stored = {("uid-default-a", "gpushare-system/s"): OLD, ("uid-default-b", "gpushare-system/s"): OLD}
    pods = [shadow("s"), bound("a", record="[" * 100_000), bound("b", record="{}")]
    actions = plan(pods, stored)
    assert evicted(actions) == []
    writes = {
        a.ref.name: a.value for a in actions if isinstance(a, AnnotatePod) and a.key == keys.ANNOTATION_SHADOW_OWNER
    }
    assert writes == {"a": '{"gpushare-system/s":"' + OLD + '"}', "b": '{"gpushare-system/s":"' + OLD + '"}'}


def test_the_record_repeats_the_binding_not_what_the_tenant_wrote() -> None:
    # The shadow is on no node this agent sees; the old code kept whatever uid the record held.
    stored = {("uid-default-a", "gpushare-system/s"): OLD}
    s = snap([bound("a", record='{"gpushare-system/s":"tenant-uid"}')])
    mapping = MappingCache.rebuild(ROWS[:1], s.pods, CFG.real_resources)
    (write,) = mapping.record_updates([], s.sharers, stored)
    assert write.value == '{"gpushare-system/s":"' + OLD + '"}'
