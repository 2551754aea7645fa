"""The mock NVML answers NVML's calls as NVIDIA's ABI says, for the GPUs it was configured with."""

from __future__ import annotations

import ctypes
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.unit.fakenvidia import nvml as abi
from tests.unit.fakenvidia.nvml import Nvml, NvmlError

UUID = re.compile(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
BOGUS_HANDLE = 0x1234


def test_the_library_exports_the_nvml_calls_it_implements_and_nothing_else(nvml_library: Path) -> None:
    out = subprocess.run(
        ["nm", "-D", "--defined-only", str(nvml_library)], capture_output=True, text=True, check=True, timeout=30
    ).stdout
    exported = {line.split()[-1] for line in out.splitlines() if line.strip()}
    assert {s for s in exported if s.startswith("nvml")} == abi.SYMBOLS
    assert exported - abi.SYMBOLS <= {"_init", "_fini"}


def test_its_soname_is_the_one_go_nvml_loads(nvml_library: Path) -> None:
    out = subprocess.run(["readelf", "-d", str(nvml_library)], capture_output=True, text=True, check=True, timeout=30)
    assert "Library soname: [libnvidia-ml.so.1]" in out.stdout


def test_every_call_before_init_is_refused_as_uninitialized(nvml: Nvml) -> None:
    count = ctypes.c_uint()
    handle = ctypes.c_void_p()
    event_set = ctypes.c_void_p()
    version = ctypes.create_string_buffer(80)
    assert nvml.lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) == abi.ERROR_UNINITIALIZED
    assert nvml.lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(handle)) == abi.ERROR_UNINITIALIZED
    assert nvml.lib.nvmlSystemGetDriverVersion(version, 80) == abi.ERROR_UNINITIALIZED
    assert nvml.lib.nvmlEventSetCreate(ctypes.byref(event_set)) == abi.ERROR_UNINITIALIZED
    assert nvml.lib.nvmlShutdown() == abi.ERROR_UNINITIALIZED


def test_init_is_reference_counted_and_handles_die_with_the_last_shutdown(nvml: Nvml) -> None:
    nvml.init()
    nvml.init()
    handle = nvml.handle(0)
    nvml.shutdown()
    assert nvml.uuid(handle)  # still initialized once
    nvml.shutdown()
    buf = ctypes.create_string_buffer(80)
    assert nvml.lib.nvmlDeviceGetUUID(handle, buf, 80) == abi.ERROR_UNINITIALIZED
    assert nvml.lib.nvmlShutdown() == abi.ERROR_UNINITIALIZED


def test_by_default_eight_a100s_of_an_r570_driver(nvml: Nvml) -> None:
    nvml.init()
    assert nvml.count() == 8
    assert nvml.driver_version() == "570.172.08"
    cuda = ctypes.c_int()
    nvml.check("nvmlSystemGetCudaDriverVersion", ctypes.byref(cuda))
    assert cuda.value == 12080
    for i in range(8):
        h = nvml.handle(i)
        assert nvml.name(h) == "NVIDIA A100-SXM4-40GB"
        assert nvml.uint("nvmlDeviceGetBrand", h) == abi.BRAND_NVIDIA
        assert nvml.uint("nvmlDeviceGetArchitecture", h) == abi.ARCH_AMPERE
        major, minor = ctypes.c_int(), ctypes.c_int()
        nvml.check("nvmlDeviceGetCudaComputeCapability", h, ctypes.byref(major), ctypes.byref(minor))
        assert (major.value, minor.value) == (8, 0)


def test_index_and_minor_number_are_the_gpus_position(nvml: Nvml) -> None:
    nvml.init()
    for i in range(nvml.count()):
        h = nvml.handle(i)
        assert nvml.uint("nvmlDeviceGetIndex", h) == i
        assert nvml.uint("nvmlDeviceGetMinorNumber", h) == i  # its node is /dev/nvidia<i>


