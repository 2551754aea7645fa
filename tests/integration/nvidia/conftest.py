"""Fixtures of the nvidia tier: NVIDIA's binaries as ``make nvidia-deps`` built them, and a fake driver root.

The binaries are k8s-device-plugin v0.17.4 and the Container Toolkit v1.20.2, unmodified
(hack/nvidia/build.sh). What they stand on is fakenvidia's: a driver root of 8 GPUs whose
``libnvidia-ml.so.1`` is the mock (docs/fakenvidia.md). Without the binaries the tier skips with the
command that builds them, and a skip fails the run unless ``GPUSHARE_ALLOW_SKIP`` names ``nvidia``
(tests/conftest.py). Building a driver root makes device nodes, which needs root; without it the
fixture errors, which fails the tests too.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from fakenvidia.driver_root import DriverRoot, build_driver_root
from fakenvidia.gpus import FakeGpus
from localcluster.errors import ClusterUnavailable
from localcluster.paths import NvidiaBinaries
from tests.unit.fakenvidia.conftest import CONFIG_ENV, EVENTS_ENV
from tests.unit.fakenvidia.nvml import Nvml

GPU_COUNT = 8
# Not the default seed: UUIDs of this tier's GPUs appear nowhere else, so a test that got its UUIDs
# from anywhere but this root's mock would not pass by accident.
UUID_SEED = "nvidia-tier"


def nvidia_ctk_generate(nvidia: NvidiaBinaries, root: DriverRoot, out: Path, *extra: str) -> str:
    """``nvidia-ctk cdi generate`` for ``root`` into ``out``, as an operator runs it; its log (stderr)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    argv = [
        str(nvidia.ctk),
        "cdi",
        "generate",
        f"--driver-root={root.path}",
        f"--nvidia-cdi-hook-path={nvidia.cdi_hook}",
        f"--output={out}",
        *extra,
    ]
    done = subprocess.run(argv, env=binary_env(), capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return done.stderr


def binary_env(**extra: str) -> dict[str, str]:
    """The environment NVIDIA's binaries run with: this one, less what would point the mock elsewhere
    than the root's own config (and less LD_LIBRARY_PATH, which a test gives only on purpose)."""
    env = {k: v for k, v in os.environ.items() if k not in (CONFIG_ENV, EVENTS_ENV, "LD_LIBRARY_PATH")}
    env.update(extra)
    return env


@pytest.fixture(scope="session")
def nvidia() -> NvidiaBinaries:
    try:
        return NvidiaBinaries.find()
    except ClusterUnavailable as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def driver_root(tmp_path_factory: pytest.TempPathFactory) -> DriverRoot:
    """One root per test module: the device plugin's XIDs are consumed from its events directory."""
    return build_driver_root(tmp_path_factory.mktemp("nvidia") / "root", FakeGpus(count=GPU_COUNT, uuid_seed=UUID_SEED))


@pytest.fixture(scope="module")
def gpu_uuids(driver_root: DriverRoot) -> list[str]:
    """The UUIDs the root's mock reports, by NVML index, asked of it directly through NVML's C ABI."""
    with pytest.MonkeyPatch.context() as env:
        # The mock would read these before the config beside it; the binaries run without them.
        env.delenv(CONFIG_ENV, raising=False)
        env.delenv(EVENTS_ENV, raising=False)
        nvml = Nvml(driver_root.nvml_library)
        nvml.init()
        try:
            uuids = nvml.uuids()
        finally:
            nvml.shutdown()
    assert len(uuids) == GPU_COUNT
    assert len(set(uuids)) == GPU_COUNT
    return uuids
