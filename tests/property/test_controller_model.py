"""Properties of the controller's pod model and solvers (hypothesis): any pod-shaped garbage is skipped
with a problem naming it, never a crash; the decisions are deterministic and the demand rule exact."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.core.actions import CreateShadow
from controller.core.mapping import MappingCache
from controller.core.model import PodResourcesEntry, Pool, ShareKey, build_snapshot, encode_owner_annotation
from controller.core.pod_facts import PodRef, parse_pod
from controller.errors import InvalidObject
from controller.share.cluster_view import plan_waiting_events
from controller.share.placing import Seen
from controller.share.solver import plan_node_shares, plan_shadows, shadow_is_gone, shadow_name
from gpushare import keys
from gpushare.config import Config
from tests.property import controller_reference as reference
from tests.unit.controller.podmaker import shadow, sharer

CFG = Config(node_name="n1")
json_leaf = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.text(max_size=6), st.sampled_from(["1", "0.5", "x"])
)
json_any = st.recursive(
    json_leaf, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3), max_leaves=12
)
resource = st.sampled_from(
    ["gpushare/share-gpu-4", "gpushare/share-dev-gpu-2", "gpushare/spot-gpu", "nvidia.com/gpu", "cpu"]
)


@st.composite
def pod_like(draw: st.DrawFn) -> Any:
    """Mostly well-formed pods with any field replaced by garbage now and then."""

    def maybe(value: Any) -> Any:
        return draw(st.one_of(st.just(value), json_any)) if draw(st.integers(0, 9)) == 0 else value

    requests = {draw(resource): maybe(str(draw(st.integers(0, 3)))) for _ in range(draw(st.integers(0, 2)))}
    labels = draw(
        st.sampled_from(
            [None, {keys.LABEL_ROLE: keys.ROLE_SHADOW, keys.LABEL_SHARE_SPEC: "4", keys.LABEL_SHARE_KIND: "share"}]
        )
    )
    return maybe(
        {
            "metadata": maybe(
                {
                    "name": draw(st.sampled_from(["a", "b", "c"])),
                    "namespace": draw(st.sampled_from(["t", keys.DEFAULT_NAMESPACE])),
                    "uid": maybe(draw(st.sampled_from(["u1", "u2"]))),
                    "labels": maybe(labels),
                    "annotations": maybe({keys.ANNOTATION_SHADOW_USERS: draw(st.text(max_size=20))}),
                }
            ),
            "spec": maybe(
                {
                    "nodeName": maybe(draw(st.sampled_from([None, "n1", "n2"]))),
                    "containers": maybe(
                        [maybe({"name": maybe("app"), "resources": maybe({"requests": maybe(requests)})})]
                    ),
                    "nodeSelector": maybe(None),
                }
            ),
            "status": maybe({"phase": maybe(draw(st.sampled_from(["Pending", "Running", "Failed"])))}),
        }
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(pod_like(), max_size=6))
def test_any_pod_shaped_input_is_classified_or_listed_as_a_problem(pods: list[Any]) -> None:
    snap = build_snapshot(pods, CFG, shadow_list_fresh=True)
    assert all(p.startswith("gpushare: ") for p in snap.problems)
    assert len(snap.pods) + len(snap.problems) <= len(pods)
    # Whatever was accepted, the solvers decide without raising, and deterministically.
    rows = [PodResourcesEntry("t", "a", "app", "gpushare/share-gpu-4", ("gpushare-system/a-0",))]
    mapping = MappingCache.rebuild(rows, snap.pods, CFG.real_resources)
    first = plan_shadows(snap, CFG, 100.0, {})
    assert plan_shadows(snap, CFG, 100.0, {}) == first
    assert plan_node_shares(snap, mapping, CFG) == plan_node_shares(snap, mapping, CFG)


@given(st.integers(0, 40), st.sampled_from([2, 3, 4, 5]), st.lists(st.integers(0, 5), max_size=4), st.integers(0, 2))
def test_after_creating_the_plan_free_slots_cover_demand_and_warm_pool(
    pending: int, n: int, used: list[int], warm: int
) -> None:
    cfg = Config(node_name="n1", warm_shadows=warm, share_specs=(n,), dev_share_specs=(2,))
    res = keys.share_resource(keys.KIND_SHARE, n)
    used = [min(u, n) for u in used]
    pods: list[dict[str, Any]] = []
    for i in range(pending):
        pods.append(
            {
                "metadata": {"name": f"p{i}", "namespace": "t", "uid": f"p{i}"},
                "spec": {"containers": [{"name": "c", "resources": {"requests": {res: "1"}}}]},
                "status": {"phase": "Pending"},
            }
        )
    for j, u in enumerate(used):
        users = {f"t/x{j}-{k}/c": [f"{keys.DEFAULT_NAMESPACE}/s{j}-{k}"] for k in range(u)}
        pods.append(
            {
                "metadata": {
                    "name": f"s{j}",
                    "namespace": keys.DEFAULT_NAMESPACE,
                    "uid": f"s{j}",
                    "labels": {
                        keys.LABEL_ROLE: keys.ROLE_SHADOW,
                        keys.LABEL_SHARE_SPEC: str(n),
                        keys.LABEL_SHARE_KIND: "share",
                    },
                    "annotations": {keys.ANNOTATION_SHADOW_USERS: json.dumps(users)} if users else {},
                },
                "spec": {
                    "nodeName": "n1",
                    "containers": [{"name": "main", "resources": {"requests": {"nvidia.com/gpu": "1"}}}],
                },
                "status": {"phase": "Running"},
            }
        )
    plan = plan_shadows(build_snapshot(pods, cfg), cfg, 0.0, {})
    created = sum(1 for a in plan.actions if isinstance(a, CreateShadow) and a.key.spec == n and a.key.kind == "share")
    free = sum(n - u for u in used)
    target = pending + warm * n
    assert free + created * n >= target  # enough
    assert created == 0 or free + (created - 1) * n < target  # and not one shadow more


# --- the indexed leader code answers exactly what the straightforward references do ----------------------

SPEC_CHOICES = [(keys.KIND_SHARE, 2), (keys.KIND_SHARE, 3), (keys.KIND_SHARE, 4), (keys.KIND_SHARE_DEV, 2)]
POOL_CHOICES = [("nvidia.com/gpu", None), ("nvidia.com/gpu", {"zone": "a"}), ("amd.com/gpu", None)]
CHOICES = (SPEC_CHOICES, POOL_CHOICES)


# A shadow in service, marked draining, answered by its node, answered for an older mark, or an answer alone.
_MARK, _ANSWER = keys.ANNOTATION_SHADOW_DRAINING, keys.ANNOTATION_SHADOW_DRAINED
DRAIN_STATES = [None, {_MARK: "7.000"}, {_MARK: "7.000", _ANSWER: "7.000"}, {_MARK: "7.000", _ANSWER: "3.000"}]
DRAIN_STATES.append({_ANSWER: "7.000"})


@st.composite
def small_cluster(draw: st.DrawFn) -> tuple[list[dict[str, Any]], dict[str, str], Config]:
    """Shadows and sharers on two nodes whose records, owners, names and states overlap on purpose."""
    pods: list[dict[str, Any]] = []
    unschedulable: dict[str, str] = {}
    names: list[str] = []
    camel = draw(st.booleans())  # the API's camelCase, or the client's to_dict() snake_case
    drawn: list[tuple[tuple[str, int], tuple[str, dict[str, str] | None]]] = []
    for i in range(draw(st.integers(0, 8))):
        kind, n = draw(st.sampled_from(SPEC_CHOICES))
        resource, selector = draw(st.sampled_from(POOL_CHOICES))
        drawn.append(((kind, n), (resource, selector)))
        key = ShareKey(Pool(resource, tuple(sorted((selector or {}).items()))), kind, n)
        name = shadow_name(key, draw(st.integers(0, 3)))  # namesakes with another uid happen
        names.append(name)
        node = draw(st.sampled_from(["n1", "n2", ""]))
        users = {
            f"t/s{j}/app": [f"{keys.DEFAULT_NAMESPACE}/{name}-{v}" for v in range(draw(st.integers(1, 2)))]
            for j in draw(st.sets(st.integers(0, 5), max_size=3))
        }
        pods.append(
            shadow(
                name, n, kind=kind, node=node, resource=resource, users=users or None, selector=selector,
                uid=f"{name}-{i}", phase=draw(st.sampled_from(["Running", "Pending", "Failed"])) if node else "Pending",
                deleting=draw(st.booleans()), camel=camel, annotations=draw(st.sampled_from(DRAIN_STATES)),
            )
        )  # fmt: skip
        if draw(st.booleans()):
            unschedulable[f"{keys.DEFAULT_NAMESPACE}/{name}"] = draw(st.sampled_from(["no GPU", "0/2 nodes"]))
    for j in range(draw(st.integers(0, 6))):
        # Often a shadow's key: a sharer pending for a key with idle or draining shadows is where
        # the drain rules and the demand rule meet.
        (kind, n), (resource, selector) = draw(
            st.sampled_from(drawn) if drawn and draw(st.booleans()) else st.tuples(*map(st.sampled_from, CHOICES))
        )
        owners = {f"{keys.DEFAULT_NAMESPACE}/{x}": "u" for x in draw(st.sets(st.sampled_from([*names, "x-9"])))}
        annotations = {keys.ANNOTATION_POOL_RESOURCE: resource} if resource != "nvidia.com/gpu" else {}
        if owners:
            annotations[keys.ANNOTATION_SHADOW_OWNER] = encode_owner_annotation(owners)
        node = draw(st.sampled_from(["n1", "n2", ""]))
        pods.append(
            sharer(
                f"s{j}", n, kind=kind, qty=draw(st.integers(1, 2)), ns="t", node=node, selector=selector,
                annotations=annotations or None, gated=draw(st.booleans()) and not node,
                phase=draw(st.sampled_from(["Pending", "Running", "Succeeded"])) if node else "Pending", camel=camel,
            )
        )  # fmt: skip
    cfg = Config(
        node_name="n1",
        share_specs=draw(st.sampled_from([(2, 4), (2,), (2, 3, 4)])),
        dev_share_specs=(2,),
        real_resources=draw(st.sampled_from([("nvidia.com/gpu",), ("nvidia.com/gpu", "amd.com/gpu")])),
        warm_shadows=draw(st.integers(0, 2)),
        shadow_idle_timeout_s=50.0,
    )
    return pods, unschedulable, cfg


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_cluster(), st.data())
def test_leader_plan_matches_the_straightforward_reference(
    cluster: tuple[list[dict[str, Any]], dict[str, str], Config], data: st.DataObject
) -> None:
    pods, unschedulable, cfg = cluster
    snap = build_snapshot(pods, cfg, shadow_list_fresh=data.draw(st.booleans()))
    assert not snap.problems
    started = st.sampled_from([0.0, 60.0, 99.0])
    timers = {s.ref.uid: data.draw(started) for s in snap.shadows if data.draw(st.booleans())}
    pending = sorted(p.ref.key for p in snap.sharers if p.is_pending)
    unplaceable = data.draw(st.sets(st.sampled_from(pending))) if pending else set()
    blocked = data.draw(st.sets(st.sampled_from(sorted(unplaceable)))) if unplaceable else set()
    plan = plan_shadows(snap, cfg, 100.0, timers, unplaceable=unplaceable, blocked=blocked)
    # With no sharer seen before, the memory of sharers on their way is just the pending ones
    # (controller/share/placing.py; its rule is unit-tested in tests/unit/controller/share/test_placing.py).
    assert plan.placing == {p.ref.key: Seen(p.key, p.quantity, since=100.0) for p in snap.sharers if p.is_pending}
    expected = reference.plan_shadows(snap, cfg, 100.0, timers, unplaceable=unplaceable, blocked=blocked)
    assert dataclasses.replace(plan, placing={}) == expected
    assert plan_waiting_events(snap, unschedulable) == reference.plan_waiting_events(snap, unschedulable)


@settings(max_examples=200, deadline=None)
@given(small_cluster(), st.data())
def test_shadow_is_gone_matches_the_straightforward_reference(
    cluster: tuple[list[dict[str, Any]], dict[str, str], Config], data: st.DataObject
) -> None:
    pods, _, cfg = cluster
    refs = [PodRef(keys.DEFAULT_NAMESPACE, p["metadata"]["name"], p["metadata"]["uid"]) for p in pods]
    deleted = data.draw(st.sets(st.sampled_from(refs))) if refs else set()
    snap = build_snapshot(pods, cfg, shadow_list_fresh=data.draw(st.booleans()), deleted_shadows=deleted)
    for ref in [*refs, PodRef(keys.DEFAULT_NAMESPACE, "gone", "g")]:
        for uid in (None, ref.uid, "other"):
            assert shadow_is_gone(snap, ref.key, uid) == reference.shadow_is_gone(snap, ref.key, uid)


@st.composite
def both_spellings(draw: st.DrawFn) -> dict[str, Any]:
    """Pods whose fields come under either spelling, or both, with values that are falsy or wrong."""
    small = st.one_of(st.none(), st.just(""), st.just(0), st.sampled_from(["n1", "x", "1"]), json_leaf)
    quantity = st.one_of(st.sampled_from(["1", "2", " 3 ", "0", "-1", "1.5", "²", "٣"]), st.integers(-1, 3), json_leaf)
    resources = st.dictionaries(resource | st.just("example.com/gpu"), quantity, max_size=3)

    def spelled(snake: str, camel: str, value: st.SearchStrategy[Any]) -> dict[str, Any]:
        out = {}
        for name in draw(st.sampled_from([(), (snake,), (camel,), (snake, camel)])):
            out[name] = draw(value)
        return out

    def container() -> dict[str, Any]:
        res = {
            f: draw(resources) for f in draw(st.sampled_from([(), ("requests",), ("limits",), ("requests", "limits")]))
        }
        return {"name": draw(st.sampled_from(["app", "side", "app", "side", ""])), "resources": res}

    def status() -> dict[str, Any]:
        st_ = {"name": draw(st.sampled_from(["app", "side", 3]))}
        st_ |= spelled("container_id", "containerID", st.one_of(small, st.just("containerd://abc")))
        st_["state"] = draw(st.sampled_from([{}, {"running": {}}, {"running": None}, {"waiting": {}}, "x"]))
        return st_

    return {
        "metadata": {
            "name": "p",
            "namespace": draw(st.sampled_from(["t", keys.DEFAULT_NAMESPACE])),
            "uid": "u",
            **spelled("deletion_timestamp", "deletionTimestamp", small),
        },
        "spec": {
            **spelled("node_name", "nodeName", small),
            **spelled("node_selector", "nodeSelector", st.sampled_from([None, {}, {"zone": "a"}, {"z": 1}])),
            **spelled("scheduling_gates", "schedulingGates", st.sampled_from([None, [], [{"name": "g"}]])),
            "containers": [container() for _ in range(draw(st.integers(0, 2)))],
            **spelled("init_containers", "initContainers", st.just([container()])),
        },
        "status": {
            "phase": draw(st.sampled_from([None, "", "Running", "Pending", "Running", "Pending", 1])),
            **spelled("container_statuses", "containerStatuses", st.just([status() for _ in range(2)])),
            **spelled("init_container_statuses", "initContainerStatuses", st.just([status()])),
        },
    }


def _read(reader: Any, raw: Any) -> object:
    try:
        return reader(raw)
    except InvalidObject as exc:
        return f"refused: {exc}"


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(pod_like(), both_spellings(), small_cluster().map(lambda c: c[0])))
def test_pod_reading_matches_the_straightforward_reference(raw: Any) -> None:
    for pod in raw if isinstance(raw, list) else [raw]:
        assert _read(parse_pod, pod) == _read(reference.parse_pod, pod)
