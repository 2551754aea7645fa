"""kubelet device plugins: thin annotation emitters, one server per resource (design §2, §4).

``PluginManager`` runs every plugin of the node (share-gpu-N, share-dev-gpu-N, spot-gpu, or
the fake vendor plugin) in one process; the controller drives it through ``set_shadows``,
``set_spot_health`` and ``set_devices``. Decisions live in ``policies.py``; see
``docs/deviceplugins.md`` for the operator's view.
"""

from deviceplugins.errors import (
    DevicePluginError,
    DevicesRefused,
    FakeDeviceError,
    InvalidShadow,
    RegistrationFailed,
    SocketError,
    UnknownDevices,
)
from deviceplugins.fake import create_fake_gpu_nodes
from deviceplugins.manager import PluginManager
from deviceplugins.plugins import FakeGpuPlugin, SharePlugin, SpotPlugin
from deviceplugins.policies import AdvertisedDevice, Allocation, DeviceMount, ShadowSlots, parse_static_shadow
from deviceplugins.server import DevicePluginServer
from deviceplugins.vendor import PluginSnapshot, VendorWatch, read_plugin

__all__ = [
    "AdvertisedDevice",
    "Allocation",
    "DeviceMount",
    "DevicePluginError",
    "DevicePluginServer",
    "DevicesRefused",
    "FakeDeviceError",
    "FakeGpuPlugin",
    "InvalidShadow",
    "PluginManager",
    "PluginSnapshot",
    "RegistrationFailed",
    "ShadowSlots",
    "SharePlugin",
    "SocketError",
    "SpotPlugin",
    "UnknownDevices",
    "VendorWatch",
    "create_fake_gpu_nodes",
    "parse_static_shadow",
    "read_plugin",
]
