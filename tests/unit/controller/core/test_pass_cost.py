"""The leader's pass does work in proportion to the pods it reads: 10x the cluster, about 10x the work.

Work is counted, not timed: every Python call, builtin call and generator step the pass makes
(``sys.setprofile``), which a per-pod scan inside a per-key or per-pod loop multiplies. Timing
would measure the machine too (caches, other processes); docs/scale.md has the times.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

import pytest

from controller.core.model import Pool, ShareKey, SnapshotMemo, encode_owner_annotation
from controller.share.cluster_pass import plan_cluster
from controller.share.solver import shadow_name
from gpushare import keys
from gpushare.config import Config
from tests.unit.controller.podmaker import pod, shadow, sharer

CFG = Config(node_name="node-0", share_specs=(2, 4), dev_share_specs=(2,))
LINEAR = 10.0
SLACK = 1.1  # fixed costs shrink relative to the pods, rounding of the cluster's parts grows


def _stuck(name: str, **kw: Any) -> dict[str, Any]:
    """A shadow the scheduler cannot place."""
    p = shadow(name, 4, node="", phase="Pending", **kw)
    p["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "message": "0/9 nodes: no GPU"}]
    return p


def cluster(zones: int) -> list[dict[str, Any]]:
    """Per zone, a pool of its own (by node selector) with shadows in use, one stuck unschedulable,
    bound sharers with owner records and more pending sharers than fit: every zone's key creates.
    Across zones, the default pool: one stuck shadow and two sharers waiting on it per zone."""
    pods: list[dict[str, Any]] = []
    default = ShareKey(Pool("nvidia.com/gpu"), keys.KIND_SHARE, 4)
    for z in range(zones):
        selector = {"zone": f"z{z}"}
        key = ShareKey(Pool("nvidia.com/gpu", (("zone", f"z{z}"),)), keys.KIND_SHARE, 4)
        for i in range(2):
            name = shadow_name(key, i)
            users = {f"t/b{z}-{i}/app": [f"{keys.DEFAULT_NAMESPACE}/{name}-0"]}
            record = encode_owner_annotation({f"{keys.DEFAULT_NAMESPACE}/{name}": "u"})
            pods.append(shadow(name, 4, node=f"node-{z}", selector=selector, users=users))
            pods.append(sharer(f"b{z}-{i}", 4, ns="t", node=f"node-{z}", phase="Running", selector=selector,
                               annotations={keys.ANNOTATION_SHADOW_OWNER: record}))  # fmt: skip
        pods.append(_stuck(shadow_name(key, 2), selector=selector))
        pods += [sharer(f"p{z}-{i}", 4, ns="t", selector=selector) for i in range(16)]
        pods.append(_stuck(shadow_name(default, z)))
        pods += [sharer(f"w{z}-{i}", 4, ns="t") for i in range(2)]
        pods.append(pod(f"plain-{z}", "web", node="node-0", phase="Running"))
    for p in pods:  # as the API returns them: the memo knows a pod by uid and resourceVersion
        p["metadata"]["resourceVersion"] = "1"
    return pods


def work(fn: Callable[[], object]) -> int:
    count = 0

    def profile(_frame: FrameType, event: str, _arg: object) -> None:
        nonlocal count
        if event in ("call", "c_call"):
            count += 1

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return count


def leader_pass(zones: int, memo: SnapshotMemo | None = None) -> Callable[[], object]:
    pods = cluster(zones)
    node = [p for p in pods if p["spec"].get("node_name") == "node-0"]
    pending = [p for p in pods if not p["spec"].get("node_name") and p["status"]["phase"] == "Pending"]
    shadows = [p for p in pods if p["metadata"]["namespace"] == keys.DEFAULT_NAMESPACE]
    return lambda: plan_cluster(CFG, _no_api(), (node, pending, shadows), {}, 0.0, memo=memo)


def _no_api() -> Any:
    class NoApi:
        def list_pods(self, **_: object) -> tuple[list[dict[str, Any]], str]:
            raise AssertionError("no shadow is idle in this cluster: nothing to confirm")

    return NoApi()


@pytest.mark.parametrize("with_memo", [False, True], ids=["cold", "memo"])
def test_ten_times_the_cluster_costs_about_ten_times_the_work(with_memo: bool) -> None:
    sizes = (20, 200)
    counts = []
    for zones in sizes:
        memo = SnapshotMemo() if with_memo else None
        run = leader_pass(zones, memo)
        run()  # fills the memo; the cold pass just warms up
        counts.append(work(run))
    ratio = counts[1] / counts[0]
    assert ratio <= LINEAR * SLACK, f"work grew {ratio:.1f}x for 10x the cluster ({counts})"
    assert ratio >= LINEAR / 2, f"work grew only {ratio:.1f}x: the pass did not read the cluster ({counts})"
