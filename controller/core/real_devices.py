"""The vendors' GPUs and their health as kubelet has them: what spot offers and share slots follow.

kubelet's PodResources ``GetAllocatableResources`` lists each registered plugin's devices that the
plugin lists Healthy; ``List`` says which a container holds. A GPU a container holds that kubelet
no longer lists as allocatable is Unhealthy (or gone from its plugin). gpushare takes the vendors'
GPUs from here rather than from a ListAndWatch stream of its own on a vendor's socket: NVIDIA's
plugin hands each health change to one stream only, so a second stream could take it from
kubelet's (docs/nvidia.md).

Pure: plain values in, plain values out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from controller.core.model import PodResourcesEntry


def kubelet_real_devices(
    allocatable: Mapping[str, Iterable[str]],
    entries: Iterable[PodResourcesEntry],
    real_resources: Iterable[str],
) -> dict[str, tuple[tuple[str, bool], ...]]:
    """Real resource -> (ID, healthy) for every GPU kubelet knows of it, sorted by ID."""
    wanted = tuple(real_resources)
    held: dict[str, set[str]] = {r: set() for r in wanted}
    for e in entries:
        if e.resource in held:
            held[e.resource].update(e.device_ids)
    out: dict[str, tuple[tuple[str, bool], ...]] = {}
    for resource in wanted:
        healthy = frozenset(allocatable.get(resource, ()))
        out[resource] = tuple((i, i in healthy) for i in sorted(healthy | held[resource]))
    return out
