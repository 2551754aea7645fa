"""``gpushare agent`` and the fake vendor device plugin next to a cluster, and what both ways of
running them share.

The e2e and spot tiers, ``hack/demo.py`` and ``hack/demo_spot.py`` run the agent as the pod of
the chart's DaemonSet (``tests/harness/worlds/agent_pod.py``), the way an operator installs it.
Running it as a host process stays for development (``GPUSHARE_AGENT_MODE=process``) and for
``bench/share_startup.py``, which rewrites the config between phases. Both ways give the tests the
same handle (``AgentHandle``): start, stop (SIGTERM), ``kill -9``, the log text, ``/metrics``,
``/status`` and a stack dump.
"""

from __future__ import annotations

import contextlib
import copy
import http.client
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import yaml

from localcluster.cluster import Cluster
from localcluster.errors import ClusterError
from localcluster.host import free_port
from localcluster.images import PAUSE_IMAGE
from localcluster.layout import NODE_NAME
from localcluster.paths import REPO

GPUSHARE = str(Path(sys.executable).parent / "gpushare")
FAKE_RESOURCE = "example.com/gpu"
SHADOW_IMAGE = PAUSE_IMAGE  # shadow pods hold a GPU and run nothing: the locally built pause image
MODE_ENV = "GPUSHARE_AGENT_MODE"
MODES = ("pod", "process")


def agent_mode() -> str:
    """``$GPUSHARE_AGENT_MODE``: ``pod`` (the default: the DaemonSet, installed with helm) or ``process``."""
    mode = os.environ.get(MODE_ENV, "") or MODES[0]
    if mode not in MODES:
        raise ClusterError(f"{MODE_ENV}={mode!r} is not a way to run the agent: use one of {', '.join(MODES)}")
    return mode


@dataclass(frozen=True)
class AgentSettings:
    """What the test or demo agent is told, whichever way it runs.

    ``config`` holds more config keys, nested as in the file (``{"metrics": {"source": ...}}``);
    ``args`` more ``gpushare agent`` flags. ``kmod``: the DaemonSet's kmod init container runs
    (pod mode; it needs the kmod image, ``make image-kmod``); without it the pod's agent runs
    with ``--no-kmod``, while a host-process agent uses the module whenever one is loaded.
    """

    idle_s: float = 60.0
    spot: bool = True
    kmod: bool = False
    config: Mapping[str, Any] = field(default_factory=dict)
    args: tuple[str, ...] = ("--period", "1")
    # More values of the Helm chart, set over the ones derived from the above (pod mode only).
    chart: Mapping[str, Any] = field(default_factory=dict)


def config_doc(cluster: Cluster, side: Path, port: int, settings: AgentSettings) -> dict[str, Any]:
    """The agent's config as a dict: the fake vendor resource first (the default pool), the cluster's paths."""
    doc: dict[str, Any] = {
        "version": "v1",
        "realResources": [FAKE_RESOURCE],
        "shadowImage": SHADOW_IMAGE,
        "shadowIdleTimeout": f"{settings.idle_s}s",
        "stateDir": str(side / "state"),
        "nri": {"socket": str(cluster.nri_socket)},
        "kubelet": {
            "devicePluginDir": f"{cluster.device_plugin_dir}/",
            "podResourcesSocket": str(cluster.pod_resources_socket),
            "rootDir": str(cluster.kubelet_root),
        },
        "metrics": {"listen": f"127.0.0.1:{port}"},
    }
    for key, value in copy.deepcopy(dict(settings.config)).items():
        if isinstance(value, dict) and isinstance(doc.get(key), dict):
            doc[key].update(value)
        else:
            doc[key] = value
    return doc


def agent_config(root: Path, *, nri_socket: str, plugin_dir: str, pod_resources: str, port: int, idle_s: float) -> str:
    """The YAML config of a host-process agent: the fake vendor resource first (the default pool)."""
    doc = {
        "version": "v1",
        "nodeName": NODE_NAME,
        "realResources": [FAKE_RESOURCE],
        "shadowImage": SHADOW_IMAGE,
        "shadowIdleTimeout": f"{idle_s}s",
        "stateDir": str(root / "state"),
        "nri": {"socket": nri_socket},
        "kubelet": {"devicePluginDir": f"{plugin_dir.rstrip('/')}/", "podResourcesSocket": pod_resources},
        "metrics": {"listen": f"127.0.0.1:{port}"},
    }
    return yaml.safe_dump(doc, sort_keys=False)


