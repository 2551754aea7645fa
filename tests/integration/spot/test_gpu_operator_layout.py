"""Spot next to NVIDIA's GPU Operator: the agent finds its node's dcgm-exporter pod through the API.

The operator runs dcgm-exporter as a DaemonSet in its own namespace: pods labelled
``app=nvidia-dcgm-exporter`` with container port 9400 named ``metrics``, on the pod network, so
nothing answers on the node's 127.0.0.1:9400. Here a ``gpu-operator`` namespace holds pods of that
shape, each serving the fake dcgm-exporter text (busybox httpd over a host directory the test
rewrites), and the tier's agent is upgraded with helm to the source
``k8s://pods/gpu-operator?labelSelector=app=nvidia-dcgm-exporter&port=metrics`` (and back to
the tier's file source at the end).

This cluster's pod network never leaves a pod (hack/kube/cni/gs-netns: an address inside the
pod, no bridge, no route on the host), so the agent on the host's network can find a
pod-network exporter but not read it; on a cluster with a real CNI the node routes pod IPs. The
exporter that is read runs on the host network, as the operator runs it with
``dcgmExporter.hostNetwork: true``. A matching pod on another node (a kwok node) is never taken.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpumetrics.discovery import GPU_OPERATOR_SOURCE
from gpumetrics.fake_exporter import FakeGpu, write_dcgm
from localcluster.host import free_port
from localcluster.images import BUSYBOX_IMAGE
from localcluster.kwok import Kwok
from localcluster.layout import NODE_NAME
from tests.harness.worlds.agent_pod import AgentPod
from tests.harness.worlds.spot import GPUS, SpotEnv, owner_gpu, owner_manifest

NS = "gpu-operator"
LABELS = {"app": "nvidia-dcgm-exporter"}
OTHER_NODE = "gpu-node-sim"
OWNER = "op-owner"
LOOKED_FOR = f"a pod labelled app=nvidia-dcgm-exporter in namespace {NS} on node {NODE_NAME}"


def exporter_manifest(name: str, page_dir: Path, *, port: int, host_network: bool, node: str) -> dict[str, Any]:
    """A pod shaped as the operator's dcgm-exporter pods, serving ``page_dir/metrics`` as /metrics."""
    url = f"http://127.0.0.1:{port}/metrics"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": dict(LABELS)},
        "spec": {
            "nodeName": node,
            "hostNetwork": host_network,
            # What the operator sets with hostNetwork, so its Service names still resolve.
            **({"dnsPolicy": "ClusterFirstWithHostNet"} if host_network else {}),
            "terminationGracePeriodSeconds": 1,
            "tolerations": [{"operator": "Exists"}],
            "containers": [
                {
                    "name": "nvidia-dcgm-exporter",
                    "image": BUSYBOX_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["httpd", "-f", "-p", str(port), "-h", "/srv"],
                    "ports": [{"name": "metrics", "containerPort": port}],
                    # Ready once it serves its page; probed from inside the pod, which reaches its
                    # own address on either network.
                    "readinessProbe": {
                        "exec": {"command": ["wget", "-q", "-O", "/dev/null", url]},
                        "periodSeconds": 1,
                    },
                    "volumeMounts": [{"name": "page", "mountPath": "/srv", "readOnly": True}],
                }
            ],
            "volumes": [{"name": "page", "hostPath": {"path": str(page_dir), "type": "Directory"}}],
        },
    }


