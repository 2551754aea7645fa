"""A fake NVIDIA driver root: a private directory shaped like what an NVIDIA node exposes under /.

NVIDIA's tools take a driver root (``nvidia-ctk cdi generate --driver-root``, the device plugin's
``--container-driver-root``, the runtime's ``nvidia-container-cli.root``) and find everything under
it the way they would on a node, so a directory with the right shape lets them run unchanged:

    dev/nvidia0..N-1              char 195:<index>   one per GPU (NVML minor number = index)
    dev/nvidiactl                 char 195:255
    dev/nvidia-modeset            char 195:254
    dev/nvidia-uvm                char <uvm>:0       <uvm>: the host's nvidia-uvm major from
    dev/nvidia-uvm-tools          char <uvm>:1       /proc/devices, else the stand-in 510
    usr/lib/<triplet>/lib*.so.<driver version>       the mock NVML and stub libraries, each
    usr/lib/<triplet>/<soname> -> lib*.so.<version>  with its soname link, as ldconfig makes
    usr/lib/<triplet>/gpushare-mock-nvml.conf        the mock's GPUs (fakenvidia/gpus.py)
    usr/bin/nvidia-smi ...        stub tools         (the toolkit mounts them; nothing runs them)
    lib/firmware/nvidia/<version>/gsp_*.bin          placeholders for the GSP firmware
    run/nvidia-persistenced/socket                   a socket inode, as persistenced leaves
    run/gpushare-mock-nvml/events/                   where fakenvidia.health fires XIDs
    etc/ld.so.conf, etc/ld.so.cache                  the cache ``ldconfig -r <root>`` writes

The toolkit takes the driver version from NVML and finds the driver's libraries as every
``*.so.<version>`` in the root's ld cache, so the cache and the version suffixes are what make its
CDI spec list them. The device nodes are real char devices with NVIDIA's numbers in a private
directory; no driver is behind those numbers on this machine (nvidia-uvm's stand-in major is
checked free), so opening one fails with ENXIO and never reaches other hardware.

Making device nodes needs root (CAP_MKNOD); the tests run as root.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import stat
import subprocess
from pathlib import Path
from typing import NamedTuple

from fakenvidia.build import NVML_SONAME, build_mock_nvml, build_stub_library, build_stub_tool, multiarch
from fakenvidia.errors import FakeNvidiaError
from fakenvidia.gpus import DEFAULT_DRIVER_VERSION, FakeGpus

# NVIDIA's character device numbers (the toolkit's internal/info/proc/devices and pkg/system/nvdevices).
NVIDIA_MAJOR = 195
NVIDIACTL_MINOR = 255
NVIDIA_MODESET_MINOR = 254
NVIDIA_UVM_MINOR = 0
NVIDIA_UVM_TOOLS_MINOR = 1
# nvidia-uvm's major is allocated by the kernel when the module loads; 510 is one it commonly gets.
# Used only when the host has no nvidia-uvm, and only if no other driver holds it here.
UVM_STAND_IN_MAJOR = 510

EVENTS_DIR = Path("run/gpushare-mock-nvml/events")
MOCK_CONFIG_NAME = "gpushare-mock-nvml.conf"  # the name the mock looks for next to itself (config.c)
DEVICE_MODE = 0o666  # what the driver's nvidia-modprobe gives every NVIDIA node


class DriverLibrary(NamedTuple):
    """One library of the driver: its name up to ``.so`` and its soname's version, if not the driver's."""

    stem: str
    soname_version: str | None  # None: the soname carries the full driver version

    def soname(self, driver_version: str) -> str:
        return f"{self.stem}.so.{self.soname_version or driver_version}"

    def file_name(self, driver_version: str) -> str:
        return f"{self.stem}.so.{driver_version}"


# The utility, compute and video libraries a data-centre driver installs (the toolkit's CDI spec
# takes every *.so.<version> it finds; libnvidia-container lists the same families by name).
# The first is the mock NVML; every other one is a stub.
DRIVER_LIBRARIES = (
    DriverLibrary("libnvidia-ml", "1"),
    DriverLibrary("libnvidia-cfg", "1"),
    DriverLibrary("libcuda", "1"),
    DriverLibrary("libcudadebugger", "1"),
    DriverLibrary("libnvidia-ptxjitcompiler", "1"),
    DriverLibrary("libnvidia-nvvm", "4"),
    DriverLibrary("libnvidia-gpucomp", None),
    DriverLibrary("libnvidia-opencl", "1"),
    DriverLibrary("libnvidia-allocator", "1"),
    DriverLibrary("libnvidia-encode", "1"),
    DriverLibrary("libnvcuvid", "1"),
    DriverLibrary("libnvidia-opticalflow", "1"),
)

# The tools the toolkit looks for on the driver root (its pkg/nvcdi/driver-nvml.go).
DRIVER_TOOLS = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
)
# What an R570 driver ships in lib/firmware/nvidia/<version>/.
GSP_FIRMWARE = ("gsp_ga10x.bin", "gsp_tu10x.bin")


@dataclasses.dataclass(frozen=True)
class DriverRoot:
    """A built fake driver root and where its parts are."""

    path: Path
    gpus: FakeGpus
    lib_dir: Path
    uvm_major: int

    @property
    def dev_dir(self) -> Path:
        return self.path / "dev"

    @property
    def nvml_library(self) -> Path:
        """The soname link the callers load: ``<root>/usr/lib/<triplet>/libnvidia-ml.so.1``."""
        return self.lib_dir / NVML_SONAME

    @property
    def mock_config(self) -> Path:
        return self.lib_dir / MOCK_CONFIG_NAME

    @property
    def events_dir(self) -> Path:
        return self.path / EVENTS_DIR

    @property
    def ld_cache(self) -> Path:
        return self.path / "etc" / "ld.so.cache"

    def device_nodes(self) -> dict[str, tuple[int, int]]:
        """Each device node's name under dev/ and its (major, minor)."""
        return device_numbers(self.gpus.count, self.uvm_major)


