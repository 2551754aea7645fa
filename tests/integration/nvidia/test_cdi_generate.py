"""`nvidia-ctk cdi generate` (Container Toolkit v1.20.2) on the fake driver root: the spec a GPU node would get.

The toolkit asks the root's mock NVML for the GPUs and the driver version, then finds device nodes,
libraries, tools and firmware under ``--driver-root`` the way it does on a node. What is asserted is
what 1.20.2 really produces for such a node, so a fake that is missing a part, or has it in the wrong
shape, shows here as a spec without it. The spec is then loaded by the CDI library the toolkit
itself uses (``nvidia-ctk cdi list``), which validates it, and refused once it claims an older CDI
version than its content needs.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from fakenvidia.driver_root import DRIVER_LIBRARIES, DRIVER_TOOLS, GSP_FIRMWARE, DriverRoot
from localcluster.paths import NvidiaBinaries
from tests.integration.nvidia.conftest import GPU_COUNT, binary_env, nvidia_ctk_generate

pytestmark = pytest.mark.integration

KIND = "nvidia.com/gpu"
# CDI 0.5.0 added hostPath to device nodes, which every node here has; 0.4.0 is the one before it.
SPEC_VERSION = "0.5.0"
OLDER_SPEC_VERSION = "0.4.0"
HOOK_ENV = ["NVIDIA_CTK_DEBUG=false"]
# NVIDIA's device numbers, written out here rather than taken from fakenvidia, so a fake node with
# the wrong numbers fails: the toolkit copies them from the nodes it finds. nvidia-uvm's major is
# the kernel's choice (the root's, here).
NVIDIA_MAJOR = 195
CONTROL_NODES = {"nvidiactl": 255, "nvidia-modeset": 254}
UVM_NODES = {"nvidia-uvm": 0, "nvidia-uvm-tools": 1}
# Each GPU's only edit besides its node: the hook that applies NVIDIA_GPU_MEMORY_LIMIT, if a container sets it.
MEMORY_LIMITS_HOOK = "apply-cuda-memory-limits"
CREATE_CONTAINER_HOOKS = {
    "create-symlinks",
    "enable-cuda-compat",
    "update-ldcache",
    "disable-device-node-modification",
    "update-application-profile",
}


@dataclass(frozen=True)
class Generated:
    spec: dict[str, Any]
    path: Path
    log: str

    def device(self, name: str) -> dict[str, Any]:
        found = [d for d in self.spec["devices"] if d["name"] == name]
        assert len(found) == 1, f"{name}: {len(found)} devices of that name in {self.names()}"
        edits: dict[str, Any] = found[0]["containerEdits"]
        return edits

    def names(self) -> list[str]:
        return [d["name"] for d in self.spec["devices"]]

    @property
    def common(self) -> dict[str, Any]:
        edits: dict[str, Any] = self.spec["containerEdits"]
        return edits


def generate(nvidia: NvidiaBinaries, root: DriverRoot, out: Path, *extra: str) -> Generated:
    log = nvidia_ctk_generate(nvidia, root, out, *extra)
    return Generated(yaml.safe_load(out.read_text()), out, log)


@pytest.fixture(scope="module")
def generated(nvidia: NvidiaBinaries, driver_root: DriverRoot, tmp_path_factory: pytest.TempPathFactory) -> Generated:
    return generate(nvidia, driver_root, tmp_path_factory.mktemp("cdi") / "nvidia.yaml")


def container_lib_dir(root: DriverRoot) -> str:
    """Where the root's library directory is inside a container: the same path, less the root."""
    return "/" + str(root.lib_dir.relative_to(root.path))


def node(edit: dict[str, Any]) -> tuple[str, str, int, int, int, str]:
    # The spec omits a zero minor (omitempty).
    return (edit["path"], edit["hostPath"], edit["major"], edit.get("minor", 0), edit["fileMode"], edit["permissions"])


def gpu_node(root: DriverRoot, index: int) -> tuple[str, str, int, int, int, str]:
    return (f"/dev/nvidia{index}", str(root.dev_dir / f"nvidia{index}"), NVIDIA_MAJOR, index, 0o666, "rwm")


def memory_limits_hook(nvidia: NvidiaBinaries, root: DriverRoot, uuid: str) -> dict[str, Any]:
    return {
        "hookName": "createRuntime",
        "path": str(nvidia.cdi_hook),
        "args": ["nvidia-cdi-hook", MEMORY_LIMITS_HOOK, "--driver-root", str(root.path), "--gpu-id", uuid],
        "env": HOOK_ENV,
    }


