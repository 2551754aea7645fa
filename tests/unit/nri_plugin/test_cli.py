"""`gpushare nri run` as a process against the byte-level fake runtime: logs, SIGTERM, exit code."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from pathlib import Path

from gpushare import keys
from nri_plugin._pb import nri_pb2

from .fake_runtime import FakeRuntime

ROOT = Path(__file__).resolve().parents[3]
# cli/main.py has no __main__ guard; call its entry point the way the console script does.
GPUSHARE = [sys.executable, "-c", "from cli.main import main; main()"]


def test_run_logs_one_line_per_decision_and_stops_on_sigterm() -> None:
    rt = FakeRuntime()
    rt.listen()
    proc = subprocess.Popen(
        [*GPUSHARE, "nri", "run", "--socket", rt.path],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert rt.ready.wait(30), "plugin did not register"
        pod = nri_pb2.PodSandbox(
            id="p1", name="pod", namespace="ns", annotations={keys.POD_ANNOTATION_DEVICES_FROM_PREFIX + "dind": "main"}
        )
        main = nri_pb2.Container(id="c1", pod_sandbox_id="p1", name="main")
        main.linux.devices.add(path="/dev/fakegpu0", type="c", major=10, minor=229)
        assert rt.call("CreateContainer", nri_pb2.CreateContainerRequest(pod=pod, container=main)).code == 0
        dind = nri_pb2.Container(id="c2", pod_sandbox_id="p1", name="dind")
        assert rt.call("CreateContainer", nri_pb2.CreateContainerRequest(pod=pod, container=dind)).code == 0
        other = nri_pb2.Container(
            id="c3", pod_sandbox_id="p1", name="other", annotations={keys.ANNOTATION_DEVICES_FROM: "{bad"}
        )
        assert rt.call("CreateContainer", nri_pb2.CreateContainerRequest(pod=pod, container=other)).code == 9
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        rt.cleanup()
    assert proc.returncode == 0, err
    decisions = [line for line in err.splitlines() if "decision=" in line]
    assert len(decisions) == 2, err
    assert "decision=inject pod=ns/pod container=dind source=ns/pod/main devices=1" in decisions[0]
    assert "took_ms=" in decisions[0]
    assert "decision=refuse pod=ns/pod container=other" in decisions[1] and "not valid JSON" in decisions[1]
    assert "nri: stopped" in err


def test_bad_config_exits_2_with_the_problem(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("version: v1\nnri:\n  pluginIndex: 1\n")
    proc = subprocess.run(
        [*GPUSHARE, "nri", "run", "--config", str(cfg)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 2
    assert "pluginIndex" in proc.stderr


def test_preconnected_process_with_containerds_bare_environment() -> None:
    # containerd 2.x plugin_path launch: one end of a socketpair, and an environment of only
    # these three variables (no PATH, no HOME; stdio on /dev/null).
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    rt = FakeRuntime()
    rt.serve_socket(theirs)
    fd = ours.fileno()
    proc = subprocess.Popen(
        [*GPUSHARE, "nri", "run"],
        cwd=ROOT,
        env={"NRI_PLUGIN_SOCKET": str(fd), "NRI_PLUGIN_NAME": "gpushare", "NRI_PLUGIN_IDX": "10"},
        pass_fds=[fd],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    ours.close()
    try:
        assert rt.ready.wait(30), "plugin did not register over the inherited socket"
        assert rt.registration is not None and rt.registration.plugin_idx == "10"
        rt.drop_connection()  # containerd going away: a pre-connected plugin exits
        _, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        rt.cleanup()
    assert proc.returncode == 0, err
    assert "mode=pre-connected" in err and "pre-connected socket closed" in err
