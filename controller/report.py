"""What one reconcile pass reports: frozen values that ``gpushare status``, ``/status`` and
``/metrics`` read without ever waiting for the loop.

    TickReport       the whole pass: liveness, plugin counts, allocations, demand, spot, evictions
    ├── ShadowStatus one shadow pod as ``gpushare status`` shows it (its GPU, its users)
    ├── SharerStatus one sharer pod and the shadows backing it
    └── Eviction     one pod the agent deleted, and why
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from controller.core.mapping import MappingCache
from controller.core.model import PodResourcesEntry, Snapshot
from controller.metrics.attribution import Attribution
from controller.share.solver import KeyDemand, unhealthy_shadows
from controller.spot.solver import GpuSpot
from gpushare import installation, keys
from gpushare.rules import is_gpushare_resource


@dataclass(frozen=True)
class ShadowStatus:
    pod: str  # ns/name
    uid: str
    phase: str
    node: str
    resource: str  # the share resource it backs, e.g. gpushare/share-gpu-4
    gpu: tuple[str, ...]  # real IDs kubelet allocated to its main container ("" until known)
    users: tuple[str, ...]  # "ns/pod/container" holding its virtual devices
    unschedulable: str  # the scheduler's message while it cannot be placed
    # Why its GPU cannot serve a new sharer: Unhealthy at the vendor plugin (its slots are listed
    # Unhealthy); "" while healthy.
    unhealthy: str = ""


@dataclass(frozen=True)
class SharerStatus:
    pod: str
    phase: str
    node: str
    resource: str
    quantity: int
    shadows: tuple[str, ...]


@dataclass(frozen=True)
class Eviction:
    at: float  # wall clock
    pod: str
    reason: str
    message: str


@dataclass(frozen=True)
class TickReport:
    at: float = 0.0  # wall clock of the pass; 0 before the first
    took_ms: float = 0.0
    passes: int = 0
    synced: bool = False
    is_leader: bool = False
    pod_resources_ok: bool = False
    error: str = ""
    advertised: Mapping[str, int] = field(default_factory=dict)  # resource -> devices advertised
    healthy: Mapping[str, int] = field(default_factory=dict)
    registered: Mapping[str, bool] = field(default_factory=dict)
    allocated: Mapping[str, int] = field(default_factory=dict)  # resource -> device IDs held (PodResources)
    shadows: tuple[ShadowStatus, ...] = ()
    sharers: tuple[SharerStatus, ...] = ()
    demand: tuple[KeyDemand, ...] = ()
    # Pending sharers the leader makes no shadow for: no node would take them for other reasons.
    blocked: tuple[str, ...] = ()
    spot: tuple[GpuSpot, ...] = ()
    evictions: tuple[Eviction, ...] = ()
    evictions_total: Mapping[str, int] = field(default_factory=dict)  # reason -> count since start
    problems: tuple[str, ...] = ()
    # Field -> pods skipped since start because that field could not be read (controller/core/pod_problems.py).
    pod_input_errors_total: Mapping[str, int] = field(default_factory=dict)
    # Who holds or sees which GPU on this node, in which role (/metrics: gpushare_gpu_user).
    attribution: Attribution = field(default_factory=Attribution)

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["demand"] = [
            {"key": str(d.key), "shadows": d.shadows, "free_slots": d.free_slots, "pending": d.pending}
            for d in self.demand
        ]
        out["spot"] = [
            {
                "real_id": g.real_id,
                "state": str(g.state),
                "owner": g.owner,
                "borrowers": list(g.borrowers),
                "reason": g.reason,
            }
            for g in self.spot
        ]
        return out


def describe_node(
    snapshot: Snapshot,
    mapping: MappingCache,
    unschedulable: Mapping[str, str],
    real_resources: Iterable[str],
    pod_resources: Iterable[PodResourcesEntry] = (),
) -> tuple[tuple[ShadowStatus, ...], tuple[SharerStatus, ...]]:
    """Shadows and sharers as ``gpushare status`` shows them; ``pod_resources``: this node's rows."""
    real = set(real_resources)
    gpu_of: dict[str, tuple[str, ...]] = {}
    for e in (*snapshot.pod_resources, *pod_resources):
        if e.resource in real and e.namespace == installation.namespace() and e.container == keys.SHADOW_CONTAINER:
            gpu_of[e.pod_key] = tuple(sorted(e.device_ids))
    sick = unhealthy_shadows(snapshot.shadows, mapping, snapshot.vendor_unhealthy, snapshot.shadow_device_nodes)
    shadows = tuple(
        ShadowStatus(
            pod=s.ref.key,
            uid=s.ref.uid,
            phase="Terminating" if s.facts.is_terminating else s.facts.phase,
            node=s.node_name,
            resource=s.key.resource,
            gpu=gpu_of.get(s.ref.key, ()),
            users=tuple(sorted(mapping.users_of(s.ref.key) or s.users)),
            unschedulable=unschedulable.get(s.ref.key, ""),
            unhealthy=sick.get(s.ref.key, ""),
        )
        for s in snapshot.shadows
    )
    sharers = tuple(
        SharerStatus(
            pod=p.ref.key,
            phase="Terminating" if p.facts.is_terminating else p.facts.phase,
            node=p.node_name,
            resource=p.key.resource,
            quantity=p.quantity,
            shadows=tuple(sorted(mapping.shadows_of(p.ref.key) or p.owner_shadows)),
        )
        for p in snapshot.sharers
    )
    return shadows, sharers


