"""Fixtures of the containerd tier: every test runs against real containerd 1.7.24 and 2.x.

Where an install is missing the test skips with the reason and the command that installs it
(`make containerd-deps`); it never passes without having run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from localcluster.containerd import VERSIONS, Containerd, ContainerdInstall, InstallMissing, find_install
from localcluster.cri import CriClient
from tests.harness.devices import FakeDevice, make_fake_device
from tests.harness.plugin_process import PluginProcess


def _require_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("containerd tier needs root (runc, mounts, cgroups); run `sudo make test`")


@pytest.fixture(scope="module", params=VERSIONS, ids=[f"containerd-{v}" for v in VERSIONS])
def containerd_install(request: pytest.FixtureRequest) -> ContainerdInstall:
    _require_root()
    try:
        return find_install(str(request.param))
    except InstallMissing as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def containerd(containerd_install: ContainerdInstall) -> Iterator[Containerd]:
    """One private containerd (NRI on) shared by the tests of a module."""
    with Containerd(containerd_install, nri=True) as cd:
        yield cd


@pytest.fixture
def cri(containerd: Containerd) -> Iterator[CriClient]:
    with CriClient(containerd.address, cgroup_parent=containerd.cgroup_parent) as client:
        yield client


@pytest.fixture
def fake_gpu() -> Iterator[FakeDevice]:
    with make_fake_device() as dev:
        yield dev


@pytest.fixture(scope="module")
def plugin(containerd: Containerd) -> Iterator[PluginProcess]:
    """`gpushare nri run` on this containerd, without PodResources (cross-pod is refused)."""
    with PluginProcess.gpushare(containerd) as proc:
        yield proc
