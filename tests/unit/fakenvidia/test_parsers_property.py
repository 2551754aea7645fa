"""Property tests of the mock NVML's two parsers of outside input: the config file and the event files.

Any bytes give an answer NVML defines (a GPU table, a refused init, an event or a timeout), never a
crash or a half-applied config; and every config ``FakeGpus`` writes, the mock reads back exactly.
"""

from __future__ import annotations

import ctypes
import string
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fakenvidia import health
from fakenvidia.build import build_mock_nvml
from fakenvidia.gpus import MAX_GPUS, FakeGpus
from tests.unit.fakenvidia import nvml as abi
from tests.unit.fakenvidia.conftest import CONFIG_ENV, EVENTS_ENV
from tests.unit.fakenvidia.nvml import Nvml

KEYS = ["count", "name", "name.0", "name.15", "name.16", "memory_mib", "driver_version", "cuda_driver_version"]
KEYS += ["uuid_seed", "events_dir", "colour", "", "#count"]
lines = st.one_of(
    st.builds(
        "{} {} {}".format,
        st.sampled_from(KEYS),
        st.sampled_from(["=", "==", ":", ""]),
        st.text(string.printable, max_size=40),
    ),
    st.text(max_size=60),
)
config_texts = st.one_of(st.lists(lines, max_size=8).map("\n".join), st.binary(max_size=300).map(repr))
printable = st.text(string.ascii_letters + string.digits + " -_.()", min_size=1, max_size=40).map(str.strip)


@pytest.fixture(scope="module")
def lib() -> Nvml:
    return Nvml(build_mock_nvml())


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("parsers")


@given(text=config_texts)
def test_any_config_text_gives_a_gpu_table_or_a_refused_init(lib: Nvml, scratch: Path, text: str) -> None:
    path = scratch / "any.conf"
    path.write_text(text, errors="surrogateescape")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(CONFIG_ENV, str(path))
        mp.delenv(EVENTS_ENV, raising=False)
        lib.reset()
        code = lib.lib.nvmlInit_v2()
        try:
            assert code in (abi.SUCCESS, abi.ERROR_UNKNOWN)
            if code == abi.SUCCESS:
                assert 1 <= lib.count() <= MAX_GPUS
                for i in range(lib.count()):
                    name = lib.name(lib.handle(i))
                    assert name and name.isprintable() and name.isascii()
            else:
                assert lib.lib.nvmlShutdown() == abi.ERROR_UNINITIALIZED
        finally:
            lib.reset()


@st.composite
def fake_gpus(draw: st.DrawFn) -> FakeGpus:
    count = draw(st.integers(1, MAX_GPUS))
    return FakeGpus(
        count=count,
        name=draw(printable.filter(bool)),
        names=draw(st.dictionaries(st.integers(0, count - 1), printable.filter(bool), max_size=3)),
        memory_mib=draw(st.integers(1, 1 << 24)),
        driver_version=draw(st.from_regex(r"[0-9]{1,3}(\.[0-9]{1,3}){1,2}", fullmatch=True)),
        uuid_seed=draw(printable.filter(bool)),
    )


@given(gpus=fake_gpus())
def test_every_config_fake_gpus_writes_the_mock_reads_back(lib: Nvml, scratch: Path, gpus: FakeGpus) -> None:
    count = gpus.count
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(CONFIG_ENV, str(gpus.write(scratch / "fake.conf")))
        lib.reset()
        lib.init()
        try:
            assert lib.count() == count
            assert [lib.name(lib.handle(i)) for i in range(count)] == [gpus.name_of(i) for i in range(count)]
            assert lib.driver_version() == gpus.driver_version
            memory = abi.Memory()
            lib.check("nvmlDeviceGetMemoryInfo", lib.handle(count - 1), ctypes.byref(memory))
            assert memory.total == gpus.memory_mib << 20
        finally:
            lib.reset()


@given(body=st.one_of(st.binary(max_size=700), st.lists(lines, max_size=5).map(lambda ls: "\n".join(ls).encode())))
def test_any_event_file_is_delivered_or_set_aside_never_left_to_spin(lib: Nvml, scratch: Path, body: bytes) -> None:
    events = scratch / "events"
    events.mkdir(exist_ok=True)
    for old in events.iterdir():
        old.unlink()
    event = events / "any.event"
    event.write_bytes(body)
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv(CONFIG_ENV, raising=False)
        mp.setenv(EVENTS_ENV, str(events))
        lib.reset()
        lib.init()
        try:
            event_set = lib.event_set()
            for i in range(lib.count()):
                lib.register(lib.handle(i), event_set)
            code, data = lib.wait(event_set, 0)
            if code == abi.SUCCESS:
                assert health.delivered_path(event).exists()
                assert data.eventType == abi.EVENT_XID_CRITICAL
                assert lib.uint("nvmlDeviceGetIndex", data.device) < lib.count()
            else:
                assert code == abi.ERROR_TIMEOUT
                assert health.invalid_path(event).exists()  # every GPU is watched: only a bad file stays
        finally:
            lib.reset()
