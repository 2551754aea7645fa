"""Simulated nodes next to a localcluster's real one: kwok runs them, the real control plane serves them.

kwok (sigs.k8s.io/kwok, built by ``make kwok`` into the cache) is a controller that plays
kubelet for Node objects it manages: it marks them Ready, renews their node Leases, turns a
pod bound to one into Running and finishes the deletion of a pod deleted there. The API
server, scheduler and controller-manager are the cluster's own, unchanged: a pod on a
simulated node is scheduled, bound and garbage-collected by the same code as anywhere.

kwok manages only the nodes labelled ``SIMULATED_LABEL`` (``--manage-nodes-with-label-selector``),
so the real node keeps its real kubelet. What kwok does to each object is given by Stages in its
config file (``stage_docs``), written here rather than taken from kwok's defaults so the test
decides every step a simulated pod takes:

- ``gs-node-ready``: a managed node that is not Ready becomes Ready and Running; its capacity
  is left as created (and as the node side patches it, ``tests/harness/worlds/sim_nodes.py``);
- ``gs-pod-running``: a scheduled, not deleted pod that is still Pending becomes Running and Ready;
- ``gs-pod-gone``: a pod with a deletionTimestamp is removed (no kubelet will ever confirm it).

Heartbeats are node Leases (``nodeLeaseDurationSeconds``): the node lifecycle controller
counts a renewed Lease as a heartbeat, so nodes stay Ready without a status write each.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from localcluster.agent import FAKE_RESOURCE, Process
from localcluster.cluster import Cluster
from localcluster.errors import ClusterError, ClusterUnavailable
from localcluster.paths import cache_dir

KWOK_VERSION = "v0.8.0"
SIMULATED_LABEL = "gpushare.test/simulated"
GPUS_PER_NODE = 8
# A renewal every quarter of this: 1,000 nodes cost 100 Lease writes every 10 s at 40 s.
NODE_LEASE_S = 40


def kwok_binary(cache: Path | None = None) -> Path:
    """The cached kwok binary, or ClusterUnavailable naming the command that builds it."""
    path = (cache or cache_dir()) / "kwok" / KWOK_VERSION / "bin" / "kwok"
    if not path.is_file():
        raise ClusterUnavailable(f"kwok {KWOK_VERSION} is not built ({path} is missing); build it with: make kwok")
    return path


def _stage(name: str, kind: str, match: list[dict[str, Any]], nxt: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "Stage",
        "metadata": {"name": name},
        "spec": {
            "resourceRef": {"apiGroup": "v1", "kind": kind},
            "selector": {"matchExpressions": match},
            "next": nxt,
        },
    }


_NODE_READY = """\
conditions:
- type: Ready
  status: "True"
  reason: KwokReady
  message: simulated by kwok
  lastHeartbeatTime: {{ Now | Quote }}
  lastTransitionTime: {{ Now | Quote }}
{{ range list "MemoryPressure" "DiskPressure" "PIDPressure" "NetworkUnavailable" }}
- type: {{ . }}
  status: "False"
  reason: KwokReady
  message: simulated by kwok
  lastHeartbeatTime: {{ Now | Quote }}
  lastTransitionTime: {{ Now | Quote }}
{{ end }}
nodeInfo:
  architecture: amd64
  operatingSystem: linux
  kubeletVersion: kwok-simulated
  containerRuntimeVersion: kwok-simulated
