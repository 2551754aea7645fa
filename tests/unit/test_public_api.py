"""Pin every package's public surface (httpx's habit): a change to __all__ is deliberate."""

from __future__ import annotations

import importlib

import pytest

EXPECTED = {
    "gpushare": ["ConfigError", "GpushareError", "InstructionRefused"],
    "gpukmod": [
        "InstallAction",
        "KmodClient",
        "KmodError",
        "KmodUnavailable",
        "build_module",
        "install",
        "load",
        "loaded_version",
        "plan_install",
        "unload",
    ],
    "gpumetrics": [
        "AUTO",
        "DeviceMetrics",
        "GpuAdapter",
        "MetricsError",
        "ParseResult",
        "ParsedText",
        "Sample",
        "Workload",
        "adapter_names",
        "detect_vendors",
        "get_adapter",
        "parse_metrics",
        "parse_text",
        "register",
    ],
    "deviceplugins": [
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
    ],
    "nri_plugin": [
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
    ],
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_all_is_pinned(name: str) -> None:
    module = importlib.import_module(name)
    assert sorted(module.__all__) == sorted(EXPECTED[name])
    for symbol in module.__all__:
        assert hasattr(module, symbol)