def test_the_toolkit_read_the_mocks_driver_version(generated: Generated, driver_root: DriverRoot) -> None:
    # From NVML (nvmlSystemGetDriverVersion), which is what picks the *.so.<version> libraries below.
    assert f"Using driver version {driver_root.gpus.driver_version}" in generated.log
    assert "Auto-detected mode as 'nvml'" in generated.log


def test_one_device_per_gpu_named_by_index_and_by_uuid_and_all(
    generated: Generated, driver_root: DriverRoot, gpu_uuids: list[str], nvidia: NvidiaBinaries
) -> None:
    assert generated.spec["kind"] == KIND
    names = generated.names()
    assert sorted(names) == sorted([*map(str, range(GPU_COUNT)), *gpu_uuids, "all"])
    for index, uuid in enumerate(gpu_uuids):
        # The index and the UUID name the same GPU: the mock's minor number is its index.
        for name in (str(index), uuid):
            edits = generated.device(name)
            assert [node(n) for n in edits["deviceNodes"]] == [gpu_node(driver_root, index)], name
            assert edits["hooks"] == [memory_limits_hook(nvidia, driver_root, uuid)], name
            assert set(edits) == {"deviceNodes", "hooks"}, name
    every = generated.device("all")
    assert [node(n) for n in every["deviceNodes"]] == [gpu_node(driver_root, i) for i in range(GPU_COUNT)]
    assert every["hooks"] == [memory_limits_hook(nvidia, driver_root, u) for u in gpu_uuids]


def test_common_edits_carry_the_control_modeset_and_uvm_nodes(generated: Generated, driver_root: DriverRoot) -> None:
    numbers = {name: (NVIDIA_MAJOR, minor) for name, minor in CONTROL_NODES.items()}
    numbers |= {name: (driver_root.uvm_major, minor) for name, minor in UVM_NODES.items()}
    expected = {
        (f"/dev/{name}", str(driver_root.dev_dir / name), major, minor, 0o666, "rwm")
        for name, (major, minor) in numbers.items()
    }
    nodes = [node(n) for n in generated.common["deviceNodes"]]
    assert len(nodes) == len(expected)
    assert set(nodes) == expected


def test_common_env_hides_the_runtimes_own_device_list(generated: Generated, driver_root: DriverRoot) -> None:
    # NVIDIA_VISIBLE_DEVICES=void (and the /dev/null mount below) keeps a legacy hook from adding GPUs
    # again to a container that got them through CDI.
    assert sorted(generated.common["env"]) == sorted(
        [f"NVIDIA_CTK_LIBCUDA_DIR={container_lib_dir(driver_root)}", "NVIDIA_VISIBLE_DEVICES=void"]
    )


def test_driver_libraries_tools_and_firmware_are_bind_mounted_read_only_from_the_root(
    generated: Generated, driver_root: DriverRoot
) -> None:
    version = driver_root.gpus.driver_version
    mounts = {m["hostPath"]: m for m in generated.common["mounts"]}
    expected = {
        str(driver_root.lib_dir / lib.file_name(version)): f"{container_lib_dir(driver_root)}/{lib.file_name(version)}"
        for lib in DRIVER_LIBRARIES
    }
    expected |= {str(driver_root.path / "usr/bin" / tool): f"/usr/bin/{tool}" for tool in DRIVER_TOOLS}
    firmware = f"lib/firmware/nvidia/{version}"
    expected |= {str(driver_root.path / firmware / name): f"/{firmware}/{name}" for name in GSP_FIRMWARE}
    for host, container in expected.items():
        assert host in mounts, f"{host} is not mounted; mounts: {sorted(mounts)}"
        assert mounts[host]["containerPath"] == container
        assert {"ro", "nosuid", "nodev", "rbind", "rprivate"} <= set(mounts[host]["options"]), host
    # Besides those: persistenced's socket (writable: clients talk to it) and the void device list.
    rest = {h: m["containerPath"] for h, m in mounts.items() if h not in expected}
    assert rest == {
        str(driver_root.path / "run/nvidia-persistenced/socket"): "/run/nvidia-persistenced/socket",
        "/dev/null": "/var/run/nvidia-container-devices/void",
    }
    assert len(generated.common["mounts"]) == len(mounts)


