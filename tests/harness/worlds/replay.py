"""A trace replay's world: the trace's nodes as kwok nodes, gpushare as each mode installs it, the real scheduler.

Used by ``bench/trace_replay.py`` and ``tests/integration/replay``. Two kinds of node, one per
family of modes, each made once and reused by every run of its family:

- **device plugins** (``exclusive``, ``share-gpu``): each node offers its trace GPUs as the fake
  vendor's extended resource, as NVIDIA's device plugin would; the real ``gpushare agent`` runs as
  the leader and plans shadows, and the node side of every simulated node is the agent's own
  node-pass code (``ScaleWorld``, ``tests/harness/worlds/scale.py``), which advertises each
  Running shadow's slots;
- **DRA** (``dra-share-gpu``, ``dra-exact``): no extended resource; each node's ResourceSlices are
  the DRA driver's own pool (``draplugin.pool.build_pool``, written by its ``SlicePublisher``), and
  the DeviceClasses are the chart's, rendered by the real helm. The scheduler allocates; kwok
  runs the pods (nothing needs preparing on a simulated node).

A run creates the workload's pods in order, four creates in flight, so the scheduler's queue
takes them first come first served as the paper's simulator does, and waits until the cluster
has settled: every pod bound or found unschedulable by the scheduler, and nothing changed for
``quiet_s``. It reads what it needs from two watches (the product's ``PodCache``), so waiting
costs the API server nothing; the outcome is read once, after.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.replay.modes import NAMESPACE, Mode
from bench.replay.trace import TraceNode
from controller.core.pod_facts import PodRef
from controller.errors import KubeError
from controller.io.kube_client import KubeClient
from controller.io.pod_cache import PodCache
from draplugin.inventory import Gpu
from draplugin.pool import PoolShape, build_pool
from draplugin.publisher import SlicePublisher
from gpushare import installation, keys
from localcluster.agent import FAKE_RESOURCE
from localcluster.cluster import Cluster
from localcluster.errors import ClusterError
from localcluster.kwok import SIMULATED_LABEL, Kwok, node_manifest, sim_node_names
from tests.harness.worlds.dra import device_classes
from tests.harness.worlds.scale import ScaleWorld

# The product's default (shadowIdleTimeout): a replay runs shorter, so no shadow is collected
# during one, as the paper's "no task leaves".
SHADOW_IDLE_S = 600.0
# The DRA pool each simulated node publishes: the default 1/N specs, no development slots and no
# lending (neither is offered to the trace's tasks), so a GPU is 16 devices instead of 47.
DRA_SHAPE = PoolShape(share_specs=(2, 3, 4, 5), dev_share_specs=(), spot=False)
NODE_SELECTOR = {SIMULATED_LABEL: "true"}
_POLL_S = 2.0


def trace_node_manifest(node: TraceNode, name: str, *, dra: bool) -> dict[str, Any]:
    """A trace node as a simulated node: its CPU, memory and GPUs (as the vendor's resource, or none
    on a DRA node), with the trace's model as a label."""
    manifest = node_manifest(
        name,
        gpus=node.gpus,
        resource=None if dra else FAKE_RESOURCE,
        cpu=f"{node.cpu_milli}m",
        memory=f"{node.memory_mib}Mi",
    )
    manifest["metadata"]["labels"]["replay.gpushare.test/model"] = node.model
    return manifest


