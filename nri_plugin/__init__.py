"""containerd NRI plugin: device sync at CreateContainer (design §5, §8).

``Stub`` owns the wire (mux + ttrpc, register, configure, synchronize, reconnect);
``Injector`` is the plugin object (one method per event); ``BundleCache`` is its index of this
node's containers; ``decide`` is the pure decision code; ``AllocationOracle``,
``DeviceResolver``, ``HolderOracle``, ``LendState`` and ``PodRules`` are what the controller injects.
"""

from nri_plugin.bundles import BundleCache
from nri_plugin.errors import (
    ConnectionClosed,
    DeadlineExceeded,
    NriError,
    OracleUnavailable,
    ProtocolError,
    RpcStatusError,
    TransportError,
)
from nri_plugin.injector import Injector
from nri_plugin.oracle import AllocationOracle, DeviceResolver, Holder, HolderOracle, LendState, PodRules
from nri_plugin.stub import Stub, derive_mask

__all__ = [
    "AllocationOracle",
    "BundleCache",
    "ConnectionClosed",
    "DeadlineExceeded",
    "DeviceResolver",
    "Holder",
    "HolderOracle",
    "Injector",
    "LendState",
    "NriError",
    "OracleUnavailable",
    "PodRules",
    "ProtocolError",
    "RpcStatusError",
    "Stub",
    "TransportError",
    "derive_mask",
]
