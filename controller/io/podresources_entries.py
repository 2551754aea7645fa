"""kubelet's pod-resources ``List`` answer as the plain rows decision code reads.

Device-plugin devices are rows as kubelet reports them. DRA devices of gpushare's own driver
become rows too, in the vocabulary spot already speaks: a whole GPU is held of
``keys.RESOURCE_DRA_GPU`` with the vendor's ID of the GPU, and its spot device is held of
``gpushare/spot-gpu`` with ``spot-<that ID>``, so an owner and its borrowers on a DRA node are
the same rows as on a device-plugin node. The vendor's ID is the vendor's CDI device the driver
prepared (``nvidia.com/gpu=GPU-<uuid>`` → ``GPU-<uuid>``), the name the vendor's exporter gives
the GPU too. Other drivers' devices and share devices are not rows: nothing gpushare decides
reads them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from controller.core.model import PodResourcesEntry
from draplugin.claims import CDI_VENDOR_PREFIX
from draplugin.inventory import vendor_id_of
from draplugin.pool import KIND_SPOT, KIND_WHOLE, parse_device_name
from gpushare import keys
from gpushare.ids import format_spot_id


def _dra_rows(container: Any) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    # Rows built by hand (the tests' plain namespaces) may leave the DRA field out.
    for dynamic in getattr(container, "dynamic_resources", ()):
        for r in dynamic.claim_resources:
            if r.driver_name != keys.DRA_DRIVER:
                continue
            parsed = parse_device_name(r.device_name)
            vendor = [d.name for d in r.cdi_devices if not d.name.startswith(CDI_VENDOR_PREFIX)]
            if parsed is None or not vendor:
                continue
            real_id = vendor_id_of(vendor[0])
            if parsed[1] == KIND_WHOLE:
                out.setdefault(keys.RESOURCE_DRA_GPU, []).append(real_id)
            elif parsed[1] == KIND_SPOT:
                out.setdefault(keys.RESOURCE_SPOT_GPU, []).append(format_spot_id(real_id))
    return out


def entries_from_pod_resources(pods: Iterable[Any]) -> list[PodResourcesEntry]:
    """Protobuf ``PodResources`` messages as rows, one per container x resource, device IDs in kubelet's order."""
    out: list[PodResourcesEntry] = []
    for p in pods:
        for c in p.containers:
            by_resource: dict[str, list[str]] = {}
            for d in c.devices:
                by_resource.setdefault(d.resource_name, []).extend(d.device_ids)
            for resource, ids in _dra_rows(c).items():
                by_resource.setdefault(resource, []).extend(ids)
            for resource, ids in sorted(by_resource.items()):
                out.append(PodResourcesEntry(p.namespace, p.name, c.name, resource, tuple(ids)))
    return out


__all__ = ["entries_from_pod_resources"]