def test_uuids_are_well_formed_distinct_and_found_again_by_uuid(nvml: Nvml) -> None:
    nvml.init()
    uuids = nvml.uuids()
    assert all(UUID.fullmatch(u) for u in uuids), uuids
    assert len(set(uuids)) == 8
    for i, u in enumerate(uuids):
        assert nvml.handle_by_uuid(u) == nvml.handle(i)


def test_uuids_are_the_same_after_a_restart_and_in_another_process(nvml: Nvml) -> None:
    nvml.init()
    first = nvml.uuids()
    nvml.shutdown()
    nvml.init()
    assert nvml.uuids() == first
    program = (
        "import ctypes, sys\n"
        "lib = ctypes.CDLL(sys.argv[1])\n"
        "assert lib.nvmlInit_v2() == 0\n"
        "for i in range(8):\n"
        "    h = ctypes.c_void_p(); assert lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h)) == 0\n"
        "    b = ctypes.create_string_buffer(80); assert lib.nvmlDeviceGetUUID(h, b, 80) == 0\n"
        "    print(b.value.decode())\n"
    )
    other = subprocess.run(
        [sys.executable, "-c", program, str(nvml.path)], capture_output=True, text=True, check=True, timeout=60
    )
    assert other.stdout.split() == first


def test_pci_addresses_are_nvidias_formats_on_distinct_buses(nvml: Nvml) -> None:
    nvml.init()
    for i in range(8):
        pci = nvml.pci(nvml.handle(i))
        bus = 0x07 + 0x10 * i
        assert (pci.domain, pci.bus, pci.device) == (0, bus, 0)
        assert pci.busId.decode() == f"00000000:{bus:02X}:00.0"
        assert pci.busIdLegacy.decode() == f"0000:{bus:02X}:00.0"
        assert pci.pciDeviceId == 0x20B010DE  # device 0x20B0 (A100-SXM4-40GB), vendor 0x10DE (NVIDIA)
        assert pci.pciSubSystemId == 0x134F10DE


def test_memory_is_40960_mib_all_free(nvml: Nvml) -> None:
    nvml.init()
    total = 40960 * 1024 * 1024
    memory = abi.Memory()
    nvml.check("nvmlDeviceGetMemoryInfo", nvml.handle(0), ctypes.byref(memory))
    assert (memory.total, memory.free, memory.used) == (total, total, 0)


def test_mig_is_supported_disabled_and_holds_no_mig_devices(nvml: Nvml) -> None:
    nvml.init()
    h = nvml.handle(2)
    current, pending = ctypes.c_uint(9), ctypes.c_uint(9)
    nvml.check("nvmlDeviceGetMigMode", h, ctypes.byref(current), ctypes.byref(pending))
    assert (current.value, pending.value) == (abi.MIG_DISABLE, abi.MIG_DISABLE)
    assert nvml.uint("nvmlDeviceGetMaxMigDeviceCount", h) == 0
    assert nvml.uint("nvmlDeviceIsMigDeviceHandle", h) == 0
    mig = ctypes.c_void_p()
    assert nvml.lib.nvmlDeviceGetMigDeviceHandleByIndex(h, 0, ctypes.byref(mig)) == abi.ERROR_NOT_FOUND
    info = ctypes.create_string_buffer(128)
    assert nvml.lib.nvmlDeviceGetGpuInstanceProfileInfo(h, 0, info) == abi.ERROR_NOT_SUPPORTED
    profiles = abi.GPU_INSTANCE_PROFILE_COUNT
    assert nvml.lib.nvmlDeviceGetGpuInstanceProfileInfo(h, profiles, info) == abi.ERROR_INVALID_ARGUMENT


