"""Issue 2: the plugin also runs pre-connected — containerd 2.x launches it from `plugin_path` and
hands it the NRI connection as fd 3 — and then adjusts containers exactly as the external one.

Only on 2.x: on 1.7.24 a pre-connected plugin that fails to register makes containerd exit, so the
project runs it there as an external process (docs/nri.md); the 1.7.24 case skips saying so.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.harness.containerd import Containerd, ContainerdInstall
from tests.harness.cri import CriClient
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


def test_preconnected_plugin_adjusts(
    containerd_install: ContainerdInstall, fake_gpu: FakeDevice, tmp_path_factory: pytest.TempPathFactory
) -> None:
    if not containerd_install.is_v2:
        pytest.skip(
            "pre-connected plugins are not used on containerd 1.7.24 (a failed registration makes it exit); "
            "the external mode is what runs there and is tested by the other NRI tests"
        )
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
