"""Failover tier: two `gpushare agent` processes compete for the Lease on the real cluster.

- Agent A is the node agent of the cluster's real node (kubelet, containerd with NRI, 2 fake
  GPUs from `gpushare fake-gpus`), as in the e2e tier's process mode.
- Agent B stands for the agent of a second node. This cluster has one kubelet, so B's node is
  a Node object without one (cordoned and tainted, so nothing is scheduled there): B registers
  no device plugin and reads no PodResources, and its node work finds nothing to do. What it
  shares with A is everything the Lease decides: the watches of pending pods and shadows, the
  shadow plan, creating, marking and deleting shadows.
- B reaches the API server through a TCP proxy the test can cut (``proxy.py``); A directly.

Each test gets both agents fresh, B started first so that it leads, and A following. The warm
pool's test (``test_warm_pool.py``) runs A alone, and restarts it with a new config.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare import keys
from localcluster.agent import FAKE_RESOURCE, AgentProcess, AgentSettings, FakeGpus, process_agent
from localcluster.cluster import Cluster
from tests.harness.cluster_fixture import cluster  # noqa: F401
from tests.integration.failover.proxy import CuttableProxy

NODE_B = "gpushare-failover-b"
LEASE_PATH = f"/apis/coordination.k8s.io/v1/namespaces/{keys.DEFAULT_NAMESPACE}/leases/{keys.LEASE_NAME}"
LEASE_S = 15  # the agent's lease duration (controller/io/lease.py)
RENEW_S = LEASE_S / 3  # how often an agent tries (controller/loop.py)
IDLE_S = 600.0  # no shadow idles out during a failover test: a deletion would be wrong
GPUS = 4


def micro_time(text: str) -> float:
    """A Lease's MicroTime as a Unix time."""
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()


@dataclass
class Pair:
    cluster: Cluster
    a: AgentProcess
    b: AgentProcess
    proxy: CuttableProxy

    def lease(self) -> dict[str, Any]:
        spec: dict[str, Any] = self.cluster.request("GET", LEASE_PATH)["spec"]
        return spec

    def holder(self) -> str:
        try:
            return str(self.lease().get("holderIdentity") or "")
        except Exception:  # not created yet
            return ""

    def pods(self, namespace: str = "default", selector: str = "") -> list[dict[str, Any]]:
        query = f"?labelSelector={selector}" if selector else ""
        items: list[dict[str, Any]] = self.cluster.request("GET", f"/api/v1/namespaces/{namespace}/pods{query}")[
            "items"
        ]
        return [p for p in items if not p["metadata"].get("deletionTimestamp")]

    def shadows(self) -> dict[str, str]:
        """Live shadows: name -> uid."""
        return {
            p["metadata"]["name"]: p["metadata"]["uid"]
            for p in self.pods(keys.DEFAULT_NAMESPACE, f"{keys.LABEL_ROLE}%3D{keys.ROLE_SHADOW}")
        }

    def running(self, names: list[str]) -> bool:
        pods = {p["metadata"]["name"]: p for p in self.pods()}
        return all((pods.get(n) or {}).get("status", {}).get("phase") == "Running" for n in names)

    def wait(self, what: str, ok: Callable[[], bool], timeout_s: float = 90.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not ok():
            if time.monotonic() > deadline:
                tail = {n: "\n".join(x.log_text().splitlines()[-40:]) for n, x in (("A", self.a), ("B", self.b))}
                raise AssertionError(f"timed out after {timeout_s}s waiting for {what}; logs:\n{json.dumps(tail)}")
            time.sleep(0.2)

    def is_leader(self, agent: AgentProcess) -> bool | None:
        """What the agent's last pass says (None: it does not answer)."""
        try:
            return bool(agent.status().get("is_leader"))
        except (OSError, AssertionError):
            return None


def _node_b() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": NODE_B, "labels": {"gpushare-failover": "1"}},
        "spec": {
            "unschedulable": True,
            "taints": [{"key": "gpushare-failover", "value": "no-kubelet", "effect": "NoSchedule"}],
        },
    }