phase: Running
"""

_POD_RUNNING = """\
phase: Running
conditions:
{{ range list "PodScheduled" "Initialized" "ContainersReady" "Ready" }}
- type: {{ . }}
  status: "True"
  lastTransitionTime: {{ Now | Quote }}
{{ end }}
containerStatuses:
{{ range .spec.containers }}
- name: {{ .name | Quote }}
  image: {{ .image | Quote }}
  ready: true
  started: true
  restartCount: 0
  state:
    running:
      startedAt: {{ Now | Quote }}
{{ end }}
startTime: {{ Now | Quote }}
"""


def stage_docs() -> list[dict[str, Any]]:
    """What kwok does to simulated nodes and their pods (see the module docstring)."""
    not_ready = {
        "key": '.status.conditions.[] | select( .type == "Ready" ) | .status',
        "operator": "NotIn",
        "values": ["True"],
    }
    return [
        _stage("gs-node-ready", "Node", [not_ready], {"statusTemplate": _NODE_READY}),
        _stage(
            "gs-pod-running",
            "Pod",
            [
                {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"},
                {"key": ".status.phase", "operator": "In", "values": ["Pending"]},
            ],
            {"statusTemplate": _POD_RUNNING},
        ),
        _stage("gs-pod-gone", "Pod", [{"key": ".metadata.deletionTimestamp", "operator": "Exists"}], {"delete": True}),
    ]


def kwok_config_text() -> str:
    options = {
        "manageNodesWithLabelSelector": f"{SIMULATED_LABEL}=true",
        "nodeLeaseDurationSeconds": NODE_LEASE_S,
        "cidr": "10.200.0.0/16",
        "nodeIP": "10.201.0.1",
        # kwok applies no defaults to a config file's options: every worker count is given here.
        "podPlayStageParallelism": 8,
        "nodePlayStageParallelism": 4,
        "nodeLeaseParallelism": 8,
        "podsOnNodeSyncParallelism": 2,
    }
    config = {"apiVersion": "config.kwok.x-k8s.io/v1alpha1", "kind": "KwokConfiguration", "options": options}
    return yaml.safe_dump_all([config, *stage_docs()], sort_keys=False)


def node_manifest(
    name: str,
    *,
    gpus: int = GPUS_PER_NODE,
    resource: str | None = FAKE_RESOURCE,
    cpu: str = "64",
    memory: str = "512Gi",
) -> dict[str, Any]:
    """A simulated node with ``gpus`` of the fake vendor resource, as the vendor plugin would advertise;
    ``resource`` None: none (a DRA node, whose GPUs are in ResourceSlices instead)."""
    capacity = {"cpu": cpu, "memory": memory, "pods": "110"}
    if resource is not None:
        capacity[resource] = str(gpus)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {SIMULATED_LABEL: "true", "kubernetes.io/hostname": name, "kubernetes.io/os": "linux"},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
        },
        "status": {"capacity": capacity, "allocatable": dict(capacity)},
    }


def sim_node_names(count: int) -> list[str]:
    return [f"sim-{i:04d}" for i in range(count)]


def _parallel(calls: Iterable[Any], workers: int = 8) -> None:
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        for future in [pool.submit(c) for c in calls]:
            future.result()


class Kwok:
    """kwok against one cluster: ``start()``, ``add_nodes(n)``, ``stop()``.

    The process names the cluster's kubeconfig on its command line, so the cluster's own
    teardown (which ends every process naming its root) ends a kwok whose owner was killed.
    """

    def __init__(self, cluster: Cluster, side: Path, *, binary: Path | None = None) -> None:
        self.cluster = cluster
        self.side = side
        self.binary = binary or kwok_binary()
        self.config_path = side / "kwok.yaml"
        argv = [str(self.binary), f"--kubeconfig={cluster.kubeconfig}", f"--config={self.config_path}"]
        self.process = Process("kwok", argv, side / "kwok.log")
        self.nodes: list[str] = []

    def start(self) -> None:
        self.side.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(kwok_config_text())
        self.process.start()

    def stop(self) -> None:
        self.process.stop()

    def __enter__(self) -> Kwok:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def add_nodes(self, names: Sequence[str], *, gpus: int = GPUS_PER_NODE, timeout_s: float = 300.0) -> None:
        """Create the simulated nodes and wait until every one is Ready and schedulable."""
        self.create_nodes([node_manifest(n, gpus=gpus) for n in names], timeout_s=timeout_s)

    def create_nodes(self, manifests: Sequence[Mapping[str, Any]], *, timeout_s: float | None = None) -> None:
        """Create nodes of any shape (``node_manifest``) and wait until every one is Ready and schedulable.

        The API server taints every new node not-ready (TaintNodesByCondition) and the node lifecycle
        controller lifts the taint once kwok reports Ready, about 4 nodes a second on a 2-core machine:
        the default wait grows with the count (1,213 nodes took 5.5 minutes)."""
        _parallel(lambda m=m: self.cluster.request("POST", "/api/v1/nodes", dict(m)) for m in manifests)
        names = [str(m["metadata"]["name"]) for m in manifests]
        self.nodes += names
        self.wait_ready(names, timeout_s if timeout_s is not None else max(300.0, 0.5 * len(names)))

    def wait_ready(self, names: Sequence[str], timeout_s: float) -> None:
        wanted = set(names)
        deadline = time.monotonic() + timeout_s
        while True:
            if not self.process.alive():
                raise ClusterError(f"kwok exited; {self.process.log_path}:\n{self.process.log_text()[-3000:]}")
            missing = wanted - {str(n["metadata"]["name"]) for n in self.simulated_nodes() if _schedulable(n)}
            if not missing:
                return
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"{len(missing)} simulated nodes not Ready after {timeout_s:.0f}s (e.g. {sorted(missing)[:3]}); "
                    f"kwok log {self.process.log_path}:\n{self.process.log_text()[-2000:]}"
                )
            time.sleep(1.0)

    def simulated_nodes(self) -> list[dict[str, Any]]:
        doc = self.cluster.request("GET", f"/api/v1/nodes?labelSelector={SIMULATED_LABEL}%3Dtrue")
        return list(doc.get("items") or [])

    def delete_nodes(self, timeout_s: float = 120.0) -> None:
        """Remove every simulated node and wait until they are gone: a node left behind without
        kwok would still offer its fake GPUs to the next test's pods until it is marked NotReady."""
        names = [str(n["metadata"]["name"]) for n in self.simulated_nodes()]
        _parallel(lambda n=n: self._delete_node(n) for n in names)
        deadline = time.monotonic() + timeout_s
        while left := self.simulated_nodes():
            if time.monotonic() > deadline:
                raise ClusterError(f"{len(left)} simulated nodes still there after {timeout_s:.0f}s")
            time.sleep(0.5)
        self.nodes = []

    def _delete_node(self, name: str) -> None:
        try:
            self.cluster.request("DELETE", f"/api/v1/nodes/{name}")
        except ClusterError as e:
            if "HTTP 404" not in str(e):
                raise


def _schedulable(node: Mapping[str, Any]) -> bool:
    """Ready, and without the not-ready taint the node lifecycle controller lifts once it sees Ready."""
    conditions = (node.get("status") or {}).get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    taints = (node.get("spec") or {}).get("taints") or []
    return ready and not any(t.get("effect") in ("NoSchedule", "NoExecute") for t in taints)


__all__ = [
    "GPUS_PER_NODE",
    "KWOK_VERSION",
    "SIMULATED_LABEL",
    "Kwok",
    "kwok_binary",
    "kwok_config_text",
    "node_manifest",
    "sim_node_names",
    "stage_docs",
]