def device_numbers(gpu_count: int, uvm_major: int) -> dict[str, tuple[int, int]]:
    nodes = {f"nvidia{i}": (NVIDIA_MAJOR, i) for i in range(gpu_count)}
    nodes["nvidiactl"] = (NVIDIA_MAJOR, NVIDIACTL_MINOR)
    nodes["nvidia-modeset"] = (NVIDIA_MAJOR, NVIDIA_MODESET_MINOR)
    nodes["nvidia-uvm"] = (uvm_major, NVIDIA_UVM_MINOR)
    nodes["nvidia-uvm-tools"] = (uvm_major, NVIDIA_UVM_TOOLS_MINOR)
    return nodes


def char_majors(proc_devices: str) -> dict[int, list[str]]:
    """The character device majors of a /proc/devices text, and the drivers holding each."""
    majors: dict[int, list[str]] = {}
    in_char = False
    for line in proc_devices.splitlines():
        header = line.strip().lower()
        if header.endswith("devices:"):
            in_char = header.startswith("character")
            continue
        number, _, name = line.strip().partition(" ")
        if in_char and number.isdigit() and name.strip():
            majors.setdefault(int(number), []).append(name.strip())
    return majors


def uvm_major_for(proc_devices: str) -> int:
    """nvidia-uvm's major on this host, else the stand-in, refused if another driver holds it."""
    majors = char_majors(proc_devices)
    for major, names in sorted(majors.items()):
        if "nvidia-uvm" in names:
            return major
    holders = majors.get(UVM_STAND_IN_MAJOR)
    if holders:
        raise FakeNvidiaError(
            f"fakenvidia: the stand-in major {UVM_STAND_IN_MAJOR} for nvidia-uvm is held here by "
            f"{', '.join(holders)}; a fake nvidia-uvm node would reach that driver"
        )
    return UVM_STAND_IN_MAJOR


def build_all(driver_version: str = DEFAULT_DRIVER_VERSION, out: Path | None = None) -> list[Path]:
    """Every artifact a driver root of ``driver_version`` needs, built (or found built) under ``out``."""
    libraries = [build_stub_library(lib.soname(driver_version), out) for lib in DRIVER_LIBRARIES[1:]]
    return [build_mock_nvml(out), build_stub_tool(out), *libraries]


