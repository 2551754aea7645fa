"""The mock NVML reports the GPUs its config file names, finds that file where the callers need it, and
refuses a file it does not understand rather than guessing."""

from __future__ import annotations

import ctypes
import shutil
from pathlib import Path

import pytest

from fakenvidia.errors import FakeNvidiaError
from fakenvidia.gpus import FakeGpus
from tests.unit.fakenvidia import nvml as abi
from tests.unit.fakenvidia.conftest import CONFIG_ENV, EVENTS_ENV
from tests.unit.fakenvidia.nvml import Nvml


def test_count_names_memory_and_versions_come_from_the_config(
    nvml: Nvml, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gpus = FakeGpus(
        count=3,
        name="NVIDIA H100 80GB HBM3",
        names={1: "NVIDIA A100-SXM4-80GB"},
        memory_mib=81559,
        driver_version="580.65.06",
        cuda_driver_version=13000,
    )
    monkeypatch.setenv(CONFIG_ENV, str(gpus.write(tmp_path / "mock.conf")))
    nvml.init()
    assert nvml.count() == 3
    assert [nvml.name(nvml.handle(i)) for i in range(3)] == [gpus.name_of(i) for i in range(3)]
    assert nvml.driver_version() == "580.65.06"
    memory = abi.Memory()
    nvml.check("nvmlDeviceGetMemoryInfo", nvml.handle(2), ctypes.byref(memory))
    assert memory.total == 81559 * 1024 * 1024


def test_the_uuid_seed_gives_each_node_its_own_uuids(
    nvml: Nvml, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nvml.init()
    default = nvml.uuids()
    nvml.shutdown()
    monkeypatch.setenv(CONFIG_ENV, str(FakeGpus(uuid_seed="node-b").write(tmp_path / "b.conf")))
    nvml.init()
    other = nvml.uuids()
    assert not set(default) & set(other)


def test_a_config_next_to_the_library_is_read_when_the_environment_names_none(
    nvml_library: Path, tmp_path: Path
) -> None:
    # The device plugin and the container runtime are started by kubelet and containerd, whose
    # environments a test does not set; what they share is the library they load.
    copy = tmp_path / "libnvidia-ml.so.1"  # its own path and inode: a separate copy of the mock
    shutil.copyfile(nvml_library, copy)
    FakeGpus(count=2, events_dir="events").write(tmp_path / "gpushare-mock-nvml.conf")
    lib = Nvml(copy)
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv(CONFIG_ENV, raising=False)
        mp.delenv(EVENTS_ENV, raising=False)
        lib.init()
        try:
            assert lib.count() == 2
        finally:
            lib.reset()
        # The environment wins over the file next to the library.
        mp.setenv(CONFIG_ENV, str(FakeGpus(count=5).write(tmp_path / "env.conf")))
        lib.init()
        try:
            assert lib.count() == 5
        finally:
            lib.reset()


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("count = 0\n", "count must be a whole number from 1 to 16"),
        ("count = 17\n", "count must be a whole number from 1 to 16"),
        ("count = -1\n", "count must be"),
        ("count = 8 GPUs\n", "count must be"),
        ("count = 0x8\n", "count must be"),
        ("count 8\n", "expected key = value"),
        ("colour = green\n", "unknown key 'colour'"),
        ("name = \n", "name must be 1 to 95 printable ASCII characters"),
        ("name = " + "x" * 96 + "\n", "name must be 1 to 95"),
        ("name.16 = X\n", "'name.16' names no GPU index from 0 to 15"),
        ("name.x = X\n", "names no GPU index"),
        ("memory_mib = 0\n", "memory_mib must be"),
        ("driver_version = 570.172.08-beta\n", "driver_version must be digits and dots"),
        ("driver_version = ../../etc\n", "driver_version must be digits and dots"),
        ("cuda_driver_version = 12.8\n", "cuda_driver_version must be NVML's number"),
        ("uuid_seed = " + "s" * 64 + "\n", "uuid_seed must be 1 to 63"),
        ("events_dir = /" + "e" * 5000 + "\n", "events_dir must be a path shorter than"),
        ("# fine\ncount = 2\n\nbogus\n", ":4: expected key = value"),
    ],
)
def test_a_config_it_does_not_understand_fails_init_and_says_why(
    text: str,
    complaint: str,
    *,
    nvml: Nvml,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "bad.conf"
    path.write_text(text)
    monkeypatch.setenv(CONFIG_ENV, str(path))
    assert nvml.lib.nvmlInit_v2() == abi.ERROR_UNKNOWN
    err = capfd.readouterr().err
    assert "gpushare mock NVML: nvmlInit_v2 failed" in err
    assert complaint in err
    assert str(path) in err
    assert nvml.lib.nvmlShutdown() == abi.ERROR_UNINITIALIZED  # a failed init counts for nothing


def test_a_config_file_that_is_not_there_or_not_text_fails_init(
    nvml: Nvml, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(CONFIG_ENV, str(tmp_path / "missing.conf"))
    assert nvml.lib.nvmlInit_v2() == abi.ERROR_UNKNOWN
    assert "which does not exist" in capfd.readouterr().err
    binary = tmp_path / "binary.conf"
    binary.write_bytes(b"count = 2\n\0")
    monkeypatch.setenv(CONFIG_ENV, str(binary))
    assert nvml.lib.nvmlInit_v2() == abi.ERROR_UNKNOWN
    assert "is not a text file" in capfd.readouterr().err
    huge = tmp_path / "huge.conf"
    huge.write_text("# padding\n" * 2000)
    monkeypatch.setenv(CONFIG_ENV, str(huge))
    assert nvml.lib.nvmlInit_v2() == abi.ERROR_UNKNOWN
    assert "is larger than 16384 bytes" in capfd.readouterr().err


def test_blanks_comments_and_crlf_are_tolerated_and_later_lines_win(
    nvml: Nvml, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "ok.conf"
    path.write_text("# comment\r\n\r\n  count\t=  4  \r\nname = First\r\nname = Second Name\r\nname.3=Third=3\r\n")
    monkeypatch.setenv(CONFIG_ENV, str(path))
    nvml.init()
    assert [nvml.name(nvml.handle(i)) for i in range(nvml.count())] == ["Second Name"] * 3 + ["Third=3"]


def test_the_events_variable_must_be_an_absolute_path(
    nvml: Nvml, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(EVENTS_ENV, "relative/events")
    assert nvml.lib.nvmlInit_v2() == abi.ERROR_UNKNOWN
    assert f"{EVENTS_ENV} must be an absolute path" in capfd.readouterr().err


def test_fake_gpus_refuses_what_the_mock_would_refuse_and_lists_every_problem() -> None:
    with pytest.raises(FakeNvidiaError) as refused:
        FakeGpus(count=17, name=" padded", names={20: "X"}, driver_version="r570", uuid_seed="")
    message = str(refused.value)
    for key in ("count:", "name:", "names: GPU 20", "driver_version:", "uuid_seed:"):
        assert key in message
