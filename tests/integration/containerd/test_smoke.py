"""The harness itself against real containerd + runc: a plain pod and container, no plugin.

These prove what the NRI tests rely on: host-network pods start, RuntimeDefault seccomp really
applies, a CRI device reaches the container with its cgroup rule, containers see their env, and a
containerd restart keeps the pod running.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.containerd import Containerd
from tests.harness.cri import CriClient, CriError, DeviceSpec
from tests.harness.devices import FakeDevice, make_fake_device


@pytest.fixture
def fake_device() -> Iterator[FakeDevice]:
    with make_fake_device() as dev:
        yield dev


# Prints the node's type and numbers, opens it read-write (fails unless the device cgroup allows
# it), then shows the container's device cgroup rules (cgroup v1 here).
PROBE = [
    "sh",
    "-c",
    "stat -c '%F %t:%T' /dev/fakegpu0 && exec 3<>/dev/fakegpu0 && cat /sys/fs/cgroup/devices/devices.list",
]


def test_pod_and_container_run(cri: CriClient) -> None:
    pod = cri.run_pod("smoke", annotations={"example.com/a": "b"})
    cid = cri.run_container(pod, "main", envs={"GREETING": "hello"})
    res = cri.exec_sync(cid, ["sh", "-c", 'echo "$GREETING"; grep "^Seccomp:" /proc/self/status'])
    assert res.exit_code == 0, res
    assert res.stdout.split() == ["hello", "Seccomp:", "2"]  # 2 = filter mode: RuntimeDefault applied
    status = cri.container_status(cid)
    assert status.metadata.name == "main"
    assert status.state == 1  # CONTAINER_RUNNING
    cri.remove_pod(pod.id)
    assert pod.id not in cri.list_pod_ids()


def test_cri_device_reaches_container(cri: CriClient, fake_device: FakeDevice) -> None:
    pod = cri.run_pod("smoke-dev")
    with_dev = cri.run_container(
        pod, "main", devices=[DeviceSpec("/dev/fakegpu0", str(fake_device.path))], envs={"NVIDIA_VISIBLE_DEVICES": "0"}
    )
    without = cri.run_container(pod, "other")
    rule = f"c {fake_device.major}:{fake_device.minor} rw"
    res = cri.exec_sync(with_dev, PROBE)
    assert res.exit_code == 0, res
    assert res.stdout.split("\n")[0] == f"character special file {fake_device.major:x}:{fake_device.minor:x}"
    assert rule in res.stdout  # containerd added the device cgroup rule, so the open above worked
    res = cri.exec_sync(without, PROBE)
    assert res.exit_code != 0 and rule not in res.stdout
    cri.remove_pod(pod.id)


def test_unknown_image_fails_cleanly(cri: CriClient) -> None:
    pod = cri.run_pod("smoke-bad-image")
    with pytest.raises(CriError) as info:
        cri.create_container(pod, "main", image="gpushare.local/does-not-exist:test")
    assert info.value.method == "CreateContainer"
    cri.remove_pod(pod.id)


def test_restart_keeps_pods(containerd: Containerd, cri: CriClient) -> None:
    pod = cri.run_pod("smoke-restart")
    cid = cri.run_container(pod, "main")
    old_pid = containerd.pid
    containerd.restart()
    assert containerd.pid != old_pid
    with CriClient(containerd.address, cgroup_parent=containerd.cgroup_parent) as fresh:
        assert fresh.exec_sync(cid, ["true"]).exit_code == 0
        fresh.remove_pod(pod.id)


def test_private_paths(containerd: Containerd) -> None:
    base = containerd.paths.base
    assert str(base).startswith("/tmp/gs-cd-")
    assert stat.S_ISSOCK(os.stat(containerd.address).st_mode)
    assert stat.S_ISSOCK(os.stat(containerd.nri_socket).st_mode)  # NRI is on
    config = containerd.config_path.read_text()
    assert "restrict_oom_score_adj = true" in config and "/run/containerd/containerd.sock" not in config
    assert not Path(containerd.nri_socket).is_relative_to("/var/run")
