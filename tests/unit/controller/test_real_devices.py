"""The vendors' GPUs and their health from kubelet's PodResources answers."""

from __future__ import annotations

from controller.core.model import PodResourcesEntry
from controller.core.real_devices import kubelet_real_devices


def test_a_held_gpu_kubelet_no_longer_lists_as_allocatable_is_unhealthy() -> None:
    allocatable = {"nvidia.com/gpu": ["GPU-0", "GPU-1"], "gpushare/share-gpu-4": ["gpushare-system/s-0"]}
    entries = [
        PodResourcesEntry("gpushare-system", "s", "main", "nvidia.com/gpu", ("GPU-3",)),
        PodResourcesEntry("team", "p", "app", "nvidia.com/gpu", ("GPU-1",)),
        PodResourcesEntry("team", "q", "app", "gpushare/share-gpu-4", ("gpushare-system/s-0",)),
    ]
    got = kubelet_real_devices(allocatable, entries, ("nvidia.com/gpu", "amd.com/gpu"))
    # GPU-1 is held and allocatable (healthy); GPU-3 is held and not allocatable (its plugin says Unhealthy).
    assert got == {
        "nvidia.com/gpu": (("GPU-0", True), ("GPU-1", True), ("GPU-3", False)),
        "amd.com/gpu": (),
    }


def test_a_resource_kubelet_lists_nothing_of_says_nothing_of_health() -> None:
    # Its plugin is re-registering (or kubelet restarting): the held GPU is not called Unhealthy.
    entries = [PodResourcesEntry("gpushare-system", "s", "main", "nvidia.com/gpu", ("GPU-3",))]
    assert kubelet_real_devices({}, entries, ("nvidia.com/gpu",)) == {"nvidia.com/gpu": (("GPU-3", True),)}
