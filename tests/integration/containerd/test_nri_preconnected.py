"""Pre-connected mode: containerd 2.x launches the plugin from `plugin_path` and hands it the NRI
connection as fd 3; the plugin then adjusts containers exactly as the external one does.

Not on 1.7.24: there a pre-connected plugin that fails to register makes containerd itself exit,
so the project runs the plugin as an external process on 1.7 (docs/nri.md). The 1.7.24 test
asserts exactly that behaviour, the reason for the rule.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from localcluster.containerd import Containerd, ContainerdError, ContainerdInstall
from localcluster.cri import CriClient
from tests.harness.devices import FakeDevice
from tests.harness.plugin_process import GPUSHARE, READY_LINE
from tests.integration.containerd.common import probe, run_source, same_pod_annotation


def _wait_log(path: Path, needle: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and needle in path.read_text(errors="replace"):
            return
        time.sleep(0.05)
    text = path.read_text(errors="replace") if path.exists() else "(no log)"
    raise AssertionError(f"pre-connected plugin never logged {needle!r}:\n{text[-2000:]}")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# The conftest's containerd_install fixture, narrowed to one version per test.
ONLY_2X = pytest.mark.parametrize("containerd_install", ["2.x"], ids=["containerd-2.x"], indirect=True)
ONLY_1_7 = pytest.mark.parametrize("containerd_install", ["1.7.24"], ids=["containerd-1.7.24"], indirect=True)


@ONLY_1_7
def test_1_7_exits_when_a_preconnected_plugin_fails_to_register(containerd_install: ContainerdInstall) -> None:
    cd = Containerd(containerd_install, preconnected_plugins={"10-failing": "#!/bin/sh\nexit 1\n"}, import_images=False)
    try:
        with pytest.raises(ContainerdError, match="exited during start") as exc:
            cd.start()
    finally:
        cd.close()
    assert "failed to register plugin" in str(exc.value), str(exc.value)


@ONLY_2X
def test_preconnected_plugin_adjusts(
    containerd_install: ContainerdInstall, fake_gpu: FakeDevice, tmp_path_factory: pytest.TempPathFactory
) -> None:
    logs = tmp_path_factory.mktemp("preconnected")
    log, pidfile = logs / "plugin.log", logs / "plugin.pid"
    # containerd starts pre-connected plugins without PATH and with /dev/null stdio: absolute paths,
    # our own log file. `exec` keeps the PID the wrapper records.
    wrapper = f"#!/bin/sh\necho $$ > {pidfile}\nexec {GPUSHARE} nri run --preconnected 2>>{log}\n"
    cd = Containerd(containerd_install, preconnected_plugins={"10-gpushare": wrapper})
    try:
        cd.start()
        _wait_log(log, READY_LINE)
        with CriClient(cd.address, cgroup_parent=cd.cgroup_parent) as cri:
            pod = cri.run_pod("dind-preconnected", annotations=same_pod_annotation("dind", "main"))
            run_source(cri, pod, fake_gpu)
            assert probe(cri, cri.run_container(pod, "dind"), fake_gpu).cgroup_allows
            cri.remove_pod(pod.id)
        _wait_log(log, "decision=inject")
    finally:
        cd.close()
    # Its connection closed with containerd: a pre-connected plugin cannot redial, so it must exit.
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while _pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = _pid_alive(pid)
    if alive:
        os.kill(pid, 9)
    assert not alive, "the pre-connected plugin kept running after containerd stopped"
