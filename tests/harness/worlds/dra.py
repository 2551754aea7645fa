"""A DRA node on the test cluster: fake GPUs described by a vendor CDI spec, gpushare's DRA
plugin as a process, and the chart's DeviceClasses applied with the real helm.

The fake vendor stands in for the hardware and its driver only: its GPUs are device nodes
(``/dev/null``'s numbers, told apart by path) and its CDI spec is what a vendor's toolkit writes
(NVIDIA's ``nvidia-ctk cdi generate``). Everything above it is the product: the plugin publishes
the node's ResourceSlices, the real scheduler allocates, real kubelet prepares and real
containerd applies the CDI devices.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from deviceplugins.fake import create_fake_gpu_nodes
from gpumetrics.fake_exporter import FakeGpu, write_dcgm
from localcluster.agent import AgentHandle, AgentSettings, agent_mode
from localcluster.cluster import Cluster
from localcluster.helm import helm_binary
from localcluster.paths import REPO
from tests.harness.plugin_process import GPUSHARE, PluginProcess
from tests.harness.worlds.agent_pod import node_agent
from tests.harness.worlds.spot import IDLE_WINDOW_S, SCRAPE_INTERVAL_S

DRIVER = "gpushare.k8s.io"
VENDOR_KIND = "example.com/gpu"
VENDOR_SPEC = "example.com-gpu.json"
CHART = REPO / "manifests" / "chart"
DEVICE_CLASSES_TEMPLATE = "templates/80-dra-deviceclasses.yaml"
ADMISSION_TEMPLATE = "templates/82-dra-admission.yaml"
CLAIMS_POLICY = "gpushare-dra-claims"


def vendor_spec(paths: list[str]) -> dict[str, Any]:
    """The fake vendor's CDI spec: one device per GPU node, plus ``all``, like NVIDIA's toolkit."""
    devices = [
        {
            "name": Path(p).name,
            "containerEdits": {
                "deviceNodes": [{"path": f"/dev/{Path(p).name}", "hostPath": p}],
                "env": [f"FAKE_VISIBLE_DEVICES={Path(p).name}"],
            },
        }
        for p in paths
    ]
    everything = {
        "name": "all",
        "containerEdits": {"deviceNodes": [{"path": f"/dev/{Path(p).name}", "hostPath": p} for p in paths]},
    }
    return {"cdiVersion": "0.5.0", "kind": VENDOR_KIND, "devices": [*devices, everything]}


def device_classes(
    template: str = DEVICE_CLASSES_TEMPLATE, values: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    """The chart's DeviceClasses (or another DRA template's objects), rendered by the real helm with
    ``dra.enabled=true`` and ``values``."""
    argv = [str(helm_binary()), "template", "gpushare", str(CHART), "--show-only", template]
    argv += ["--set", "dra.enabled=true"]
    for key, value in (values or {}).items():
        argv += ["--set-json", f"{key}={json.dumps(value)}"]
    res = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60)
    return [d for d in yaml.safe_load_all(res.stdout) if d]


class DraNode:
    """The node's DRA side; ``start`` returns once the plugin's slices are in the API."""

    def __init__(self, cluster: Cluster, *, gpus: int = 2, share_specs: tuple[int, ...] = (2, 3, 4, 5)) -> None:
        self.cluster = cluster
        self.gpus = gpus
        self.share_specs = share_specs
        self.dev_dir = cluster.root / "dra-dev"
        self.cdi_dir = cluster.layout.containerd_dir / "cdi"
        self.config = cluster.root / "dra-config.yaml"
        self.plugin: PluginProcess | None = None
        self.classes: list[dict[str, Any]] = []

    @property
    def plugin_dir(self) -> Path:
        return self.cluster.kubelet_root / "plugins" / DRIVER

    @property
    def checkpoint(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.plugin_dir / "checkpoint.json").read_text())
        return data

    def claim_specs(self) -> list[str]:
        return sorted(p.name for p in self.cdi_dir.glob(f"k8s.{DRIVER}-claim_*.json"))

    @property
    def gpu_ids(self) -> list[str]:
        """The vendor's IDs of the GPUs, in order: what its spec and its exporter call them."""
        return [f"fakegpu{i}" for i in range(self.gpus)]

    def write_vendor(self) -> None:
        """The hardware and its driver: the device nodes and the vendor's CDI spec for them."""
        paths = create_fake_gpu_nodes(str(self.dev_dir), self.gpus)
        self.cdi_dir.mkdir(parents=True, exist_ok=True)
        (self.cdi_dir / VENDOR_SPEC).write_text(json.dumps(vendor_spec(paths)))

    def apply_classes(self, *, claims_policy: bool = False) -> None:
        """The chart's DeviceClasses and, with ``claims_policy``, its policy on claims, as helm renders them.

        Never the policy on slices: a host-process agent publishes with the admin's credentials,
        which that policy refuses (only the agent's pod-bound token may publish)."""
        self.classes = device_classes(values={"config.shareSpecs": list(self.share_specs)})
        if claims_policy:
            self.classes += [o for o in device_classes(ADMISSION_TEMPLATE) if o["metadata"]["name"] == CLAIMS_POLICY]
        self.cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(self.classes))

    def setup(self) -> None:
        self.write_vendor()
        self.config.write_text(yaml.safe_dump(self.config_doc()))
        self.apply_classes()

    def config_doc(self) -> dict[str, Any]:
        """The driver's part of the agent's config: where kubelet, the CDI specs and the GPUs are."""
        return {
            "version": "v1",
            "nodeName": self.cluster.node_name,
            "cdiSpecDirs": [str(self.cdi_dir)],
            "shareSpecs": list(self.share_specs),
            "kubelet": {"rootDir": str(self.cluster.kubelet_root)},
            "dra": {"enabled": True, "vendorKind": VENDOR_KIND, "cdiRoot": str(self.cdi_dir)},
        }

    def start_plugin(self) -> None:
        argv = [
            str(GPUSHARE),
            "dra-plugin",
            "--node",
            self.cluster.node_name,
            "--kubeconfig",
            str(self.cluster.kubeconfig),
            "--config",
            str(self.config),
        ]
        self.plugin = PluginProcess(argv, ready_line="registered with kubelet")
        self.plugin.start(timeout_s=60)
        self.wait_published()

    def stop_plugin(self, *, kill: bool = False) -> None:
        if self.plugin is None:
            return
        if kill:
            self.plugin.kill()
        self.plugin.stop()
        self.plugin = None

    def slices(self) -> list[dict[str, Any]]:
        got: dict[str, Any] = self.cluster.request(
            "GET", f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.driver={DRIVER}"
        )
        return list(got["items"])

    def wait_published(self, timeout_s: float = 60.0, *, newer_than: int = 0) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []

        def complete() -> bool:
            nonlocal found
            found = self.slices()
            gens = {s["spec"]["pool"]["generation"] for s in found}
            counts = {s["spec"]["pool"]["resourceSliceCount"] for s in found}
            return bool(found) and len(gens) == 1 and gens.pop() > newer_than and counts == {len(found)}

        self.cluster.wait_for("gpushare's ResourceSlices", complete, timeout_s)
        return found

    def teardown(self) -> None:
        self.stop_plugin()
        for obj in self.classes:  # applied by the test; in pod mode the chart's go with the release
            with contextlib.suppress(Exception):
                self.cluster.kubectl("delete", obj["kind"], obj["metadata"]["name"], "--ignore-not-found")
        with contextlib.suppress(Exception):
            self.cluster.kubectl(
                "delete", "resourceslices", f"--field-selector=spec.driver={DRIVER}", "--ignore-not-found"
            )
        (self.cdi_dir / VENDOR_SPEC).unlink(missing_ok=True)