class AgentHandle(Protocol):
    """The agent as the tests drive it, as a host process (``AgentProcess``) or a pod (``AgentPod``)."""

    port: int
    # A config file on the host naming the agent's endpoint and node: `gpushare status --config`.
    config_path: Path

    def start(self) -> None: ...
    def stop(self, timeout_s: float = 15.0) -> int | None: ...
    def kill9(self) -> None: ...
    def alive(self) -> bool: ...
    def log_text(self) -> str: ...
    def mark(self) -> int: ...
    def get(self, path: str, timeout_s: float = 3.0) -> tuple[int, bytes]: ...
    def healthy(self) -> bool: ...
    def wait_healthy(self, timeout_s: float = 60.0) -> None: ...
    def dump_stacks(self) -> None: ...
    def status(self) -> dict[str, Any]: ...
    def close(self) -> None: ...


class GpuPlugin(Protocol):
    """The fake vendor device plugin, as a host process (``FakeGpus``) or a DaemonSet (``FakeGpuRelease``)."""

    def start(self) -> None: ...
    def stop(self) -> Any: ...


class AgentEndpoint:
    """The agent's HTTP endpoint on 127.0.0.1 (``/healthz``, ``/metrics``, ``/status``), however it runs."""

    port: int

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

    def status(self) -> dict[str, Any]:
        code, body = self.get("/status")
        assert code == 200, body
        doc: dict[str, Any] = json.loads(body)
        return doc

    def log_text(self) -> str:
        raise NotImplementedError

    def not_running(self) -> str:
        """Why the agent cannot become healthy without help ("" while it may still)."""
        raise NotImplementedError

    def wait_healthy(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.healthy():
            if why := self.not_running():
                raise AssertionError(f"agent {why}:\n{self.log_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"agent not healthy after {timeout_s}s:\n{self.log_text()[-3000:]}")
            time.sleep(0.2)


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


class AgentProcess(Process, AgentEndpoint):
    """``gpushare agent`` as a child of this process (development mode, the benchmarks)."""

    def __init__(self, root: Path, config_path: Path, kubeconfig: str, port: int) -> None:
        argv = [GPUSHARE, "agent", "--config", str(config_path), "--kubeconfig", kubeconfig, "--period", "1"]
        Process.__init__(self, "agent", argv, root / "agent.log")
        self.config_path = config_path
        self.port = port

    def not_running(self) -> str:
        return "" if self.alive() else f"exited ({self.proc and self.proc.returncode})"

    def close(self) -> None:
        self.stop()

    def dump_stacks(self) -> None:
        """SIGUSR1: the agent writes every thread's stack to its log (faulthandler)."""
        if self.alive():
            os.kill(self.pid, signal.SIGUSR1)
            time.sleep(0.5)


def apply_base_manifests(cluster: Cluster) -> None:
    """The namespace and PriorityClasses a host-process agent needs (the chart makes them for a pod)."""
    for manifest in ("00-namespace.yaml", "10-priorityclasses.yaml"):
        cluster.kubectl("apply", "-f", str(REPO / "manifests" / manifest))


def agent_for(root: Path, cluster: Cluster, idle_s: float) -> AgentProcess:
    """The (not yet started) host-process agent of a harness cluster: namespace and PriorityClasses applied."""
    return process_agent(cluster, root, AgentSettings(idle_s=idle_s))


def process_agent(cluster: Cluster, side: Path, settings: AgentSettings, port: int | None = None) -> AgentProcess:
    """A (not yet started) host-process agent told ``settings``; its config file is ``side/agent.yaml``."""
    apply_base_manifests(cluster)
    port = port or free_port()
    doc = {"nodeName": NODE_NAME, **config_doc(cluster, side, port, settings)}
    config = side / "agent.yaml"
    config.write_text(yaml.safe_dump(doc, sort_keys=False))
    agent = AgentProcess(side, config, str(cluster.kubeconfig), port)
    agent.argv = agent.argv[: agent.argv.index("--period")] + list(settings.args)
    agent.argv += [] if settings.spot else ["--no-spot"]
    return agent


class FakeGpus(Process):
    """``gpushare fake-gpus`` as a child of this process (development mode, the benchmarks)."""

    def __init__(self, root: Path, plugin_dir: str, count: int = 2) -> None:
        dev_dir = root / "dev"
        dev_dir.mkdir(parents=True, exist_ok=True)
        argv = [GPUSHARE, "fake-gpus", "--count", str(count), "--resource", FAKE_RESOURCE]
        argv += ["--dev-dir", str(dev_dir), "--plugin-dir", plugin_dir]
        super().__init__("fake-gpus", argv, root / "fake-gpus.log")
