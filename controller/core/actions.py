"""What the decision code asks the reconcile loop to do: plain, frozen, ordered values.

A solver returns a list of actions; the loop applies them *in list order* (the spot
return sequence depends on it: Unhealthy, kill, delete, release, undetect — design §6)
and logs one line per action from ``log_fields()`` (one INFO line per decision).

    CreateShadow(key, name, manifest)          create a shadow pod (leader only)
    DeleteShadow(ref, reason)                  delete an idle shadow (leader only)
    Evict(ref, reason, message)                delete a pod and record a Warning Event
    KillPods(pods, reason)                     SIGKILL every task of those pods' cgroups now
    SetDevices(resource, ids)                  the full device list of one share plugin
    SetSpotHealth(real_id, is_healthy, reason) health of spot-<real_id>
    KmodCommand(op, pidns)                     add / delete / detect / undetect / release
    AnnotatePod(ref, key, value)               write (or remove, value None) one annotation
    RecordEvent(ref, reason, message, type)    a Kubernetes Event with no other effect
    RecordNodeEvent(reason, message, type)     the same, on this agent's Node
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from controller.core.model import ShareKey
from controller.core.pod_facts import PodRef
from gpushare.ids import format_spot_id

# Eviction and event reasons: CamelCase as Kubernetes Events spell them; also the
# `reason` label of gpushare_evictions_total.
# design §3: the shadow holding the sharer's GPU disappeared; the sharer is evicted and its pod killed
REASON_SHADOW_GONE = "ShadowGone"
REASON_OWNER_BACK = "OwnerBack"  # design §6: the lending owner touched its GPU again
REASON_OWNER_LEFT = "OwnerLeft"  # the owner released the GPU (pod gone) while it was lent
REASON_NOT_LENDABLE = "OwnerNotLendable"  # the owner withdrew its lendable label while lent
REASON_SHADOW_IDLE = "ShadowIdle"  # a shadow had no sharer for shadowIdleTimeout
REASON_SHADOW_DEMAND = "ShadowDemand"  # pending sharers outnumber free slots
REASON_WARM_POOL = "WarmPool"  # keeping warmShadows spare
REASON_SPOT_BLOCKED = "SpotLendingBlocked"  # spot is on but the node's pod cgroups cannot be found
REASON_GPU_UNHEALTHY = "GPUUnhealthy"  # a shadow's GPU is Unhealthy at its vendor device plugin

KmodOp = Literal["add", "delete", "detect", "undetect", "release"]


@dataclass(frozen=True)
class CreateShadow:
    key: ShareKey
    name: str
    manifest: Mapping[str, Any] = field(compare=False, repr=False)
    reason: str = REASON_SHADOW_DEMAND

    def log_fields(self) -> dict[str, Any]:
        return {"decision": "create-shadow", "shadow": self.name, "key": str(self.key), "reason": self.reason}


@dataclass(frozen=True)
class DeleteShadow:
    ref: PodRef
    reason: str = REASON_SHADOW_IDLE

    def log_fields(self) -> dict[str, Any]:
        return {"decision": "delete-shadow", "shadow": self.ref.key, "reason": self.reason}


@dataclass(frozen=True)
class Evict:
    """Delete the pod (uid precondition, so a re-created namesake survives) and record why."""

    ref: PodRef
    reason: str
    message: str

    def log_fields(self) -> dict[str, Any]:
        return {"decision": "evict", "pod": self.ref.key, "reason": self.reason}


@dataclass(frozen=True)
class PodToKill:
    """A borrower pod: its uid finds its pod cgroup; ``running`` is how many of its containers kubelet
    last reported running (a kill that finds no task then is an error, never a fast return)."""

    ref: PodRef
    running: int


@dataclass(frozen=True)
class KillPods:
    """Kill every task of these pods through their pod cgroups (every container, ephemeral ones and
    ones started after the kill began), without waiting on the API. One action per reclaim, so the
    borrowers of one owner die together."""

    pods: tuple[PodToKill, ...]
    reason: str

    @property
    def refs(self) -> tuple[PodRef, ...]:
        return tuple(p.ref for p in self.pods)

    def log_fields(self) -> dict[str, Any]:
        return {"decision": "kill", "pods": ",".join(r.key for r in self.refs), "reason": self.reason}


@dataclass(frozen=True)
class SetDevices:
    """The complete list of device IDs one share plugin advertises; those in ``unhealthy`` are
    advertised Unhealthy (their shadow's GPU is unhealthy at its vendor plugin), the rest Healthy."""

    resource: str
    ids: tuple[str, ...]
    unhealthy: tuple[str, ...] = ()

    def log_fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = {"decision": "set-devices", "resource": self.resource, "devices": len(self.ids)}
        if self.unhealthy:
            fields["unhealthy"] = len(self.unhealthy)
        return fields


@dataclass(frozen=True)
class SetSpotHealth:
    """Health of ``spot-<real_id>`` (``PluginManager.set_spot_health(real_id, healthy)``)."""

    real_id: str
    is_healthy: bool
    reason: str

    @property
    def device_id(self) -> str:
        return format_spot_id(self.real_id)

    def log_fields(self) -> dict[str, Any]:
        return {"decision": "spot-health", "device": self.device_id, "healthy": self.is_healthy, "reason": self.reason}


@dataclass(frozen=True)
class KmodCommand:
    op: KmodOp
    pidns: int

    def log_fields(self) -> dict[str, Any]:
        return {"decision": f"kmod-{self.op}", "pidns": self.pidns}


@dataclass(frozen=True)
class AnnotatePod:
    """Merge-patch one annotation; ``value=None`` removes it."""

    ref: PodRef
    key: str
    value: str | None

    def log_fields(self) -> dict[str, Any]:
        return {"decision": "annotate", "pod": self.ref.key, "key": self.key}


@dataclass(frozen=True)
class RecordEvent:
    ref: PodRef
    reason: str
    message: str
    type: Literal["Normal", "Warning"] = "Normal"

    def log_fields(self) -> dict[str, Any]:
        return {"decision": "event", "pod": self.ref.key, "reason": self.reason}


@dataclass(frozen=True)
class RecordNodeEvent:
    """An Event on this agent's Node (``kubectl describe node``): what concerns the node, not one pod."""

    reason: str
    message: str
    type: Literal["Normal", "Warning"] = "Warning"

    def log_fields(self) -> dict[str, Any]:
        return {"decision": "node-event", "reason": self.reason}


@dataclass(frozen=True)
class PublishCapacity:
    """Lower this node's allocatable ``resource`` to ``count`` now, ahead of kubelet's next node status.

    Never raises it: a higher count is kubelet's to publish once its device manager has the devices.
    """

    resource: str
    count: int

    def log_fields(self) -> dict[str, Any]:
        return {"decision": "publish-capacity", "resource": self.resource, "count": self.count}


Action = (
    CreateShadow
    | DeleteShadow
    | Evict
    | KillPods
    | SetDevices
    | SetSpotHealth
    | KmodCommand
    | AnnotatePod
    | RecordEvent
    | RecordNodeEvent
    | PublishCapacity
)


def describe(action: Action) -> str:
    """One log line for an action: ``decision=evict pod=ns/p reason=OwnerBack``."""
    return " ".join(f"{k}={v}" for k, v in action.log_fields().items())


__all__ = [
    "REASON_NOT_LENDABLE",
    "REASON_OWNER_BACK",
    "REASON_OWNER_LEFT",
    "REASON_SHADOW_DEMAND",
    "REASON_SHADOW_GONE",
    "REASON_SHADOW_IDLE",
    "REASON_SPOT_BLOCKED",
    "REASON_WARM_POOL",
    "Action",
    "AnnotatePod",
    "CreateShadow",
    "DeleteShadow",
    "Evict",
    "KillPods",
    "KmodCommand",
    "KmodOp",
    "PodToKill",
    "PublishCapacity",
    "RecordEvent",
    "RecordNodeEvent",
    "SetDevices",
    "SetSpotHealth",
    "describe",
]
