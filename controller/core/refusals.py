"""The pods the node will not run on a GPU: refused mixes of requests, and pods the agent cannot read.

The admission policy ``gpushare-pods`` is the friendly refusal; the node is the guarantee
(docs/security.md). An operator may run the policy in ``[Warn, Audit]`` or not at all, and a pod
created before it existed was never checked. So on every pass:

- the node's agent evicts each pod bound to it whose mix of GPU requests ``gpushare.rules``
  refuses, with a Warning Event in the policy's words. Until it is gone it keeps what kubelet
  gave it counted as held (``RefusedPod``): its slots keep their shadows, its spot devices are
  reclaimed with the other borrowers', and nobody else is given its GPU;
- the node's agent stops each pod it cannot read that kubelet says holds a gpushare device
  (a share slot or a lent GPU). Such a pod is invisible to the cascade, the drain and reclaim,
  so it may not keep running on a GPU the agent does not know it holds: it is killed through its
  pod cgroup, then evicted;
- the leader tells each unscheduled refused pod why it will not be given a GPU.

Pure module: stdlib and ``gpushare`` only (docs/architecture.md).
"""

from __future__ import annotations

from controller.core.actions import Action, Evict, KillPods, PodToKill, RecordEvent
from controller.core.model import Snapshot
from gpushare import keys

# Event and eviction reasons (the ``reason`` label of gpushare_evictions_total).
REASON_REQUESTS_REFUSED = "GpuRequestsRefused"
REASON_POD_UNREADABLE = "PodUnreadable"

_NODE_REFUSES = "; the node refuses this mix whether or not the admission policy is on, so the pod is evicted"
_NO_GPU = "; gpushare gives it no GPU on any node: delete it and create it again as separate pods"


def _holds_gpushare_device(resource: str) -> bool:
    return resource == keys.RESOURCE_SPOT_GPU or keys.parse_share_resource(resource) is not None


def plan_node_refusals(snapshot: Snapshot) -> list[Action]:
    """Evict this node's refused pods; kill and evict the unreadable ones holding gpushare devices."""
    node = snapshot.node_name
    actions: list[Action] = []
    for pod in snapshot.refused_on(node):
        if pod.facts.is_alive:
            actions.append(Evict(pod.ref, REASON_REQUESTS_REFUSED, pod.why + _NODE_REFUSES))
    holding = {e.pod_key for e in snapshot.pod_resources if e.device_ids and _holds_gpushare_device(e.resource)}
    for problem in snapshot.pod_problems:
        ref = problem.ref
        if ref is None or ref.key not in holding:
            continue
        message = (
            f"{problem.message}; it holds a gpushare device the agent cannot account for, so it is stopped: "
            "correct the field and create the pod again"
        )
        actions.append(KillPods((PodToKill(ref, 0),), REASON_POD_UNREADABLE))
        actions.append(Evict(ref, REASON_POD_UNREADABLE, message))
    return actions


def plan_pending_refusals(snapshot: Snapshot) -> list[Action]:
    """A Warning for each refused pod no node has yet (the leader's; the applier writes each once)."""
    return [
        RecordEvent(pod.ref, REASON_REQUESTS_REFUSED, pod.why + _NO_GPU, "Warning")
        for pod in snapshot.refused
        if pod.facts.is_unscheduled and pod.facts.is_alive
    ]


__all__ = ["REASON_POD_UNREADABLE", "REASON_REQUESTS_REFUSED", "plan_node_refusals", "plan_pending_refusals"]
