"""The spot environment on a one-node cluster: the fake vendor plugin for 2 GPUs and ``gpushare
agent`` with spot on, reading fake dcgm metrics from a file on the node that tests and the demo
rewrite. Both are installed as an operator does, with helm (``localcluster/deploy.py`` and
``tests/harness/worlds/agent_pod.py``): the agent is the DaemonSet's pod, with the node's PIDs and
cgroups; ``GPUSHARE_AGENT_MODE=process`` runs both as host processes instead.

Used by the spot tier (tests/integration/spot) and hack/demo_spot.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpumetrics.fake_exporter import FakeGpu, write_dcgm
from gpushare import keys
from localcluster.agent import FAKE_RESOURCE, GPUSHARE, AgentHandle, AgentSettings, GpuPlugin
from localcluster.cluster import Cluster
from localcluster.deploy import fake_gpus
from localcluster.pods import pod_manifest
from tests.harness.worlds.agent_pod import node_agent

IDLE_WINDOW_S = 2.0
SCRAPE_INTERVAL_S = 0.2
GPUS = ("fakegpu0", "fakegpu1")


@dataclass
class SpotEnv:
    cluster: Cluster
    agent: AgentHandle
    gpus: GpuPlugin
    root: Path
    metrics: Path

    def write_metrics(self, util: Mapping[str, float | None], users: Mapping[str, tuple[str, ...]] = {}) -> None:
        write_dcgm(self.metrics, [FakeGpu(g, util.get(g, 0.0), users.get(g, ())) for g in GPUS])

    def apply(self, manifest: dict[str, Any]) -> None:
        self.cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))

    def wait(self, what: str, ok: Callable[[], bool], timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not ok():
            if time.monotonic() > deadline:
                tail = "\n".join(self.agent.log_text().splitlines()[-60:])
                raise AssertionError(f"timed out after {timeout_s}s waiting for {what}; agent log tail:\n{tail}")
            time.sleep(0.2)

    def allocatable(self, resource: str) -> str | None:
        value: str | None = self.cluster.node()["status"]["allocatable"].get(resource)
        return value

    def status_text(self) -> str:
        """What `gpushare status` prints for the agent's node (its stdout; stderr appended on failure)."""
        out = subprocess.run(
            [GPUSHARE, "status", "--config", str(self.agent.config_path)],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        return out.stdout if out.returncode == 0 else out.stdout + out.stderr

    def events(self, pod: str, namespace: str) -> list[dict[str, Any]]:
        out = self.cluster.kubectl(
            "get", "events", "-n", namespace, "--field-selector", f"involvedObject.name={pod}", "-o", "json"
        ).stdout
        items: list[dict[str, Any]] = json.loads(out)["items"]
        return items


def owner_manifest(name: str = "owner") -> dict[str, Any]:
    return pod_manifest(name, namespace="team", resources={FAKE_RESOURCE: "1"}, labels={keys.LABEL_LENDABLE: "true"})


def spot_manifest(name: str) -> dict[str, Any]:
    m = pod_manifest(name, namespace="spot", resources={keys.RESOURCE_SPOT_GPU: "1"})
    # A process tree, so "every process dead" means more than PID 1.
    m["spec"]["containers"][0]["command"] = [
        "sh",
        "-c",
        "trap 'exit 0' TERM; sleep 3600 & sleep 3600 & (while :; do sleep 3600; done) & "
        "ls /dev > /tmp/devs; env > /tmp/env; wait",
    ]
    return m


def owner_gpu(env: SpotEnv, name: str = "owner") -> str:
    out = env.cluster.kubectl("exec", "-n", "team", name, "--", "sh", "-c", "echo $FAKE_VISIBLE_DEVICES").stdout
    gpu = out.strip()
    assert gpu in GPUS, f"owner sees {gpu!r}"
    return gpu


def spot_settings(cluster: Cluster, metrics: Path) -> AgentSettings:
    """Spot on, fed by the fake dcgm file, following the fake vendor plugin; the only agent, so it leads."""
    plugin_socket = f"{str(cluster.device_plugin_dir).rstrip('/')}/{FAKE_RESOURCE.replace('/', '-')}.sock"
    metrics_config = {
        "source": str(metrics),
        "vendor": "nvidia",
        "processLevel": True,
        "scrapeInterval": f"{int(SCRAPE_INTERVAL_S * 1000)}ms",
        "scrapeTimeout": "500ms",
    }
    return AgentSettings(
        idle_s=60.0,
        config={"metrics": metrics_config, "idleWindow": f"{IDLE_WINDOW_S}s"},
        args=("--period", "1", "--spot-from", f"{FAKE_RESOURCE}={plugin_socket}", "--no-lease"),
    )


@contextmanager
def spot_environment(cluster: Cluster, *, start_fake_gpus: bool = True, kmod: bool = False) -> Iterator[SpotEnv]:
    """Namespaces team and spot, fake GPUs (unless already running), the agent with spot on; all removed after.

    ``kmod``: the DaemonSet's kmod init container runs, as the chart installs it by default (pod
    mode; its image is imported too, which costs a minute or more on a busy 2-core machine).
    """
    root = Path(tempfile.mkdtemp(prefix="gs-spot", dir="/tmp"))
    for ns in ("team", "spot"):
        cluster.kubectl("create", "namespace", ns, check=False)
    # The file in a directory of its own: the agent's pod mounts that directory, read-only.
    metrics = root / "metrics" / "dcgm.prom"
    metrics.parent.mkdir()
    gpus = fake_gpus(cluster, root)
    settings = dataclasses.replace(spot_settings(cluster, metrics), kmod=kmod)
    agent = node_agent(cluster, root, settings)
    env = SpotEnv(cluster, agent, gpus, root, metrics)
    env.write_metrics({g: None for g in GPUS})  # unknown until told otherwise: never idle
    try:
        if start_fake_gpus:
            gpus.start()
        env.wait(f"{FAKE_RESOURCE}=2", lambda: env.allocatable(FAKE_RESOURCE) == "2", 30)
        agent.start()
        agent.wait_healthy()
        env.wait("spot-gpu registered", lambda: env.allocatable("gpushare/spot-gpu") is not None, 30)
        yield env
    finally:
        for ns in ("spot", "team"):
            cluster.kubectl("delete", "pods", "-n", ns, "--all", "--wait=true", "--timeout=60s", check=False)
        agent.close()
        if start_fake_gpus:
            gpus.stop()
        if not os.environ.get("GPUSHARE_KEEP_CLUSTER"):  # keep the agent log for a post-mortem on request
            shutil.rmtree(root, ignore_errors=True)