def test_create_container_hooks_link_sonames_and_update_the_ld_cache(
    generated: Generated, driver_root: DriverRoot, nvidia: NvidiaBinaries
) -> None:
    hooks = generated.common["hooks"]
    for hook in hooks:
        assert hook["hookName"] == "createContainer", hook
        assert hook["path"] == str(nvidia.cdi_hook), hook
        assert hook["args"][0] == "nvidia-cdi-hook", hook
        assert hook["env"] == HOOK_ENV, hook
    by_command: dict[str, list[list[str]]] = {}
    for hook in hooks:
        by_command.setdefault(hook["args"][1], []).append(hook["args"][2:])
    assert set(by_command) == CREATE_CONTAINER_HOOKS

    lib_dir = container_lib_dir(driver_root)
    version = driver_root.gpus.driver_version
    assert by_command["update-ldcache"] == [["--folder", lib_dir]]
    assert by_command["enable-cuda-compat"] == [[f"--host-driver-version={version}"]]
    links = {a for args in by_command["create-symlinks"] for a in args if a != "--link"}
    # Every soname link ldconfig would make in the container, as the root has them ...
    sonames = {
        f"{lib.file_name(version)}::{lib_dir}/{lib.soname(version)}"
        for lib in DRIVER_LIBRARIES
        if lib.soname(version) != lib.file_name(version)
    }
    assert sonames <= links, sorted(sonames - links)
    # ... and the development link CUDA programs are linked against.
    assert f"libcuda.so.1::{lib_dir}/libcuda.so" in links


def test_every_host_path_is_inside_the_fake_root(generated: Generated, driver_root: DriverRoot) -> None:
    # The spec hands containers the fake root's files and nothing of this machine's, but /dev/null.
    edits = [generated.common, *(d["containerEdits"] for d in generated.spec["devices"])]
    host_paths = [e["hostPath"] for ed in edits for key in ("deviceNodes", "mounts") for e in ed.get(key, [])]
    assert len(host_paths) > 2 * GPU_COUNT
    outside = [p for p in host_paths if not p.startswith(f"{driver_root.path}/") and p != "/dev/null"]
    assert outside == []


def test_the_spec_is_valid_cdi_at_the_version_its_content_needs(
    generated: Generated, gpu_uuids: list[str], nvidia: NvidiaBinaries, tmp_path: Path
) -> None:
    assert generated.spec["cdiVersion"] == SPEC_VERSION
    listed, log = cdi_list(nvidia, generated.path.parent)
    assert sorted(listed) == sorted(f"{KIND}={n}" for n in [*map(str, range(GPU_COUNT)), *gpu_uuids, "all"]), log
    assert "registry errors" not in log

    # The validator is not a formality: the same spec claiming the CDI version before is refused.
    older = tmp_path / "older"
    older.mkdir()
    text = generated.path.read_text()
    assert f"cdiVersion: {SPEC_VERSION}\n" in text
    (older / "nvidia.yaml").write_text(
        text.replace(f"cdiVersion: {SPEC_VERSION}\n", f"cdiVersion: {OLDER_SPEC_VERSION}\n")
    )
    listed, log = cdi_list(nvidia, older)
    assert listed == []
    assert f"the spec version must be at least v{SPEC_VERSION}" in log


def test_device_ids_restrict_the_spec_to_those_gpus(
    nvidia: NvidiaBinaries, driver_root: DriverRoot, gpu_uuids: list[str], tmp_path: Path
) -> None:
    # What the runtime's jit-cdi mode does for a container's NVIDIA_VISIBLE_DEVICES: a UUID is looked
    # up in NVML (nvmlDeviceGetHandleByUUID) and named by its index too (nvmlDeviceGetIndex).
    restricted = generate(nvidia, driver_root, tmp_path / "nvidia.yaml", f"--device-id={gpu_uuids[3]}", "--device-id=5")
    assert sorted(restricted.names()) == sorted(["3", "5", gpu_uuids[3], gpu_uuids[5], "all"])
    assert [node(n) for n in restricted.device(gpu_uuids[3])["deviceNodes"]] == [gpu_node(driver_root, 3)]
    assert [node(n) for n in restricted.device("5")["deviceNodes"]] == [gpu_node(driver_root, 5)]
    assert [node(n) for n in restricted.device("all")["deviceNodes"]] == [
        gpu_node(driver_root, 3),
        gpu_node(driver_root, 5),
    ]


def cdi_list(nvidia: NvidiaBinaries, spec_dir: Path) -> tuple[list[str], str]:
    """The devices the CDI library loads from ``spec_dir`` (one ``vendor/class=name`` a line), and its log."""
    argv = [str(nvidia.ctk), "cdi", "list", f"--spec-dir={spec_dir}"]
    done = subprocess.run(argv, env=binary_env(), capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, f"{' '.join(argv)} failed ({done.returncode}):\n{done.stderr[-4000:]}"
    return done.stdout.split(), done.stderr
