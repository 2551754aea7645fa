"""Properties of the controller's pod model and solvers (hypothesis): any pod-shaped garbage is skipped
with a problem naming it, never a crash; the decisions are deterministic and the demand rule exact."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.core.actions import CreateShadow
from controller.core.mapping import MappingCache
from controller.core.model import PodResourcesEntry, build_snapshot
from controller.core.share_solver import plan_node_shares, plan_shadows
from gpushare import keys
from gpushare.config import Config

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
                    "namespace": draw(st.sampled_from(["t", keys.SHADOW_NAMESPACE])),
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
        users = {f"t/x{j}-{k}/c": [f"{keys.SHADOW_NAMESPACE}/s{j}-{k}"] for k in range(u)}
        pods.append(
            {
                "metadata": {
                    "name": f"s{j}",
                    "namespace": keys.SHADOW_NAMESPACE,
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
