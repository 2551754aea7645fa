"""Spot tier (issue 8): a private one-node cluster, the fake vendor plugin for 2 GPUs, and
``gpushare agent`` as a host process reading fake dcgm metrics from a file the tests rewrite.

The cluster is private to this module (not the session's) so the agent here is the only one
on its node, whatever other tiers run in the same session. Skips, naming the build command,
when the cluster binaries are missing or not root.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from controller.fake_metrics import FakeGpu, write_dcgm
from tests.harness.cluster import Cluster, ClusterUnavailable, find_installs, running_cluster
from tests.integration.e2e.agent_process import (
    FAKE_RESOURCE,
    REPO,
    AgentProcess,
    FakeGpus,
    agent_config,
    free_port,
)

IDLE_WINDOW_S = 2.0
SCRAPE_INTERVAL_S = 0.2
GPUS = ("fakegpu0", "fakegpu1")


@dataclass
class SpotEnv:
    cluster: Cluster
    agent: AgentProcess
    gpus: FakeGpus
    root: Path
    metrics: Path

    def write_metrics(self, util: dict[str, float | None], users: dict[str, tuple[str, ...]] | None = None) -> None:
        users = users or {}
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

    def events(self, pod: str, namespace: str) -> list[dict[str, Any]]:
        out = self.cluster.kubectl(
            "get", "events", "-n", namespace, "--field-selector", f"involvedObject.name={pod}", "-o", "json"
        ).stdout
        items: list[dict[str, Any]] = json.loads(out)["items"]
        return items


def spot_config(root: Path, cluster: Cluster, port: int, metrics: Path) -> str:
    base = agent_config(
        root,
        nri_socket=str(cluster.nri_socket),
        plugin_dir=str(cluster.device_plugin_dir),
        pod_resources=str(cluster.pod_resources_socket),
        port=port,
        idle_s=60.0,
    )
    # agent_config ends with the metrics section: extend it with the fake source.
    return base + "\n".join(
        [
            f"  source: {metrics}",
            "  vendor: nvidia",
            "  processLevel: true",
            f"  scrapeInterval: {int(SCRAPE_INTERVAL_S * 1000)}ms",
            "  scrapeTimeout: 500ms",
            f"idleWindow: {IDLE_WINDOW_S}s",
            "",
        ]
    )


@pytest.fixture(scope="module")
def spot_env() -> Iterator[SpotEnv]:
    try:
        find_installs()
    except ClusterUnavailable as exc:
        pytest.skip(str(exc))
    with running_cluster() as cluster:
        root = Path(tempfile.mkdtemp(prefix="gs-spot", dir="/tmp"))
        for manifest in ("00-namespace.yaml", "10-priorityclasses.yaml"):
            cluster.kubectl("apply", "-f", str(REPO / "manifests" / manifest))
        cluster.kubectl("create", "namespace", "team")
        cluster.kubectl("create", "namespace", "spot")
        gpus = FakeGpus(root, str(cluster.device_plugin_dir))
        gpus.start()
        port = free_port()
        metrics = root / "dcgm.prom"
        config = root / "agent.yaml"
        config.write_text(spot_config(root, cluster, port, metrics))
        agent = AgentProcess(root, config, str(cluster.kubeconfig), port)
        sock = f"{str(cluster.device_plugin_dir).rstrip('/')}/{FAKE_RESOURCE.replace('/', '-')}.sock"
        agent.argv += ["--spot-from", f"{FAKE_RESOURCE}={sock}", "--no-lease"]
        env = SpotEnv(cluster, agent, gpus, root, metrics)
        env.write_metrics({g: None for g in GPUS})  # unknown until a test says otherwise
        try:
            env.wait(f"{FAKE_RESOURCE}=2", lambda: env.allocatable(FAKE_RESOURCE) == "2", 30)
            agent.start()
            agent.wait_healthy()
            env.wait("spot-gpu registered", lambda: env.allocatable("gpushare/spot-gpu") is not None, 30)
            yield env
        finally:
            agent.stop()
            gpus.stop()
            for ns in ("spot", "team"):
                cluster.kubectl("delete", "pods", "-n", ns, "--all", "--wait=true", "--timeout=60s", check=False)
