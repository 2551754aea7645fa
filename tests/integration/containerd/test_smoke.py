"""The harness itself against real containerd + runc: a plain pod and container, no plugin.

These prove what the NRI tests rely on: host-network pods start, RuntimeDefault seccomp really
applies, a CRI device reaches the container with its cgroup rule, containers see their env, and a
containerd restart keeps the pod running.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from localcluster.containerd import Containerd, ContainerdInstall, shim_pids
from localcluster.cri import CriClient, CriError
from localcluster.host import cgroup_pids, mounts_under
from tests.harness.devices import FakeDevice
from tests.integration.containerd.common import GPU_ID, Seen, expected_node, probe, run_source


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


def test_cri_device_reaches_container(cri: CriClient, fake_gpu: FakeDevice) -> None:
    pod = cri.run_pod("smoke-dev")
    with_dev = run_source(cri, pod, fake_gpu)
    without = cri.run_container(pod, "other")
    assert probe(cri, with_dev, fake_gpu) == Seen(expected_node(fake_gpu), True, True, GPU_ID)
    # 10:229 is not in runc's default allow list: only the CRI device's own cgroup rule opens it.
    assert probe(cri, without, fake_gpu) == Seen("", False, False, None)
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


def test_close_cleans_up_after_containerd_is_gone(containerd_install: ContainerdInstall) -> None:
    """A pod whose containerd already stopped: close() still ends its processes, mounts and cgroups."""
    cd = Containerd(containerd_install)
    try:
        cd.start()
        with CriClient(cd.address, cgroup_parent=cd.cgroup_parent) as cri:
            cri.run_container(cri.run_pod("stray"), "main")
        assert shim_pids(cd.address) and cgroup_pids(cd.cgroup_parent)
        cd.stop()
    finally:
        cd.close()
    assert not shim_pids(cd.address) and not cgroup_pids(cd.cgroup_parent)
    assert not mounts_under(cd.paths.base) and not cd.paths.base.exists()
    assert not list(Path("/sys/fs/cgroup").glob(f"*{cd.cgroup_parent}"))