@contextlib.contextmanager
def dra_node(cluster: Cluster, **kw: Any) -> Iterator[DraNode]:
    node = DraNode(cluster, **kw)
    try:
        node.setup()
        node.start_plugin()
        yield node
    finally:
        node.teardown()


def wait(cond: Any, what: str, timeout_s: float = 60.0, interval_s: float = 0.3) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)


@dataclass
class DraAgentEnv:
    """The agent in DRA mode on the node (the chart's DRA DaemonSet, or a host process), with spot
    on and fed by a fake dcgm file, and the node's fake GPUs behind the vendor's CDI spec."""

    node: DraNode
    agent: AgentHandle
    metrics: Path

    @property
    def cluster(self) -> Cluster:
        return self.node.cluster

    def write_metrics(self, util: Mapping[str, float | None], users: Mapping[str, tuple[str, ...]] = {}) -> None:
        write_dcgm(self.metrics, [FakeGpu(g, util.get(g, 0.0), users.get(g, ())) for g in self.node.gpu_ids])

    def spot_taints(self, gpu: str) -> list[tuple[str, str]]:
        """The taints of ``gpu``'s spot device (``gpu`` is the vendor's ID) as the API has them."""
        index = self.node.gpu_ids.index(gpu)
        for s in self.node.slices():
            for d in s["spec"].get("devices", []):
                if d["name"] == f"gpu-{index}-spot":
                    return [(t["key"], t["effect"]) for t in d.get("taints", [])]
        raise AssertionError(f"no spot device for {gpu} in the published slices")


@contextlib.contextmanager
def dra_agent(cluster: Cluster, *, gpus: int = 2) -> Iterator[DraAgentEnv]:
    """Fake GPUs, their vendor CDI spec and the agent in DRA mode; everything removed after."""
    side = Path(tempfile.mkdtemp(prefix="gs-dra", dir="/tmp"))
    node = DraNode(cluster, gpus=gpus)
    metrics = side / "metrics" / "dcgm.prom"
    metrics.parent.mkdir(parents=True)
    doc = node.config_doc()
    settings = AgentSettings(
        idle_s=60.0,
        config={
            "cdiSpecDirs": doc["cdiSpecDirs"],
            "dra": doc["dra"],
            "metrics": {
                "source": str(metrics),
                "vendor": "nvidia",
                "processLevel": True,
                "scrapeInterval": f"{int(SCRAPE_INTERVAL_S * 1000)}ms",
                "scrapeTimeout": "500ms",
            },
            "idleWindow": f"{IDLE_WINDOW_S}s",
        },
        args=("--period", "1", "--no-lease"),
    )
    agent = node_agent(cluster, side, settings)
    env = DraAgentEnv(node, agent, metrics)
    try:
        node.write_vendor()
        env.write_metrics({g: None for g in node.gpu_ids})  # unknown until a test says: never idle
        if agent_mode() == "process":  # the chart brings the classes and the policies in pod mode
            node.apply_classes(claims_policy=True)
        agent.start()
        agent.wait_healthy()
        node.wait_published()
        yield env
    finally:
        for ns in ("spot", "team"):
            cluster.kubectl(
                "delete", "pods,resourceclaims", "-n", ns, "--all", "--wait=true", "--timeout=60s", check=False
            )
        agent.close()
        node.teardown()
        if not os.environ.get("GPUSHARE_KEEP_CLUSTER"):
            shutil.rmtree(side, ignore_errors=True)