def _condition(pod: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return dict(c)
    return {}


def decided(pod: Mapping[str, Any]) -> bool:
    """Bound, or tried by the scheduler and found unschedulable."""
    if (pod.get("spec") or {}).get("nodeName"):
        return True
    return _condition(pod, "PodScheduled").get("status") == "False"


class ReplayWorld:
    """One family's nodes over a running cluster; ``run`` replays one workload, ``clear`` empties it."""

    def __init__(self, cluster: Cluster, side: Path, nodes: Sequence[TraceNode], *, dra: bool) -> None:
        self.cluster = cluster
        self.side = side
        self.dra = dra
        self.trace_nodes = list(nodes)
        # The device-plugin family's nodes are the scale world's (sim-0000, ...); DRA nodes get names of
        # their own, so a family that follows the other on one cluster never waits on a node of the same
        # name still being torn down (a node recreated at once stayed tainted not-ready).
        self.names = [f"sim-dra-{i:04d}" for i in range(len(nodes))] if dra else sim_node_names(len(nodes))
        self.gpus = {name: n.gpus for name, n in zip(self.names, nodes, strict=True)}
        self.client = KubeClient.from_kubeconfig(str(cluster.kubeconfig))
        self.scale: ScaleWorld | None = None
        self.kwok: Kwok | None = None
        self.slice_writes = 0
        by_name = dict(zip(self.names, nodes, strict=True))

        def manifest(name: str) -> dict[str, Any]:
            return trace_node_manifest(by_name[name], name, dra=dra)

        self._manifest = manifest

    # -- setup --------------------------------------------------------------------------------

    def start(self) -> None:
        with contextlib.suppress(ClusterError):
            self.cluster.request("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
        if not self.dra:
            self.scale = ScaleWorld(self.cluster, self.side, idle_s=SHADOW_IDLE_S, node_manifest=self._manifest)
            self.scale.start(len(self.names))
            self.kwok = self.scale.kwok
            return
        self.kwok = Kwok(self.cluster, self.side)
        self.kwok.start()
        self.kwok.create_nodes([self._manifest(n) for n in self.names])
        for doc in device_classes():
            with contextlib.suppress(ClusterError):  # left by an earlier world on this cluster
                self.cluster.request("DELETE", f"/apis/resource.k8s.io/v1/deviceclasses/{doc['metadata']['name']}")
            self.cluster.request("POST", "/apis/resource.k8s.io/v1/deviceclasses", doc)
        self._publish_slices()

    def _publish_slices(self) -> None:
        """Each node's pool, built and written by the DRA driver's own code, as its plugin would at start."""
        api = self.cluster.api()
        try:

            def publish(name: str) -> int:
                gpus = [Gpu(i, (f"example.com/gpu={name}-gpu{i}",), ()) for i in range(self.gpus[name])]
                pool = build_pool(keys.DRA_DRIVER, name, gpus, DRA_SHAPE)
                publisher = SlicePublisher(api, driver=keys.DRA_DRIVER, node=name, desired=lambda: pool)
                publisher.reconcile()
                return publisher.writes

            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                self.slice_writes = sum(pool.map(publish, self.names))
        finally:
            api.close()

    def close(self) -> None:
        """Undo everything this world made; nodes last (their slices go with them)."""
        try:
            with contextlib.suppress(Exception):
                self.clear(timeout_s=300)
        finally:
            try:
                if self.scale is not None:
                    self.scale.close()
                elif self.kwok is not None:
                    try:
                        self.kwok.delete_nodes(timeout_s=300)
                    finally:
                        self.kwok.stop()
            finally:
                if self.dra:
                    for doc in device_classes():
                        with contextlib.suppress(ClusterError):
                            self.cluster.request(
                                "DELETE", f"/apis/resource.k8s.io/v1/deviceclasses/{doc['metadata']['name']}"
                            )
                self.client.close()

    # -- one run ------------------------------------------------------------------------------

    def run(
        self,
        mode: Mode,
        tasks: Sequence[tuple[Mapping[str, Any] | None, Mapping[str, Any]]],
        *,
        quiet_s: float = 20.0,
        timeout_s: float = 3600.0,
        progress: Callable[[str], None] | None = None,
    ) -> float:
        """Create each task's claim (if it has one) and pod, in order, and wait until the cluster settled;
        the seconds from the first create."""
        if mode.dra != self.dra:
            raise ValueError(f"mode {mode} does not run on {'DRA' if self.dra else 'device-plugin'} nodes")
        caches = [PodCache(self.client, namespace=NAMESPACE, resync_s=3600)]
        if mode.shadows:
            selector = f"{keys.LABEL_ROLE}={keys.ROLE_SHADOW}"
            caches.append(PodCache(self.client, namespace=installation.namespace(), label_selector=selector))
        stop = threading.Event()
        for cache in caches:
            threading.Thread(target=cache.run, args=(stop,), daemon=True, name="replay-watch").start()
        t0 = time.monotonic()
        try:
            self._create(tasks)
            self._settle(caches, len(tasks), quiet_s, t0 + timeout_s, progress)
        finally:
            stop.set()
        return time.monotonic() - t0

    def _create(self, tasks: Sequence[tuple[Mapping[str, Any] | None, Mapping[str, Any]]]) -> None:
        claims = f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims"

        def create(claim: Mapping[str, Any] | None, pod: Mapping[str, Any]) -> None:
            if claim is not None:
                self.cluster.request("POST", claims, claim)
            self.client.create_pod(pod)

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            for done in [pool.submit(create, c, p) for c, p in tasks]:
                done.result()

    def _settle(
        self,
        caches: Sequence[PodCache],
        count: int,
        quiet_s: float,
        deadline: float,
        progress: Callable[[str], None] | None,
    ) -> None:
        last: tuple[int, ...] = ()
        since = time.monotonic()
        while True:
            views = [c.view() for c in caches]
            tasks = views[0].pods
            bound = sum(1 for p in tasks if (p.get("spec") or {}).get("nodeName"))
            open_ = sum(1 for v in views for p in v.pods if not decided(p))
            shadows = len(views[1].pods) if len(views) > 1 else 0
            state = (len(tasks), bound, open_, shadows)
            now = time.monotonic()
            if state != last:
                last, since = state, now
                if progress is not None:
                    progress(f"{len(tasks)}/{count} created, {bound} bound, {open_} not yet tried, {shadows} shadows")
            elif len(tasks) == count and not open_ and now - since >= quiet_s:
                return
            if now > deadline:
                raise ClusterError(f"the replay did not settle: {state} (created, bound, untried, shadows)")
            if self.scale is not None and not self.scale.agent.alive():
                raise ClusterError(f"the agent exited:\n{self.scale.agent.log_text()[-3000:]}")
            time.sleep(_POLL_S)

    # -- what it came to ---------------------------------------------------------------------------

    def pods(self) -> list[dict[str, Any]]:
        return self.client.list_pods(namespace=NAMESPACE)[0]

    def shadows(self) -> list[dict[str, Any]]:
        selector = f"{keys.LABEL_ROLE}={keys.ROLE_SHADOW}"
        return self.client.list_pods(namespace=installation.namespace(), label_selector=selector)[0]

    def claims(self) -> list[dict[str, Any]]:
        doc = self.cluster.request("GET", f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims")
        return list(doc.get("items") or [])

    def refused(self) -> set[str]:
        """Sharers the simulated nodes' device manager had no slot for (kubelet would refuse them)."""
        side = self.scale.node_side if self.scale is not None else None
        return set(side.refused) if side is not None else set()

    # -- between runs -----------------------------------------------------------------------------

    def clear(self, timeout_s: float = 600.0) -> None:
        """Every task, shadow and claim gone, and no node offering a slot: the next run starts
        on empty nodes."""
        deadline = time.monotonic() + timeout_s
        self._delete(self.pods())
        with contextlib.suppress(ClusterError):
            self.cluster.request("DELETE", f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims")
        self._wait("the replay's pods gone", lambda: not self.pods(), deadline)
        if self.scale is not None:
            # Until the leader has seen the sharers go it may still make a shadow for one that was
            # pending: delete what is there until nothing is.
            self._wait("every shadow gone", self._shadows_deleted, deadline)
            self._wait("no slots advertised", self._no_slots, deadline)
        if self.dra:
            self._wait("every claim gone", lambda: not self.claims(), deadline)

    def _shadows_deleted(self) -> bool:
        left = self.shadows()
        self._delete(left)
        return not left

    def _no_slots(self) -> bool:
        side = self.scale.node_side if self.scale is not None else None
        return side is None or not any(
            devices for name in self.names for r, devices in side.capacity(name).items() if r != FAKE_RESOURCE
        )

    def _delete(self, pods: Sequence[Mapping[str, Any]]) -> None:
        def delete(pod: Mapping[str, Any]) -> None:
            meta = pod["metadata"]
            with contextlib.suppress(KubeError):  # gone already
                self.client.delete_pod(PodRef(meta["namespace"], meta["name"], meta["uid"]), grace_period_s=0)

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(delete, pods))

    @staticmethod
    def _wait(what: str, ok: Callable[[], bool], deadline: float) -> None:
        while not ok():
            if time.monotonic() > deadline:
                raise ClusterError(f"timed out waiting for {what}")
            time.sleep(1.0)


@contextlib.contextmanager
def replay_world(cluster: Cluster, side: Path, nodes: Sequence[TraceNode], *, dra: bool) -> Iterator[ReplayWorld]:
    world = ReplayWorld(cluster, side, nodes, dra=dra)
    try:
        world.start()
        yield world
    finally:
        world.close()


__all__ = ["DRA_SHAPE", "NODE_SELECTOR", "ReplayWorld", "decided", "replay_world", "trace_node_manifest"]