def test_topology_pairs_share_a_switch_and_quads_a_socket_without_nvlink(nvml: Nvml) -> None:
    nvml.init()
    level = ctypes.c_int()

    def ancestor(a: int, b: int) -> int:
        nvml.check("nvmlDeviceGetTopologyCommonAncestor", nvml.handle(a), nvml.handle(b), ctypes.byref(level))
        return level.value

    assert ancestor(0, 1) == ancestor(7, 6) == abi.TOPOLOGY_SINGLE
    assert ancestor(0, 3) == ancestor(5, 6) == abi.TOPOLOGY_NODE
    assert ancestor(0, 4) == ancestor(3, 7) == abi.TOPOLOGY_SYSTEM
    h = nvml.handle(0)
    assert nvml.lib.nvmlDeviceGetTopologyCommonAncestor(h, h, ctypes.byref(level)) == abi.ERROR_INVALID_ARGUMENT
    state = ctypes.c_int()
    assert nvml.lib.nvmlDeviceGetNvLinkState(h, 0, ctypes.byref(state)) == abi.ERROR_NOT_SUPPORTED
    assert nvml.lib.nvmlDeviceGetNvLinkState(h, abi.NVLINK_MAX_LINKS, ctypes.byref(state)) == abi.ERROR_INVALID_ARGUMENT


def _device_calls(handle: int | None, outputs: bool = True) -> dict[str, tuple[object, ...]]:
    """Every per-device query of the mock, called on ``handle``; with ``outputs`` False, its outputs are NULL."""

    def out(value: ctypes._SimpleCData[int] | ctypes.Structure) -> object:
        return ctypes.byref(value) if outputs else None

    buf = ctypes.create_string_buffer(96) if outputs else None
    return {
        "nvmlDeviceGetName": (handle, buf, 96),
        "nvmlDeviceGetUUID": (handle, buf, 96),
        "nvmlDeviceGetIndex": (handle, out(ctypes.c_uint())),
        "nvmlDeviceGetMinorNumber": (handle, out(ctypes.c_uint())),
        "nvmlDeviceGetMemoryInfo": (handle, out(abi.Memory())),
        "nvmlDeviceGetPciInfo_v3": (handle, out(abi.PciInfo())),
        "nvmlDeviceGetBrand": (handle, out(ctypes.c_uint())),
        "nvmlDeviceGetArchitecture": (handle, out(ctypes.c_uint())),
        "nvmlDeviceGetCudaComputeCapability": (handle, out(ctypes.c_int()), out(ctypes.c_int())),
        "nvmlDeviceGetMigMode": (handle, out(ctypes.c_uint()), out(ctypes.c_uint())),
        "nvmlDeviceGetMaxMigDeviceCount": (handle, out(ctypes.c_uint())),
        "nvmlDeviceIsMigDeviceHandle": (handle, out(ctypes.c_uint())),
        "nvmlDeviceGetMigDeviceHandleByIndex": (handle, 0, out(ctypes.c_void_p())),
        "nvmlDeviceGetSupportedEventTypes": (handle, out(ctypes.c_ulonglong())),
        "nvmlDeviceGetNvLinkState": (handle, 0, out(ctypes.c_int())),
    }


@pytest.mark.parametrize("handle", [BOGUS_HANDLE, None], ids=["unknown", "null"])
def test_a_handle_the_mock_never_handed_out_is_an_invalid_argument(nvml: Nvml, handle: int | None) -> None:
    nvml.init()
    answers = {name: getattr(nvml.lib, name)(*args) for name, args in _device_calls(handle).items()}
    assert answers == dict.fromkeys(answers, abi.ERROR_INVALID_ARGUMENT)
    level = ctypes.c_int()
    good = nvml.handle(0)
    for pair in ((good, handle), (handle, good)):
        assert nvml.lib.nvmlDeviceGetTopologyCommonAncestor(*pair, ctypes.byref(level)) == abi.ERROR_INVALID_ARGUMENT
    event_set = nvml.event_set()
    assert nvml.lib.nvmlDeviceRegisterEvents(handle, abi.EVENT_XID_CRITICAL, event_set) == abi.ERROR_INVALID_ARGUMENT


def test_a_null_output_is_an_invalid_argument(nvml: Nvml) -> None:
    nvml.init()
    answers = {name: getattr(nvml.lib, name)(*args) for name, args in _device_calls(nvml.handle(0), False).items()}
    assert answers == dict.fromkeys(answers, abi.ERROR_INVALID_ARGUMENT)
    assert nvml.lib.nvmlDeviceGetCount_v2(None) == abi.ERROR_INVALID_ARGUMENT
    assert nvml.lib.nvmlDeviceGetHandleByIndex_v2(0, None) == abi.ERROR_INVALID_ARGUMENT
    assert nvml.lib.nvmlSystemGetDriverVersion(None, 80) == abi.ERROR_INVALID_ARGUMENT
    assert nvml.lib.nvmlSystemGetCudaDriverVersion(None) == abi.ERROR_INVALID_ARGUMENT


