"""An XID fired through the events directory reaches, once, a waiter that registered that GPU, as the device
plugin's health check waits for it; with nothing fired the wait times out."""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fakenvidia import health
from fakenvidia.errors import FakeNvidiaError
from tests.unit.fakenvidia import nvml as abi
from tests.unit.fakenvidia.conftest import EVENTS_ENV
from tests.unit.fakenvidia.nvml import Nvml

# The mask the device plugin registers (k8s-device-plugin internal/rm/health.go), as it ANDs it
# with what nvmlDeviceGetSupportedEventTypes reports.
PLUGIN_MASK = abi.EVENT_XID_CRITICAL | abi.EVENT_DOUBLE_BIT_ECC | abi.EVENT_SINGLE_BIT_ECC


@pytest.fixture
def events(nvml: Nvml, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An events directory the mock watches, with the mock initialized."""
    directory = tmp_path / "events"
    monkeypatch.setenv(EVENTS_ENV, str(directory))
    nvml.init()
    yield directory


def _watch_all(nvml: Nvml) -> int:
    """An event set registered as the device plugin registers every GPU it serves."""
    event_set = nvml.event_set()
    for i in range(nvml.count()):
        h = nvml.handle(i)
        supported = ctypes.c_ulonglong()
        nvml.check("nvmlDeviceGetSupportedEventTypes", h, ctypes.byref(supported))
        nvml.register(h, event_set, PLUGIN_MASK & supported.value)
    return event_set


def test_supported_events_cover_what_the_device_plugin_registers(nvml: Nvml) -> None:
    nvml.init()
    supported = ctypes.c_ulonglong()
    nvml.check("nvmlDeviceGetSupportedEventTypes", nvml.handle(0), ctypes.byref(supported))
    assert supported.value & PLUGIN_MASK == PLUGIN_MASK


def test_with_nothing_fired_the_wait_times_out_after_its_timeout(nvml: Nvml, events: Path) -> None:
    event_set = _watch_all(nvml)
    started = time.monotonic()
    code, _ = nvml.wait(event_set, 300)
    elapsed = time.monotonic() - started
    assert code == abi.ERROR_TIMEOUT
    assert 0.3 <= elapsed < 2.0


def test_without_an_events_directory_the_wait_still_times_out(nvml: Nvml) -> None:
    nvml.init()
    event_set = _watch_all(nvml)
    code, _ = nvml.wait(event_set, 50)
    assert code == abi.ERROR_TIMEOUT


def test_xid_79_on_gpu_3_reaches_the_waiter_as_nvml_reports_one(nvml: Nvml, events: Path) -> None:
    event_set = _watch_all(nvml)
    fired = health.fire_xid(events, 3, 79)
    code, data = nvml.wait(event_set, 5000)
    assert code == abi.SUCCESS
    assert data.device == nvml.handle(3)
    assert nvml.uuid(data.device) == nvml.uuid(nvml.handle(3))  # what the plugin does with it
    assert data.eventType == abi.EVENT_XID_CRITICAL
    assert data.eventData == 79
    assert (data.gpuInstanceId, data.computeInstanceId) == (abi.NO_MIG_INSTANCE, abi.NO_MIG_INSTANCE)
    assert health.wait_delivered(fired, 0)
    assert not fired.exists()
    code, _ = nvml.wait(event_set, 50)
    assert code == abi.ERROR_TIMEOUT  # delivered once, not again


def test_an_xid_fired_during_a_wait_ends_it_early(nvml: Nvml, events: Path) -> None:
    event_set = _watch_all(nvml)
    uuid = nvml.uuid(nvml.handle(5))
    timer = threading.Timer(0.2, health.fire_xid, args=(events, uuid, 48))
    timer.start()
    try:
        started = time.monotonic()
        code, data = nvml.wait(event_set, 10_000)
        elapsed = time.monotonic() - started
    finally:
        timer.join(timeout=5)
    assert code == abi.SUCCESS
    assert (data.device, data.eventData) == (nvml.handle(5), 48)
    assert 0.2 <= elapsed < 3.0


def test_events_arrive_in_the_order_they_were_fired(nvml: Nvml, events: Path) -> None:
    event_set = _watch_all(nvml)
    for gpu, xid in ((1, 31), (2, 79), (1, 94)):
        health.fire_xid(events, gpu, xid)
    got = []
    for _ in range(3):
        code, data = nvml.wait(event_set, 1000)
        assert code == abi.SUCCESS
        got.append((nvml.uint("nvmlDeviceGetIndex", data.device), data.eventData))
    assert got == [(1, 31), (2, 79), (1, 94)]


def test_an_event_waits_for_a_set_that_registered_its_gpu(nvml: Nvml, events: Path) -> None:
    event_set = nvml.event_set()
    nvml.register(nvml.handle(0), event_set)
    nvml.register(nvml.handle(6), event_set, abi.EVENT_DOUBLE_BIT_ECC)  # GPU 6, but not for XIDs
    fired = health.fire_xid(events, 6, 79)
    code, _ = nvml.wait(event_set, 100)
    assert code == abi.ERROR_TIMEOUT
    assert fired.exists()  # still there for whoever watches GPU 6
    nvml.register(nvml.handle(6), event_set)
    code, data = nvml.wait(event_set, 1000)
    assert (code, data.device) == (abi.SUCCESS, nvml.handle(6))


def test_of_two_sets_watching_one_gpu_exactly_one_gets_the_event(nvml: Nvml, events: Path) -> None:
    sets = [_watch_all(nvml), _watch_all(nvml)]
    health.fire_xid(events, 0, 79)
    results: list[int] = []

    def wait(event_set: int) -> None:
        results.append(nvml.wait(event_set, 500)[0])

    threads = [threading.Thread(target=wait, args=(s,), name="nvml-waiter") for s in sets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert sorted(results) == [abi.SUCCESS, abi.ERROR_TIMEOUT]


def test_a_file_it_cannot_use_is_set_aside_as_invalid_and_reported(
    nvml: Nvml, events: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    event_set = _watch_all(nvml)
    events.mkdir()
    bad = {
        "a.event": "gpu = 3\n",  # no xid
        "b.event": "gpu = 8\nxid = 79\n",  # no GPU 8
        "c.event": "uuid = GPU-00000000-0000-0000-0000-000000000000\nxid = 79\n",
        "d.event": "gpu = 1\nxid = 79\ncolour = red\n",
        "e.event": "gpu = 1\nxid = -79\n",
        "f.event": "gpu = 1\ngpu = 2\nxid = 79\n",
        "g.event": "x" * 600,
    }
    for name, text in bad.items():
        (events / name).write_text(text)
    (events / ".hidden.event").write_text("gpu = 1\nxid = 79\n")  # half-written: the mock skips it
    code, _ = nvml.wait(event_set, 100)
    assert code == abi.ERROR_TIMEOUT
    assert sorted(p.name for p in events.iterdir()) == sorted([".hidden.event", *(f"{n}.invalid" for n in bad)])
    err = capfd.readouterr().err
    assert err.count("gpushare mock NVML: ignoring event file") == len(bad)
    assert "it names no GPU of this mock" in err


def test_register_refuses_event_types_the_gpu_does_not_support(nvml: Nvml) -> None:
    nvml.init()
    event_set = nvml.event_set()
    h = nvml.handle(0)
    code = nvml.lib.nvmlDeviceRegisterEvents(h, abi.EVENT_XID_CRITICAL | abi.EVENT_POWER_SOURCE_CHANGE, event_set)
    assert code == abi.ERROR_NOT_SUPPORTED
    assert nvml.lib.nvmlDeviceRegisterEvents(h, abi.EVENT_XID_CRITICAL, 0x1234) == abi.ERROR_INVALID_ARGUMENT


def test_a_freed_set_is_no_set(nvml: Nvml) -> None:
    nvml.init()
    event_set = _watch_all(nvml)
    nvml.check("nvmlEventSetFree", event_set)
    assert nvml.lib.nvmlEventSetFree(event_set) == abi.ERROR_INVALID_ARGUMENT
    assert nvml.wait(event_set, 10)[0] == abi.ERROR_INVALID_ARGUMENT
    assert nvml.lib.nvmlEventSetWait_v2(_watch_all(nvml), None, 10) == abi.ERROR_INVALID_ARGUMENT


def test_the_last_shutdown_ends_a_wait_and_frees_every_set(nvml: Nvml, events: Path) -> None:
    event_set = _watch_all(nvml)
    timer = threading.Timer(0.1, nvml.shutdown)
    timer.start()
    try:
        code, _ = nvml.wait(event_set, 5000)
    finally:
        timer.join(timeout=5)
    assert code == abi.ERROR_UNINITIALIZED
    nvml.init()
    assert nvml.lib.nvmlEventSetFree(event_set) == abi.ERROR_INVALID_ARGUMENT


def test_sets_are_bounded_and_come_back_when_freed(nvml: Nvml) -> None:
    nvml.init()
    sets = []
    handle = ctypes.c_void_p()
    while nvml.lib.nvmlEventSetCreate(ctypes.byref(handle)) == abi.SUCCESS:
        sets.append(handle.value)
        assert len(sets) <= 64
    assert len(sets) == 64
    assert nvml.lib.nvmlEventSetCreate(ctypes.byref(handle)) == abi.ERROR_MEMORY
    nvml.check("nvmlEventSetFree", sets[10])
    assert nvml.lib.nvmlEventSetCreate(ctypes.byref(handle)) == abi.SUCCESS


def test_the_events_dir_of_the_config_is_relative_to_the_config_file(
    nvml: Nvml, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "conf").mkdir()
    config = tmp_path / "conf" / "mock.conf"
    config.write_text("events_dir = ../events\n")
    monkeypatch.setenv("GPUSHARE_MOCK_NVML_CONFIG", str(config))
    nvml.init()
    event_set = _watch_all(nvml)
    health.fire_xid(tmp_path / "events", 7, 79)
    code, data = nvml.wait(event_set, 2000)
    assert (code, data.device, data.eventData) == (abi.SUCCESS, nvml.handle(7), 79)


def test_fire_xid_refuses_what_names_no_gpu_or_no_xid(tmp_path: Path) -> None:
    for gpu, xid in ((-1, 79), ("3", 79), ("GPU-x\n", 79), (3, -1), (3, 2**32)):
        with pytest.raises(FakeNvidiaError):
            health.fire_xid(tmp_path, gpu, xid)
    assert not any(tmp_path.iterdir())
