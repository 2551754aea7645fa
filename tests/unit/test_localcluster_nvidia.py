"""Where NVIDIA's binaries are found (localcluster/paths.py) and that the build pins them at the same versions."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from localcluster.errors import ClusterUnavailable
from localcluster.paths import (
    NVIDIA_BUILD_HINT,
    NVIDIA_CTK_VERSION,
    NVIDIA_DEVICE_PLUGIN_VERSION,
    NvidiaBinaries,
)

REPO = Path(__file__).resolve().parents[2]
TOOLKIT_COMMANDS = ["nvidia-ctk", "nvidia-container-runtime", "nvidia-cdi-hook", "nvidia-container-runtime-hook"]


def _build(cache: Path, *, stamps: bool = True, skip: str = "") -> None:
    """The layout hack/nvidia/build.sh leaves, with empty files for binaries."""
    plugin = cache / "nvidia/k8s-device-plugin" / NVIDIA_DEVICE_PLUGIN_VERSION / "bin"
    toolkit = cache / "nvidia/container-toolkit" / NVIDIA_CTK_VERSION / "bin"
    for directory, commands in ((plugin, ["nvidia-device-plugin"]), (toolkit, TOOLKIT_COMMANDS)):
        directory.mkdir(parents=True)
        for command in commands:
            if command != skip:
                (directory / command).write_bytes(b"")
        if stamps:
            (directory / ".complete").write_text("inputs\nbuilt\n")


def test_finds_every_binary_of_a_complete_build(tmp_path: Path) -> None:
    _build(tmp_path)
    found = NvidiaBinaries.find(tmp_path)
    assert found.device_plugin == tmp_path / "nvidia/k8s-device-plugin/v0.17.4/bin/nvidia-device-plugin"
    assert found.ctk == tmp_path / "nvidia/container-toolkit/v1.20.2/bin/nvidia-ctk"
    assert [found.ctk.name, found.container_runtime.name, found.cdi_hook.name, found.container_runtime_hook.name] == (
        TOOLKIT_COMMANDS
    )


@pytest.mark.parametrize(("stamps", "skip"), [(True, "nvidia-cdi-hook"), (False, ""), (True, "nvidia-device-plugin")])
def test_a_missing_binary_or_stamp_names_it_and_the_build_command(tmp_path: Path, stamps: bool, skip: str) -> None:
    _build(tmp_path, stamps=stamps, skip=skip)
    with pytest.raises(ClusterUnavailable) as refused:
        NvidiaBinaries.find(tmp_path)
    message = str(refused.value)
    assert message.endswith(f"build them with: {NVIDIA_BUILD_HINT}")
    assert (skip or ".complete") in message


def test_an_empty_cache_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ClusterUnavailable, match="make nvidia-deps"):
        NvidiaBinaries.find(tmp_path)


def test_the_makefile_and_the_build_script_pin_the_versions_the_harness_looks_for() -> None:
    makefile = (REPO / "mk/nvidia.mk").read_text()
    script = (REPO / "hack/nvidia/build.sh").read_text()
    assert re.search(rf"^NVIDIA_DEVICE_PLUGIN_VERSION \?= {NVIDIA_DEVICE_PLUGIN_VERSION}$", makefile, re.M)
    assert re.search(rf"^NVIDIA_CTK_VERSION \?= {NVIDIA_CTK_VERSION}$", makefile, re.M)
    assert f'DEVICE_PLUGIN_VERSION="${{NVIDIA_DEVICE_PLUGIN_VERSION:-{NVIDIA_DEVICE_PLUGIN_VERSION}}}"' in script
    assert f'TOOLKIT_VERSION="${{NVIDIA_CTK_VERSION:-{NVIDIA_CTK_VERSION}}}"' in script
    assert "DEPS += nvidia-deps" in makefile
    for command in ["nvidia-device-plugin", *TOOLKIT_COMMANDS]:
        assert f" {command}" in script, command
