"""NVML's ABI as a caller sees it, for the tests of the mock: ctypes declarations of what they call.

Written from NVIDIA's nvml.h, not from the mock's own header (fakenvidia/mock_nvml/nvml_abi.h),
so a layout or a value the mock gets wrong shows up as a wrong answer here rather than agreeing
with itself.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

# nvmlReturn_t
SUCCESS = 0
ERROR_UNINITIALIZED = 1
ERROR_INVALID_ARGUMENT = 2
ERROR_NOT_SUPPORTED = 3
ERROR_NOT_FOUND = 6
ERROR_INSUFFICIENT_SIZE = 7
ERROR_TIMEOUT = 10
ERROR_MEMORY = 20
ERROR_UNKNOWN = 999

EVENT_SINGLE_BIT_ECC = 0x1
EVENT_DOUBLE_BIT_ECC = 0x2
EVENT_PSTATE = 0x4
EVENT_XID_CRITICAL = 0x8
EVENT_CLOCK = 0x10
EVENT_POWER_SOURCE_CHANGE = 0x80

TOPOLOGY_SINGLE = 10
TOPOLOGY_NODE = 40
TOPOLOGY_SYSTEM = 50
BRAND_NVIDIA = 14
ARCH_AMPERE = 7
MIG_DISABLE = 0
NVLINK_MAX_LINKS = 36
GPU_INSTANCE_PROFILE_COUNT = 0x12

UUID_BUFFER_SIZE = 80  # what go-nvml passes to nvmlDeviceGetUUID
NAME_BUFFER_SIZE = 96
DRIVER_VERSION_BUFFER_SIZE = 80
NO_MIG_INSTANCE = 0xFFFFFFFF


class PciInfo(ctypes.Structure):
    _fields_ = [
        ("busIdLegacy", ctypes.c_char * 16),
        ("domain", ctypes.c_uint),
        ("bus", ctypes.c_uint),
        ("device", ctypes.c_uint),
        ("pciDeviceId", ctypes.c_uint),
        ("pciSubSystemId", ctypes.c_uint),
        ("busId", ctypes.c_char * 32),
    ]


class Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class EventData(ctypes.Structure):
    _fields_ = [
        ("device", ctypes.c_void_p),
        ("eventType", ctypes.c_ulonglong),
        ("eventData", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


_P = ctypes.POINTER
_HANDLE = ctypes.c_void_p
_SIGNATURES: dict[str, list[object]] = {
    "nvmlInit_v2": [],
    "nvmlShutdown": [],
    "nvmlSystemGetDriverVersion": [ctypes.c_char_p, ctypes.c_uint],
    "nvmlSystemGetCudaDriverVersion": [_P(ctypes.c_int)],
    "nvmlDeviceGetCount_v2": [_P(ctypes.c_uint)],
    "nvmlDeviceGetHandleByIndex_v2": [ctypes.c_uint, _P(_HANDLE)],
    "nvmlDeviceGetHandleByUUID": [ctypes.c_char_p, _P(_HANDLE)],
    "nvmlDeviceGetName": [_HANDLE, ctypes.c_char_p, ctypes.c_uint],
    "nvmlDeviceGetUUID": [_HANDLE, ctypes.c_char_p, ctypes.c_uint],
    "nvmlDeviceGetIndex": [_HANDLE, _P(ctypes.c_uint)],
    "nvmlDeviceGetMinorNumber": [_HANDLE, _P(ctypes.c_uint)],
    "nvmlDeviceGetMemoryInfo": [_HANDLE, _P(Memory)],
    "nvmlDeviceGetPciInfo_v3": [_HANDLE, _P(PciInfo)],
    "nvmlDeviceGetBrand": [_HANDLE, _P(ctypes.c_uint)],  # an enum: int-sized
    "nvmlDeviceGetArchitecture": [_HANDLE, _P(ctypes.c_uint)],
    "nvmlDeviceGetCudaComputeCapability": [_HANDLE, _P(ctypes.c_int), _P(ctypes.c_int)],
    "nvmlDeviceGetMigMode": [_HANDLE, _P(ctypes.c_uint), _P(ctypes.c_uint)],
    "nvmlDeviceGetMaxMigDeviceCount": [_HANDLE, _P(ctypes.c_uint)],
    "nvmlDeviceGetMigDeviceHandleByIndex": [_HANDLE, ctypes.c_uint, _P(_HANDLE)],
    "nvmlDeviceIsMigDeviceHandle": [_HANDLE, _P(ctypes.c_uint)],
    "nvmlDeviceGetGpuInstanceProfileInfo": [_HANDLE, ctypes.c_uint, ctypes.c_void_p],
    "nvmlDeviceGetTopologyCommonAncestor": [_HANDLE, _HANDLE, _P(ctypes.c_int)],
    "nvmlDeviceGetNvLinkState": [_HANDLE, ctypes.c_uint, _P(ctypes.c_int)],
    "nvmlDeviceGetSupportedEventTypes": [_HANDLE, _P(ctypes.c_ulonglong)],
    "nvmlDeviceRegisterEvents": [_HANDLE, ctypes.c_ulonglong, _HANDLE],
    "nvmlEventSetCreate": [_P(_HANDLE)],
    "nvmlEventSetWait_v2": [_HANDLE, _P(EventData), ctypes.c_uint],
    "nvmlEventSetFree": [_HANDLE],
}
SYMBOLS = frozenset([*_SIGNATURES, "nvmlErrorString"])


class NvmlError(AssertionError):
    def __init__(self, call: str, code: int) -> None:
        self.code = code
        super().__init__(f"{call} returned {code}")


class Nvml:
    """One loaded copy of a libnvidia-ml.so.1: the raw calls (``lib``) and checked conveniences."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lib = ctypes.CDLL(str(path))
        for name, argtypes in _SIGNATURES.items():
            fn = getattr(self.lib, name)
            fn.argtypes = argtypes
            fn.restype = ctypes.c_int
        self.lib.nvmlErrorString.argtypes = [ctypes.c_int]
        self.lib.nvmlErrorString.restype = ctypes.c_char_p

    def check(self, name: str, *args: object) -> None:
        code = int(getattr(self.lib, name)(*args))
        if code != SUCCESS:
            raise NvmlError(name, code)

    def reset(self) -> None:
        """Shut down every initialization a test left behind, so the next starts from nothing."""
        while self.lib.nvmlShutdown() == SUCCESS:
            pass

    def init(self) -> None:
        self.check("nvmlInit_v2")

    def shutdown(self) -> None:
        self.check("nvmlShutdown")

    def count(self) -> int:
        n = ctypes.c_uint()
        self.check("nvmlDeviceGetCount_v2", ctypes.byref(n))
        return n.value

    def handle(self, index: int) -> int:
        h = ctypes.c_void_p()
        self.check("nvmlDeviceGetHandleByIndex_v2", index, ctypes.byref(h))
        assert h.value is not None
        return h.value

    def handle_by_uuid(self, uuid: str) -> int:
        h = ctypes.c_void_p()
        self.check("nvmlDeviceGetHandleByUUID", uuid.encode(), ctypes.byref(h))
        assert h.value is not None
        return h.value

    def _text(self, name: str, handle: int, size: int) -> str:
        buf = ctypes.create_string_buffer(size)
        self.check(name, handle, buf, size)
        return buf.value.decode()

    def uuid(self, handle: int) -> str:
        return self._text("nvmlDeviceGetUUID", handle, UUID_BUFFER_SIZE)

    def name(self, handle: int) -> str:
        return self._text("nvmlDeviceGetName", handle, NAME_BUFFER_SIZE)

    def uint(self, name: str, handle: int) -> int:
        value = ctypes.c_uint()
        self.check(name, handle, ctypes.byref(value))
        return value.value

    def pci(self, handle: int) -> PciInfo:
        info = PciInfo()
        self.check("nvmlDeviceGetPciInfo_v3", handle, ctypes.byref(info))
        return info

    def driver_version(self) -> str:
        buf = ctypes.create_string_buffer(DRIVER_VERSION_BUFFER_SIZE)
        self.check("nvmlSystemGetDriverVersion", buf, DRIVER_VERSION_BUFFER_SIZE)
        return buf.value.decode()

    def uuids(self) -> list[str]:
        return [self.uuid(self.handle(i)) for i in range(self.count())]

    def event_set(self) -> int:
        s = ctypes.c_void_p()
        self.check("nvmlEventSetCreate", ctypes.byref(s))
        assert s.value is not None
        return s.value

    def register(self, handle: int, event_set: int, types: int = EVENT_XID_CRITICAL) -> None:
        self.check("nvmlDeviceRegisterEvents", handle, types, event_set)

    def wait(self, event_set: int, timeout_ms: int) -> tuple[int, EventData]:
        data = EventData()
        code = int(self.lib.nvmlEventSetWait_v2(event_set, ctypes.byref(data), timeout_ms))
        return code, data
