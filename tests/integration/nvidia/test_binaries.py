"""The cache holds NVIDIA's binaries at the pinned releases, stamped as NVIDIA's own builds stamp them."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from localcluster.paths import NVIDIA_CTK_VERSION, NVIDIA_DEVICE_PLUGIN_VERSION, NvidiaBinaries
from tests.integration.nvidia.conftest import binary_env

pytestmark = pytest.mark.integration


def first_line_of_version(binary: Path) -> str:
    done = subprocess.run(
        [str(binary), "--version"], env=binary_env(), capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, f"{binary} --version failed ({done.returncode}): {done.stderr[-2000:]}"
    return done.stdout.splitlines()[0]


def test_each_binary_reports_its_release(nvidia: NvidiaBinaries) -> None:
    # The toolkit's Makefile stamps its version without the v, the device plugin's with it.
    toolkit = NVIDIA_CTK_VERSION.removeprefix("v")
    assert first_line_of_version(nvidia.device_plugin) == f"NVIDIA Device Plugin version {NVIDIA_DEVICE_PLUGIN_VERSION}"
    assert first_line_of_version(nvidia.ctk) == f"NVIDIA Container Toolkit CLI version {toolkit}"
    assert first_line_of_version(nvidia.cdi_hook) == f"NVIDIA CDI Hook version {toolkit}"
    # The runtime goes on to print its low-level runtime's version: runc's, which make deps installs.
    assert first_line_of_version(nvidia.container_runtime) == f"NVIDIA Container Runtime version {toolkit}"
    assert first_line_of_version(nvidia.container_runtime_hook) == f"NVIDIA Container Runtime Hook version {toolkit}"
