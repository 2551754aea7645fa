"""What the plugin needs from outside to trust a cross-pod instruction (design §8).

The controller implements these (``controller.io.podresources.PodResourcesClient`` is the
``AllocationOracle``) and injects them; ``nri_plugin`` never imports the controller.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

from nri_plugin.model import Bundle


@runtime_checkable
class AllocationOracle(Protocol):
    """Which device IDs kubelet allocated to one container.

    Called inside CreateContainer, so it must answer from a cache or within a short timeout
    (well under the runtime's 2 s). Returns ``{resource name: device IDs}`` — empty when kubelet
    lists no such container — and raises ``nri_plugin.errors.OracleUnavailable`` when it cannot
    answer at all.
    """

    def allocated_ids(self, namespace: str, pod: str, container: str) -> Mapping[str, frozenset[str]]: ...


@runtime_checkable
class DeviceResolver(Protocol):
    """Optional: turn real device IDs into a bundle when no container on this node is known to
    hold exactly those IDs (e.g. by asking the vendor device plugin's ``Allocate``). Returns
    None when it cannot. Same latency rules as ``AllocationOracle``."""

    def resolve(self, resource: str, real_ids: tuple[str, ...]) -> Bundle | None: ...
