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
    """Real resource -> (ID, healthy) for every GPU kubelet knows of it, sorted by ID.

    A resource kubelet lists no allocatable device of at all says nothing of health: its plugin
    is not registered right now (restarting, or kubelet is), so its held GPUs count as Healthy
    until kubelet lists the resource again. A GPU is Unhealthy only when kubelet lists others of
    its resource and not it."""
    wanted = tuple(real_resources)
    held: dict[str, set[str]] = {r: set() for r in wanted}
    for e in entries:
        if e.resource in held:
            held[e.resource].update(e.device_ids)
    out: dict[str, tuple[tuple[str, bool], ...]] = {}
    for resource in wanted:
        healthy = frozenset(allocatable.get(resource, ()))
        known = sorted(healthy | held[resource])
        out[resource] = tuple((i, i in healthy or not healthy) for i in known)
    return out
