"""``gpushare agent`` and the fake vendor device plugin as real host processes next to a cluster.

Real processes, not threads, so a test can ``kill -9`` the agent exactly as a crash would. Used by
the e2e and spot tiers, ``hack/demo.py``, ``hack/demo_spot.py`` and ``bench/share_startup.py``.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from localcluster.cluster import Cluster
from localcluster.host import free_port
from localcluster.images import PAUSE_IMAGE
from localcluster.paths import REPO

GPUSHARE = str(Path(sys.executable).parent / "gpushare")
FAKE_RESOURCE = "example.com/gpu"
SHADOW_IMAGE = PAUSE_IMAGE  # shadow pods hold a GPU and run nothing: the locally built pause image


def agent_config(root: Path, *, nri_socket: str, plugin_dir: str, pod_resources: str, port: int, idle_s: float) -> str:
    """The YAML config of the test/demo agent: the fake vendor resource first (the default pool)."""
    return "\n".join(
        [
            "version: v1",
            'nodeName: "127.0.0.1"',
            f"realResources: [{FAKE_RESOURCE}]",
            f"shadowImage: {SHADOW_IMAGE}",
            f"shadowIdleTimeout: {idle_s}s",
            f"stateDir: {root / 'state'}",
            "nri:",
            f"  socket: {nri_socket}",
            "kubelet:",
            f"  devicePluginDir: {plugin_dir.rstrip('/')}/",
            f"  podResourcesSocket: {pod_resources}",
            "metrics:",
            f"  listen: 127.0.0.1:{port}",
            "",
        ]
    )


class Process:
    """A child process with its output in a log file; ``stop()`` SIGTERMs, then SIGKILLs."""

    def __init__(self, name: str, argv: list[str], log_path: Path) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO
            )

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def mark(self) -> int:
        return len(self.log_text())

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """SIGTERM and wait; returns the exit code (None if it had to be killed)."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc is not None else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            return None

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)


class AgentProcess(Process):
    def __init__(self, root: Path, config_path: Path, kubeconfig: str, port: int) -> None:
        argv = [GPUSHARE, "agent", "--config", str(config_path), "--kubeconfig", kubeconfig, "--period", "1"]
        super().__init__("agent", argv, root / "agent.log")
        self.config_path = config_path
        self.port = port

    def get(self, path: str, timeout_s: float = 3.0) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout_s)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def healthy(self) -> bool:
        with contextlib.suppress(OSError):
            return self.get("/healthz")[0] == 200
        return False

    def wait_healthy(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.healthy():
            if not self.alive():
                raise AssertionError(f"agent exited ({self.proc and self.proc.returncode}):\n{self.log_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"agent not healthy after {timeout_s}s:\n{self.log_text()[-3000:]}")
            time.sleep(0.2)

    def dump_stacks(self) -> None:
        """SIGUSR1: the agent writes every thread's stack to its log (faulthandler)."""
        if self.alive():
            os.kill(self.pid, signal.SIGUSR1)
            time.sleep(0.5)

    def status(self) -> dict[str, Any]:
        code, body = self.get("/status")
        assert code == 200, body
        doc: dict[str, Any] = json.loads(body)
        return doc


def agent_for(root: Path, cluster: Cluster, idle_s: float) -> AgentProcess:
    """The (not yet started) agent of a harness cluster: namespace and PriorityClasses applied, config written."""
    for manifest in ("00-namespace.yaml", "10-priorityclasses.yaml"):
        cluster.kubectl("apply", "-f", str(REPO / "manifests" / manifest))
    port = free_port()
    config = root / "agent.yaml"
    paths = {
        "nri_socket": str(cluster.nri_socket),
        "plugin_dir": str(cluster.device_plugin_dir),
        "pod_resources": str(cluster.pod_resources_socket),
    }
    config.write_text(agent_config(root, port=port, idle_s=idle_s, **paths))
    return AgentProcess(root, config, str(cluster.kubeconfig), port)


class FakeGpus(Process):
    def __init__(self, root: Path, plugin_dir: str, count: int = 2) -> None:
        dev_dir = root / "dev"
        dev_dir.mkdir(parents=True, exist_ok=True)
        argv = [GPUSHARE, "fake-gpus", "--count", str(count), "--resource", FAKE_RESOURCE]
        argv += ["--dev-dir", str(dev_dir), "--plugin-dir", plugin_dir]
        super().__init__("fake-gpus", argv, root / "fake-gpus.log")