def _agent_b(c: Cluster, side: Path, proxy: CuttableProxy) -> AgentProcess:
    (side / "dp").mkdir(parents=True, exist_ok=True)
    config = {
        "nodeName": NODE_B,
        "kubelet": {"devicePluginDir": f"{side}/dp/", "podResourcesSocket": str(side / "no-kubelet.sock")},
        "nri": {"socket": str(side / "no-containerd.sock")},
    }
    agent = process_agent(c, side, AgentSettings(idle_s=IDLE_S, spot=False, config=config))
    kubeconfig = yaml.safe_load(Path(c.kubeconfig).read_text())
    for entry in kubeconfig["clusters"]:
        entry["cluster"]["server"] = f"https://127.0.0.1:{proxy.port}"
    path = side / "kubeconfig-via-proxy"
    path.write_text(yaml.safe_dump(kubeconfig))
    agent.argv[agent.argv.index("--kubeconfig") + 1] = str(path)
    return agent


def _clean(c: Cluster) -> None:
    c.kubectl("delete", "pods", "-l", "gpushare-e2e=1", "--wait=true", "--timeout=60s", check=False)
    shadows = f"{keys.LABEL_ROLE}={keys.ROLE_SHADOW}"
    c.kubectl(
        "delete", "pods", "-n", keys.DEFAULT_NAMESPACE, "-l", shadows, "--wait=true", "--timeout=60s", check=False
    )


@pytest.fixture(scope="package")
def gpus(cluster: Cluster) -> Iterator[FakeGpus]:  # noqa: F811
    root = Path(tempfile.mkdtemp(prefix="gs-failover", dir="/tmp"))
    plugin = FakeGpus(root, str(cluster.device_plugin_dir), count=GPUS)
    plugin.start()
    try:
        cluster.wait_for(
            f"{GPUS} fake GPUs", lambda: cluster.node()["status"]["allocatable"].get(FAKE_RESOURCE) == str(GPUS)
        )
        cluster.kubectl("apply", "-f", "-", input=json.dumps(_node_b()))
        yield plugin
    finally:
        cluster.kubectl("delete", "node", NODE_B, "--ignore-not-found", check=False)
        plugin.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def pair(cluster: Cluster, gpus: FakeGpus) -> Iterator[Pair]:  # noqa: F811
    root = Path(tempfile.mkdtemp(prefix="gs-failover-pair", dir="/tmp"))
    proxy = CuttableProxy(cluster.ports.apiserver)
    (root / "a").mkdir()
    (root / "b").mkdir()
    a = process_agent(cluster, root / "a", AgentSettings(idle_s=IDLE_S, spot=False))
    b = _agent_b(cluster, root / "b", proxy)
    p = Pair(cluster, a, b, proxy)
    try:
        b.start()
        b.wait_healthy()
        # A Lease left by an earlier tier's agent expires within its duration.
        p.wait("agent B holds the Lease", lambda: p.holder() == NODE_B, LEASE_S * 2 + 30)
        a.start()
        a.wait_healthy()
        p.wait("share-gpu-4 advertised by A", lambda: "gpushare/share-gpu-4" in cluster.node()["status"]["allocatable"])
        yield p
    finally:
        proxy.restore()
        _clean(cluster)
        for agent in (a, b):
            agent.stop()
        proxy.close()
        shutil.rmtree(root, ignore_errors=True)


@dataclass
class Solo:
    """Agent A alone (it takes the Lease), its config rewritten between runs."""

    cluster: Cluster
    agent: AgentProcess
    base: str  # the config as process_agent wrote it

    def restart_with(self, extra: dict[str, Any]) -> None:
        self.agent.stop()
        doc = {**yaml.safe_load(self.base), **extra}
        self.agent.config_path.write_text(yaml.safe_dump(doc, sort_keys=False))
        self.agent.start()
        self.agent.wait_healthy()


@pytest.fixture
def solo(cluster: Cluster, gpus: FakeGpus) -> Iterator[Solo]:  # noqa: F811
    root = Path(tempfile.mkdtemp(prefix="gs-failover-solo", dir="/tmp"))
    agent = process_agent(cluster, root, AgentSettings(idle_s=3.0, spot=False))
    try:
        yield Solo(cluster, agent, agent.config_path.read_text())
    finally:
        _clean(cluster)
        agent.stop()
        shutil.rmtree(root, ignore_errors=True)
