"""A lendable owner and its borrowers as plain pod data, and one agent pass over them.

Used by the QEMU guest test (``tests/integration/kernel/guest/guest_spot.py``): the same
decision code and runtime hooks the agent's loop uses, without an API server. Evict (an API
call) is not applied; everything else is, in plan order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from controller.core.actions import KillPods, KmodCommand
from controller.core.detectors import IdleVerdict
from controller.core.mapping import MappingCache
from controller.core.model import PodResourcesEntry, Snapshot, build_snapshot
from controller.spot.runtime import SpotRuntime
from controller.spot.solver import SpotPlan, plan_spot
from gpushare import keys
from gpushare.config import Config
from gpushare.ids import format_spot_id

REAL = "nvidia.com/gpu"
NOW = 1_000_000.0
WINDOW_S = 600.0


@dataclass(frozen=True)
class SpotWorld:
    snapshot: Snapshot
    mapping: MappingCache
    gpus: tuple[str, ...]

    def idle_verdicts(self) -> dict[str, IdleVerdict]:
        """Every GPU idle for longer than the window (the owner is away)."""
        return {g: IdleVerdict(g, "idle", NOW - WINDOW_S - 100) for g in self.gpus}


def _pod(name: str, ns: str, req: dict[str, str], cid: str, labels: dict[str, str] | None) -> dict[str, Any]:
    statuses = [{"name": "app", "container_id": f"containerd://{cid}"}] if cid else []
    return {
        "metadata": {"name": name, "namespace": ns, "uid": f"uid-{ns}-{name}", "labels": labels},
        "spec": {"node_name": "node", "containers": [{"name": "app", "resources": {"requests": req, "limits": req}}]},
        "status": {"phase": "Running", "container_statuses": statuses},
    }


def spot_world(borrower_container_ids: list[str], *, owner_pidns: int, gpus: int | None = None) -> SpotWorld:
    """One lendable owner (pid namespace ``owner_pidns``) with N GPUs; borrower i runs on spot-GPU-i
    in container ``borrower_container_ids[i]`` ("" = not started: nothing to kill)."""
    n = gpus if gpus is not None else max(1, len(borrower_container_ids))
    ids = tuple(f"GPU-{i}" for i in range(n))
    pods = [_pod("owner", "team", {REAL: str(n)}, "c-owner", {keys.LABEL_LENDABLE: "true"})]
    rows = [PodResourcesEntry("team", "owner", "app", REAL, ids)]
    for i, cid in enumerate(borrower_container_ids):
        pods.append(_pod(f"job{i}", "spot", {keys.RESOURCE_SPOT_GPU: "1"}, cid, None))
        rows.append(PodResourcesEntry("spot", f"job{i}", "app", keys.RESOURCE_SPOT_GPU, (format_spot_id(ids[i]),)))
    cfg = Config(node_name="node", real_resources=(REAL,))
    snap = build_snapshot(
        pods, cfg, pod_resources=rows, allocatable={REAL: ids}, pidns_by_container={"c-owner": owner_pidns}
    )
    return SpotWorld(snap, MappingCache.rebuild(snap.pod_resources, snap.pods, (REAL,)), ids)


def agent_pass(rt: SpotRuntime, world: SpotWorld, *, now: float = NOW) -> SpotPlan:
    """What the loop does in one pass (controller/loop.py): hooks in its order, plan, actions in order."""
    rt.verdicts(now)
    plan = plan_spot(
        world.snapshot,
        world.mapping,
        real_resources=(REAL,),
        verdicts=world.idle_verdicts(),
        notices=rt.notices(),
        kmod=rt.kmod_view(),
        back_at={},
        now=now,
        idle_window_s=WINDOW_S,
    )
    for action in plan.actions:
        if isinstance(action, KillPods):
            rt.killer(action)
        elif isinstance(action, KmodCommand):
            rt.kmod(action)
    return plan
