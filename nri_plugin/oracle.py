"""What the plugin needs from outside to trust a cross-pod instruction (design §8).

The controller implements these and injects them; ``nri_plugin`` never imports the controller:

- ``AllocationOracle``: ``controller.io.podresources.PodResourcesClient``;
- ``DeviceResolver`` and ``HolderOracle``: ``controller.io.vendor_allocate``;
- ``LendState``: ``controller.spot.lend_state``;
- ``PodRules``: the agent's cache of the pods bound to its node (``controller.agent``).

Each is called inside CreateContainer, so it must answer from a cache or within a short timeout
(well under the runtime's 2 s), and raise ``nri_plugin.errors.OracleUnavailable`` when it
cannot answer at all; the plugin then refuses the container (fail closed).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from nri_plugin.model import Bundle


@runtime_checkable
class AllocationOracle(Protocol):
    """Which device IDs kubelet allocated to one container.

    Returns ``{resource name: device IDs}`` — empty when kubelet lists no such container.
    """

    def allocated_ids(self, namespace: str, pod: str, container: str) -> Mapping[str, frozenset[str]]: ...


@runtime_checkable
class DeviceResolver(Protocol):
    """The vendor's own bundle for exactly ``real_ids`` of ``resource``: its device nodes (with
    their numbers on this node), visibility variables and CDI annotations, as the vendor's device
    plugin would give a container allocated just those IDs. None when it cannot tell."""

    def resolve(self, resource: str, real_ids: tuple[str, ...]) -> Bundle | None: ...


@dataclass(frozen=True)
class Holder:
    """The container kubelet allocated a real device ID to, and all it holds of that resource."""

    namespace: str
    pod: str
    container: str
    ids: frozenset[str]

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.pod}/{self.container}"


@runtime_checkable
class HolderOracle(Protocol):
    """Who kubelet allocated ``real_id`` of ``resource`` to (None: nobody on this node).

    Only kubelet's word counts: a container's environment or annotations never make it a holder.
    """

    def holder_of(self, resource: str, real_id: str) -> Holder | None: ...


@runtime_checkable
class LendState(Protocol):
    """Whether the lend of a real GPU to a borrower pod is active now (the agent's spot state).

    Returns None while it is, else why not (e.g. "the pod was reclaimed: its owner came back").
    """

    def lend_ended(self, real_id: str, namespace: str, pod: str, uid: str) -> str | None: ...


@runtime_checkable
class PodRules(Protocol):
    """The rules that need the whole pod as the API server has it (design §8), for one pod.

    ``refusal`` is why gpushare will not run this pod on a GPU (``gpushare.rules.refused_mix``, in
    the admission policy's words), or None when it may run. Raises ``OracleUnavailable`` when the
    pod (by uid) is not known yet or cannot be read: the caller decides whether that refuses.
    """

    def refusal(self, namespace: str, name: str, uid: str) -> str | None: ...
