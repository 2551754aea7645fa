"""A fake driver root has what an NVIDIA node exposes, in the shape NVIDIA's tools look for it: device nodes
with NVIDIA's numbers, libraries with their real sonames found through the root's own ld cache, and the
mock NVML answering for the GPUs whose nodes are there."""

from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

from fakenvidia import driver_root, health
from fakenvidia.driver_root import DRIVER_LIBRARIES, DRIVER_TOOLS, DriverRoot, build_driver_root
from fakenvidia.errors import FakeNvidiaError
from fakenvidia.gpus import FakeGpus
from tests.unit.fakenvidia import nvml as abi
from tests.unit.fakenvidia.conftest import CONFIG_ENV, EVENTS_ENV
from tests.unit.fakenvidia.nvml import Nvml

VERSION = "570.172.08"
GPUS = 4


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> DriverRoot:
    return build_driver_root(tmp_path_factory.mktemp("driver") / "root", FakeGpus(count=GPUS, uuid_seed="root-test"))


def _soname(path: Path) -> str:
    out = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True, timeout=30).stdout
    found = re.findall(r"Library soname: \[([^\]]+)\]", out)
    assert len(found) == 1, out
    return found[0]


def test_gpu_and_control_nodes_are_char_devices_with_nvidias_numbers(root: DriverRoot) -> None:
    expected = {f"nvidia{i}": (195, i) for i in range(GPUS)}
    expected |= {"nvidiactl": (195, 255), "nvidia-modeset": (195, 254)}
    expected |= {"nvidia-uvm": (root.uvm_major, 0), "nvidia-uvm-tools": (root.uvm_major, 1)}
    found = {}
    for node in root.dev_dir.iterdir():
        st = node.lstat()
        assert stat.S_ISCHR(st.st_mode), node
        assert stat.S_IMODE(st.st_mode) == 0o666, node
        found[node.name] = (os.major(st.st_rdev), os.minor(st.st_rdev))
    assert found == expected


def test_nvidia_uvm_takes_the_hosts_major_or_a_stand_in_no_driver_holds(root: DriverRoot) -> None:
    host = driver_root.char_majors(Path("/proc/devices").read_text())
    uvm = [major for major, names in host.items() if "nvidia-uvm" in names]
    assert root.uvm_major == (uvm[0] if uvm else driver_root.UVM_STAND_IN_MAJOR)
    assert uvm or root.uvm_major not in host


@pytest.mark.parametrize(
    ("proc_devices", "expected"),
    [
        ("Character devices:\n  1 mem\n195 nvidia-frontend\n237 nvidia-uvm\n\nBlock devices:\n  8 sd\n", 237),
        ("Character devices:\n  1 mem\n\nBlock devices:\n510 nvidia-uvm\n", 510),  # a block major is not it
        ("Character devices:\n  1 mem\n", 510),
        ("", 510),
    ],
)
def test_the_uvm_major_read_from_proc_devices(proc_devices: str, expected: int) -> None:
    assert driver_root.uvm_major_for(proc_devices) == expected


def test_a_stand_in_major_held_by_another_driver_is_refused() -> None:
    with pytest.raises(FakeNvidiaError, match="held here by some-driver"):
        driver_root.uvm_major_for("Character devices:\n510 some-driver\n")


def test_each_library_is_a_versioned_elf_object_whose_soname_link_names_it(root: DriverRoot) -> None:
    assert root.lib_dir.parent == root.path / "usr" / "lib"
    for library in DRIVER_LIBRARIES:
        soname = library.soname(VERSION)
        real = root.lib_dir / library.file_name(VERSION)
        assert real.is_file() and not real.is_symlink(), real
        assert real.read_bytes()[:4] == b"\x7fELF"
        assert _soname(real) == soname
        link = root.lib_dir / soname
        assert link.resolve() == real
        if link != real:
            assert link.is_symlink() and os.readlink(link) == real.name  # relative, as ldconfig makes it


def test_the_roots_ld_cache_finds_every_library_at_its_path_inside_the_root(root: DriverRoot) -> None:
    out = subprocess.run(
        ["ldconfig", "-p", "-C", str(root.ld_cache)], capture_output=True, text=True, check=True, timeout=30
    ).stdout
    entries = dict(re.findall(r"^\s+(\S+) \([^)]*\) => (\S+)$", out, re.MULTILINE))
    inside = f"/usr/lib/{root.lib_dir.name}"
    assert entries == {lib.soname(VERSION): f"{inside}/{lib.soname(VERSION)}" for lib in DRIVER_LIBRARIES}


def test_the_mock_in_the_root_reports_the_roots_gpus_with_no_environment(
    root: DriverRoot, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What the device plugin and the toolkit do: load <root>/usr/lib/<triplet>/libnvidia-ml.so.1.
    monkeypatch.delenv(CONFIG_ENV, raising=False)
    monkeypatch.delenv(EVENTS_ENV, raising=False)
    lib = Nvml(root.nvml_library)
    lib.init()
    try:
        assert lib.count() == GPUS
        assert lib.driver_version() == VERSION  # the suffix of every library in the root
        for i in range(GPUS):
            minor = lib.uint("nvmlDeviceGetMinorNumber", lib.handle(i))
            assert (root.dev_dir / f"nvidia{minor}").is_char_device()
        event_set = lib.event_set()
        lib.register(lib.handle(3), event_set)
        fired = health.fire_xid(root.events_dir, 3, 79)
        code, data = lib.wait(event_set, 5000)
        assert (code, data.device, data.eventData) == (abi.SUCCESS, lib.handle(3), 79)
        assert health.wait_delivered(fired, 0)
    finally:
        lib.reset()


def test_the_driver_tools_are_executables_that_admit_they_are_stand_ins(root: DriverRoot) -> None:
    for name in DRIVER_TOOLS:
        tool = root.path / "usr" / "bin" / name
        assert tool.stat().st_mode & 0o111, tool
        done = subprocess.run([str(tool)], capture_output=True, text=True, check=False, timeout=30)
        assert done.returncode == 1
        assert f"{name}: gpushare fake NVIDIA driver" in done.stderr


def test_firmware_and_the_persistenced_socket_are_where_the_toolkit_looks(root: DriverRoot) -> None:
    firmware = root.path / "lib" / "firmware" / "nvidia" / VERSION
    assert sorted(p.name for p in firmware.glob("gsp*.bin")) == ["gsp_ga10x.bin", "gsp_tu10x.bin"]
    assert stat.S_ISSOCK((root.path / "run" / "nvidia-persistenced" / "socket").lstat().st_mode)


def test_a_root_is_made_fresh_never_over_something_else(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("someone's file")
    with pytest.raises(FakeNvidiaError, match="not an empty directory"):
        build_driver_root(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]