def test_lookups_of_gpus_that_do_not_exist(nvml: Nvml) -> None:
    nvml.init()
    h = ctypes.c_void_p()
    assert nvml.lib.nvmlDeviceGetHandleByIndex_v2(8, ctypes.byref(h)) == abi.ERROR_INVALID_ARGUMENT
    absent = b"GPU-00000000-0000-0000-0000-000000000000"
    assert nvml.lib.nvmlDeviceGetHandleByUUID(absent, ctypes.byref(h)) == abi.ERROR_NOT_FOUND
    assert nvml.lib.nvmlDeviceGetHandleByUUID(b"MIG-" + absent[4:], ctypes.byref(h)) == abi.ERROR_NOT_FOUND
    assert nvml.lib.nvmlDeviceGetHandleByUUID(b"0", ctypes.byref(h)) == abi.ERROR_INVALID_ARGUMENT
    assert nvml.lib.nvmlDeviceGetHandleByUUID(None, ctypes.byref(h)) == abi.ERROR_INVALID_ARGUMENT


def test_a_buffer_one_byte_short_is_insufficient_size(nvml: Nvml) -> None:
    nvml.init()
    h = nvml.handle(0)
    for call, text in (("nvmlDeviceGetName", nvml.name(h)), ("nvmlDeviceGetUUID", nvml.uuid(h))):
        fits = len(text) + 1
        buf = ctypes.create_string_buffer(fits)
        assert getattr(nvml.lib, call)(h, buf, fits - 1) == abi.ERROR_INSUFFICIENT_SIZE, call
        assert getattr(nvml.lib, call)(h, buf, fits) == abi.SUCCESS, call
        assert buf.value.decode() == text
    version = ctypes.create_string_buffer(80)
    assert nvml.lib.nvmlSystemGetDriverVersion(version, len("570.172.08")) == abi.ERROR_INSUFFICIENT_SIZE


def test_error_strings_are_nvidias_and_never_null(nvml: Nvml) -> None:
    assert nvml.lib.nvmlErrorString(abi.SUCCESS) == b"Success"
    assert nvml.lib.nvmlErrorString(abi.ERROR_UNINITIALIZED) == b"Uninitialized"
    assert nvml.lib.nvmlErrorString(abi.ERROR_INVALID_ARGUMENT) == b"Invalid Argument"
    assert nvml.lib.nvmlErrorString(abi.ERROR_NOT_SUPPORTED) == b"Not Supported"
    assert nvml.lib.nvmlErrorString(abi.ERROR_TIMEOUT) == b"Timeout"
    assert nvml.lib.nvmlErrorString(abi.ERROR_UNKNOWN) == b"Unknown Error"
    assert nvml.lib.nvmlErrorString(12345) == b"Unknown Error"
    assert all(nvml.lib.nvmlErrorString(code) for code in range(-1, 40))


def test_many_threads_initializing_querying_and_shutting_down_at_once(nvml: Nvml) -> None:
    # The device plugin calls NVML from several goroutines; a lost update of the reference count or
    # a torn read of the device table would show up as a wrong answer or a refused call here.
    nvml.init()  # held throughout, so no thread's shutdown tears the table down under another
    expected = nvml.uuids()
    failures: list[str] = []

    def worker() -> None:
        try:
            for _ in range(200):
                nvml.init()
                assert nvml.uuids() == expected
                nvml.shutdown()
        except (AssertionError, NvmlError) as e:
            failures.append(repr(e))

    threads = [threading.Thread(target=worker, name=f"nvml-worker-{i}") for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert failures == []
    nvml.shutdown()
    assert nvml.lib.nvmlShutdown() == abi.ERROR_UNINITIALIZED  # every init was matched exactly