@dataclass
class OperatorLayout:
    env: SpotEnv
    page_dir: Path

    def write_page(self, util: dict[str, float]) -> None:
        """What every exporter pod serves: the fake dcgm text, the owner as a GPU user when busy."""
        users = {g: (f"team/{OWNER}",) for g, u in util.items() if u > 0}
        write_dcgm(self.page_dir / "metrics", [FakeGpu(g, util.get(g), users.get(g, ())) for g in GPUS])

    def run_exporter(self, name: str, *, port: int, host_network: bool, node: str = NODE_NAME) -> dict[str, Any]:
        """Create the pod and wait until it is Running and Ready; the pod as the API has it then."""
        self.env.apply(exporter_manifest(name, self.page_dir, port=port, host_network=host_network, node=node))
        seen: dict[str, Any] = {}

        def ready() -> bool:
            seen["pod"] = self.env.cluster.pod(name, NS) or {}
            status = seen["pod"].get("status") or {}
            conditions = status.get("conditions") or []
            is_ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
            return status.get("phase") == "Running" and is_ready

        self.env.cluster.wait_for(f"exporter pod {NS}/{name} Running and Ready", ready, 60)
        pod: dict[str, Any] = seen["pod"]
        return pod

    def delete(self, name: str) -> None:
        self.env.cluster.kubectl("delete", "pod", "-n", NS, name, "--wait=true", "--timeout=60s")

    def metrics_status(self) -> dict[str, Any]:
        doc: dict[str, Any] = self.env.agent.status()["spot_runtime"]["metrics"]
        return doc

    def wait_metrics(self, what: str, ok: Any, timeout_s: float = 90.0) -> dict[str, Any]:
        """Wait until the agent's /status metrics block satisfies ``ok``; the block then.

        Lists back off to one a minute while no exporter can be read (docs/metrics.md), so a
        change in the namespace is seen within about a minute, not at once."""
        seen: dict[str, Any] = {}

        def check() -> bool:
            seen["m"] = self.metrics_status()
            return bool(ok(seen["m"]))

        try:
            self.env.wait(what, check, timeout_s)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nlast metrics status: {json.dumps(seen.get('m'))}") from None
        return seen["m"]

    def spot_gpu(self, gpu: str) -> dict[str, Any]:
        (entry,) = [g for g in self.env.agent.status()["spot"] if g["real_id"] == gpu]
        return dict(entry)


@pytest.fixture(scope="module")
def layout(spot_env: SpotEnv) -> Iterator[OperatorLayout]:
    """The operator's namespace with an exporter on another node, and the agent on the discovery source."""
    agent = spot_env.agent
    if not isinstance(agent, AgentPod):
        pytest.skip("the metrics source is the chart's config: run with the agent as the DaemonSet's pod")
    cluster = spot_env.cluster
    page_dir = spot_env.root / "dcgm-exporter"
    page_dir.mkdir(exist_ok=True)
    lay = OperatorLayout(spot_env, page_dir)
    lay.write_page({})
    before = agent.settings
    kwok = Kwok(cluster, spot_env.root / "kwok")
    cluster.kubectl("create", "namespace", NS)
    try:
        kwok.start()
        kwok.add_nodes([OTHER_NODE], gpus=0, timeout_s=120)
        # Before the agent looks: its first list must already have the other node's exporter to leave out.
        lay.run_exporter("nvidia-dcgm-exporter-elsewhere", port=9400, host_network=False, node=OTHER_NODE)
        metrics = {**before.config["metrics"], "source": GPU_OPERATOR_SOURCE}
        agent.upgrade(dataclasses.replace(before, config={**before.config, "metrics": metrics}))
        yield lay
    finally:
        cluster.kubectl("delete", "pod", "-n", "team", OWNER, "--wait=true", "--timeout=60s", check=False)
        cluster.kubectl("delete", "namespace", NS, "--wait=true", "--timeout=90s", check=False)
        kwok.delete_nodes()
        kwok.stop()
        agent.upgrade(before)
        agent.wait_healthy()


def test_a_matching_pod_on_another_node_is_not_this_nodes_exporter(layout: OperatorLayout) -> None:
    other = layout.env.cluster.pod("nvidia-dcgm-exporter-elsewhere", NS) or {}
    assert other["spec"]["nodeName"] == OTHER_NODE and other["status"]["phase"] == "Running"
    m = layout.wait_metrics("the agent's first look", lambda m: m["error"])
    assert m["source"] == GPU_OPERATOR_SOURCE and m["endpoint"] == ""
    assert f"no Running and Ready pod: looked for {LOOKED_FOR}" in m["error"], m["error"]
    assert "elsewhere" not in m["error"]  # not even named as a candidate
    assert m["last_scrape_at"] is None


