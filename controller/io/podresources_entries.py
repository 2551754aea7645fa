"""kubelet's pod-resources ``List`` answer as the plain rows decision code reads."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from controller.core.model import PodResourcesEntry


def entries_from_pod_resources(pods: Iterable[Any]) -> list[PodResourcesEntry]:
    """Protobuf ``PodResources`` messages as rows, one per container x resource, device IDs in kubelet's order."""
    out: list[PodResourcesEntry] = []
    for p in pods:
        for c in p.containers:
            by_resource: dict[str, list[str]] = {}
            for d in c.devices:
                by_resource.setdefault(d.resource_name, []).extend(d.device_ids)
            for resource, ids in sorted(by_resource.items()):
                out.append(PodResourcesEntry(p.namespace, p.name, c.name, resource, tuple(ids)))
    return out


__all__ = ["entries_from_pod_resources"]