def build_driver_root(root: Path, gpus: FakeGpus | None = None, *, out: Path | None = None) -> DriverRoot:
    """Make a fake driver root at ``root``, which must not exist or be an empty directory."""
    gpus = gpus or FakeGpus()
    root = Path(os.path.abspath(root))
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise FakeNvidiaError(f"fakenvidia: {root} exists and is not an empty directory; a driver root is made fresh")
    try:
        uvm_major = uvm_major_for(Path("/proc/devices").read_text())
    except FileNotFoundError:
        uvm_major = UVM_STAND_IN_MAJOR

    lib_dir = root / "usr" / "lib" / multiarch()
    driver = DriverRoot(path=root, gpus=gpus, lib_dir=lib_dir, uvm_major=uvm_major)
    for d in (driver.dev_dir, lib_dir, root / "usr" / "bin", root / "etc", driver.events_dir):
        d.mkdir(parents=True, exist_ok=True)

    _make_device_nodes(driver)
    _install_libraries(driver, out)
    _install_tools(driver, out)
    _install_firmware(driver)
    _make_persistenced_socket(driver)
    _write_mock_config(driver)
    _write_ld_cache(driver)
    return driver


def _make_device_nodes(driver: DriverRoot) -> None:
    for name, (major, minor) in driver.device_nodes().items():
        path = driver.dev_dir / name
        try:
            os.mknod(path, stat.S_IFCHR | DEVICE_MODE, os.makedev(major, minor))
        except PermissionError as e:
            raise FakeNvidiaError(f"fakenvidia: cannot make {path}: device nodes need root (CAP_MKNOD)") from e
        os.chmod(path, DEVICE_MODE)  # mknod's mode went through the umask


def _install_libraries(driver: DriverRoot, out: Path | None) -> None:
    version = driver.gpus.driver_version
    for i, library in enumerate(DRIVER_LIBRARIES):
        soname = library.soname(version)
        built = build_mock_nvml(out) if i == 0 else build_stub_library(soname, out)
        # A copy, never a link: the dynamic loader treats one inode as one library, and the mock
        # in a root must be a separate instance from any other copy a process has loaded.
        target = driver.lib_dir / library.file_name(version)
        shutil.copyfile(built, target)
        target.chmod(0o644)
        if soname != target.name:
            (driver.lib_dir / soname).symlink_to(target.name)


def _install_tools(driver: DriverRoot, out: Path | None) -> None:
    tool = build_stub_tool(out)
    for name in DRIVER_TOOLS:
        target = driver.path / "usr" / "bin" / name
        shutil.copyfile(tool, target)
        target.chmod(0o755)


def _install_firmware(driver: DriverRoot) -> None:
    firmware_dir = driver.path / "lib" / "firmware" / "nvidia" / driver.gpus.driver_version
    firmware_dir.mkdir(parents=True)
    for name in GSP_FIRMWARE:
        (firmware_dir / name).write_bytes(b"gpushare fake NVIDIA driver: no GSP firmware behind this file\n")


def _make_persistenced_socket(driver: DriverRoot) -> None:
    # mknod, not bind: a bound socket's path is limited to 107 bytes, a driver root's path is not.
    socket_dir = driver.path / "run" / "nvidia-persistenced"
    socket_dir.mkdir(parents=True)
    os.mknod(socket_dir / "socket", stat.S_IFSOCK | 0o666)


def _write_mock_config(driver: DriverRoot) -> None:
    # Relative to the config file, so the root works wherever it is mounted (config.c).
    events = os.path.relpath(driver.events_dir, driver.lib_dir)
    dataclasses.replace(driver.gpus, events_dir=events).write(driver.mock_config)


def _write_ld_cache(driver: DriverRoot) -> None:
    (driver.path / "etc" / "ld.so.conf").write_text(f"/usr/lib/{driver.lib_dir.name}\n")
    ldconfig = shutil.which("ldconfig") or shutil.which("ldconfig", path="/usr/sbin:/sbin")
    if ldconfig is None:
        raise FakeNvidiaError("fakenvidia: ldconfig not found (it comes with libc-bin)")
    # -r: chroot into the root, so the cache holds paths as seen from inside it, which is how the
    # toolkit reads it (it joins each path to the driver root). -X: the soname links are ours.
    argv = [ldconfig, "-X", "-r", str(driver.path)]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    if done.returncode != 0 or not driver.ld_cache.is_file():
        raise FakeNvidiaError(f"fakenvidia: `{' '.join(argv)}` failed ({done.returncode}): {done.stderr.strip()}")