def test_the_operators_default_exporter_on_the_pod_network_is_found_at_its_pod_ip(layout: OperatorLayout) -> None:
    pod = layout.run_exporter("nvidia-dcgm-exporter-podnet", port=9400, host_network=False)
    ip = pod["status"]["podIP"]
    assert not pod["spec"].get("hostNetwork") and ip.startswith("10.244."), ip
    url = f"http://{ip}:9400/metrics"
    m = layout.wait_metrics(f"the agent to find {url}", lambda m: m["endpoint"] == url)
    # Found, and named in the error: this cluster's pod network does not route from the host.
    m = layout.wait_metrics("the read of the pod-network exporter to fail", lambda m: url in m["error"])
    assert f"exporter pod {NS}/nvidia-dcgm-exporter-podnet" in m["error"]
    assert "a pod IP must route there, or run the exporter with hostNetwork" in m["error"]
    layout.delete("nvidia-dcgm-exporter-podnet")


def test_the_exporter_on_the_host_network_is_read_and_spot_sees_utilization(layout: OperatorLayout) -> None:
    env = layout.env
    env.apply(owner_manifest(OWNER))
    env.cluster.wait_pod_phase(OWNER, ["Running"], namespace="team", timeout_s=60)
    gpu = owner_gpu(env, OWNER)
    others = {g: 50.0 for g in GPUS if g != gpu}
    layout.write_page({**others, gpu: 0.0})
    # Nothing readable yet (the pod-network exporter is gone): the owner's GPU is not lent.
    env.wait(f"{OWNER} seen on {gpu}", lambda: layout.spot_gpu(gpu)["owner"].startswith(f"team/{OWNER}/"), 30)
    assert layout.spot_gpu(gpu)["state"] == "busy" and layout.metrics_status()["error"]
    port = free_port()
    pod = layout.run_exporter("nvidia-dcgm-exporter-hostnet", port=port, host_network=True)
    url = f"http://{pod['status']['podIP']}:{port}/metrics"
    m = layout.wait_metrics(f"a scrape of {url}", lambda m: m["endpoint"] == url and not m["error"])
    assert m["last_scrape_at"] is not None
    env.wait(f"{gpu} away: its owner idle", lambda: layout.spot_gpu(gpu)["state"] == "away", 30)
    layout.write_page({**others, gpu: 80.0})  # the owner's pod uses its GPU again
    env.wait(f"{gpu} busy: its owner active", lambda: layout.spot_gpu(gpu)["reason"] == "owner active", 30)
    assert layout.spot_gpu(gpu)["state"] == "busy"


def test_a_replaced_exporter_pod_is_found_again_and_each_change_is_logged_once(layout: OperatorLayout) -> None:
    env = layout.env
    first = layout.wait_metrics("the host-network exporter read", lambda m: m["endpoint"] and not m["error"])
    # An upgrade's surge: the new pod is up before the old one goes. The agent keeps reading the
    # pod it has (no list per scrape) until a read of it fails.
    port = free_port()
    new = layout.run_exporter("nvidia-dcgm-exporter-v2", port=port, host_network=True)
    scraped_at = layout.metrics_status()["last_scrape_at"]
    env.wait("more scrapes", lambda: layout.metrics_status()["last_scrape_at"] > scraped_at, 10)
    assert layout.metrics_status()["endpoint"] == first["endpoint"]
    mark = env.agent.mark()
    layout.delete("nvidia-dcgm-exporter-hostnet")
    url = f"http://{new['status']['podIP']}:{port}/metrics"
    layout.wait_metrics(f"the replacement read at {url}", lambda m: m["endpoint"] == url and not m["error"], 30)
    read_at = layout.metrics_status()["last_scrape_at"]
    env.wait("another scrape of the new pod", lambda: layout.metrics_status()["last_scrape_at"] > read_at, 10)
    log = env.agent.log_text()[mark:]
    found = [line for line in log.splitlines() if "metrics: exporter pod found" in line]
    assert len(found) == 1 and "nvidia-dcgm-exporter-v2" in found[0], found
    unreadable = [line for line in log.splitlines() if "spot: metrics unreadable" in line]
    assert len(unreadable) <= 1, unreadable  # at most the one read of the deleted pod