def count_allocated(entries: Iterable[PodResourcesEntry], real_resources: Iterable[str]) -> dict[str, int]:
    """Resource -> device IDs kubelet reports held, for gpushare's resources and the real GPUs only."""
    real = set(real_resources)
    allocated: collections.Counter[str] = collections.Counter()
    for e in entries:
        if is_gpushare_resource(e.resource) or e.resource in real:
            allocated[e.resource] += len(e.device_ids)
    return dict(allocated)


def build_report(
    *,
    at: float,
    took_ms: float,
    passes: int,
    is_leader: bool,
    pod_resources_error: str,
    plugin_status: Mapping[str, Mapping[str, Any]],
    allocated: Mapping[str, int],
    node: tuple[tuple[ShadowStatus, ...], tuple[SharerStatus, ...]],
    demand: tuple[KeyDemand, ...],
    spot: tuple[GpuSpot, ...],
    evictions: Sequence[Eviction],
    blocked: tuple[str, ...] = (),
    evictions_total: Mapping[str, int],
    problems: tuple[str, ...],
    attribution: Attribution | None = None,
    pod_input_errors_total: Mapping[str, int] | None = None,
) -> TickReport:
    """The report of one completed pass; ``plugin_status`` is ``PluginManager.status()``, ``node`` is
    ``describe_node``'s answer."""
    shadows, sharers = node
    return TickReport(
        at=at,
        took_ms=took_ms,
        passes=passes,
        synced=True,
        is_leader=is_leader,
        pod_resources_ok=not pod_resources_error,
        error=pod_resources_error,
        advertised={r: int(s.get("devices", 0)) for r, s in plugin_status.items()},
        healthy={r: int(s.get("healthy", 0)) for r, s in plugin_status.items()},
        registered={r: bool(s.get("registered")) for r, s in plugin_status.items()},
        allocated=dict(allocated),
        shadows=shadows,
        sharers=sharers,
        demand=demand,
        blocked=blocked,
        spot=spot,
        evictions=tuple(evictions),
        evictions_total=dict(evictions_total),
        problems=problems,
        attribution=attribution if attribution is not None else Attribution(),
        pod_input_errors_total=dict(pod_input_errors_total or {}),
    )


__all__ = [
    "Eviction",
    "ShadowStatus",
    "SharerStatus",
    "TickReport",
    "build_report",
    "count_allocated",
    "describe_node",
]
