"""The node side of simulated nodes: what gpushare's agent and kubelet's device manager would do there.

kwok (``localcluster/kwok.py``) plays kubelet's pod lifecycle on a simulated node, but no
agent runs there, so nothing would advertise share capacity or write the records the
leader reads. ``SimulatedNodeAgents`` does both, with the product's own code, once per
node whose pods changed:

- **capacity**: ``plan_node_shares`` (the agent's node pass) decides each share resource's
  device list from the node's Running shadows; the product's ``Applier`` hands it to a
  ``DevicePlugins`` that, instead of a gRPC ListAndWatch, writes the count into the node's
  ``status.capacity`` and ``status.allocatable`` (what kubelet does with a plugin's list);
- **allocation**: kubelet's device manager picks a bound sharer's slots among the advertised
  ones, with the share plugin's own preference (``deviceplugins.policies.prefer_share``); the
  result is the node's PodResources rows;
- **records**: from those rows ``MappingCache`` and ``plan_node_shares`` derive the users
  record on each shadow and the owner record on each sharer, which the ``Applier`` writes
  as the agent does; a sharer whose shadow is gone is evicted the same way;
- **draining**: the node pass is the agent's own (``controller.node_pass.plan_node``), so a
  draining shadow's slots stay advertised for the settle time after the lower count is
  published, and are withdrawn only when a fresh LIST of the node's pods shows no sharer
  waiting for them, as on a real node. A simulated node has no kubelet writing its count
  back, so nothing else holds a withdrawal.

It reads pods with the product's ``PodCache`` (one list+watch over every pod) in a thread
of the test process, through ``NodeIndexedPodCache``, which keeps them indexed by node so that
a pass costs what changed, not every pod of the cluster; the same watch tells an observer
(``PodObserver``, the benchmark's stage clock) when each pod reached each stage.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from controller.applier import Applier
from controller.core.actions import PublishCapacity
from controller.core.mapping import MappingCache
from controller.core.model import PodResourcesEntry, build_snapshot
from controller.core.pod_facts import PodRef
from controller.io.kube_client import KubeClient, WatchEvent
from controller.io.pod_cache import PodCache
from controller.node_pass import PassParts, plan_node
from controller.share.shadow_drain import is_drained, is_draining
from deviceplugins.policies import prefer_share
from gpushare import keys
from gpushare.config import Config
from localcluster.cluster import Cluster

log = logging.getLogger(__name__)

_TERMINAL = ("Succeeded", "Failed")
WORKERS = 8


class PodObserver(Protocol):
    """Told, on the node side's own threads, what its watch sees and what its nodes publish."""

    def pod_seen(self, event: str, pod: Mapping[str, Any], at: float) -> None:
        """A pod as a watch event (``ADDED``, ``MODIFIED``, ``DELETED``) or a LIST (``LISTED``) showed it."""

    def capacity_published(self, node: str, resource: str, count: int, at: float) -> None:
        """A node's status now shows ``count`` of ``resource``."""


def _pod_key(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def _node_of(pod: Mapping[str, Any]) -> str:
    return str((pod.get("spec") or {}).get("nodeName") or "")


@dataclass(frozen=True)
class DueNodes:
    """What one node-side pass takes from the cache: the nodes whose pods changed, with their pods."""

    fresh: bool  # a full LIST replaced the cache since the previous take: every node is due
    pods: dict[str, tuple[Mapping[str, Any], ...]]  # due node -> its pods now
    deleted_shadows: frozenset[PodRef]  # shadows seen DELETED on the watch since the last full LIST


class NodeIndexedPodCache(PodCache):
    """The product's ``PodCache``, its pods also indexed by node, with the nodes changed since the last take.

    A pass over a thousand nodes would otherwise walk every pod of the cluster on every wake,
    and a burst wakes it back to back. The base class's bookkeeping is unchanged: the index is
    kept beside it, under the same lock (re-entrant here, so ``apply`` can hold it around the
    base class's). After a full LIST the next take rebuilds the index from the cache and names
    every node, as a fresh view makes every node's pass due.
    """

    def __init__(
        self, client: KubeClient, *, on_change: Callable[[], None], observer: PodObserver | None = None
    ) -> None:
        super().__init__(client, on_change=on_change)
        self._lock = threading.RLock()  # type: ignore[assignment]  # held around the base class's apply
        self._observer = observer
        self._on_node: dict[str, dict[str, Mapping[str, Any]]] = {}
        self._indexed_node: dict[str, str] = {}  # pod key -> the node it is indexed under
        self._changed: set[str] = set()
        self._deleted_shadows: set[PodRef] = set()

    def relist(self) -> None:
        super().relist()
        if self._observer is not None:
            at = time.monotonic()
            with self._lock:
                pods = list(self._pods.values())
            for pod in pods:
                self._observer.pod_seen("LISTED", pod, at)

    def apply(self, event: WatchEvent) -> None:
        at = time.monotonic()
        with self._lock:
            super().apply(event)
            if event.type != "BOOKMARK":
                self._index(event)
        if self._observer is not None and event.type != "BOOKMARK":
            self._observer.pod_seen(event.type, event.obj, at)

    def _index(self, event: WatchEvent) -> None:
        """Under the lock: the pod's old node and its new one are due (a deletion: the old one).

        A pod that stays on its node keeps its place there, as it does in the cache: the node's
        pods reach its pass in the order the base class's view would give them."""
        key = _pod_key(event.obj)
        node = "" if event.type == "DELETED" else _node_of(event.obj)
        old = self._indexed_node.get(key)
        if old is not None and old == node:
            self._on_node[old][key] = event.obj
            self._changed.add(old)
            return
        if old is not None:
            del self._indexed_node[key]
            self._on_node[old].pop(key, None)
            self._changed.add(old)
        if event.type == "DELETED":
            meta = event.obj.get("metadata") or {}
            if meta.get("namespace") == keys.DEFAULT_NAMESPACE:
                self._deleted_shadows.add(
                    PodRef(keys.DEFAULT_NAMESPACE, str(meta.get("name", "")), str(meta.get("uid", "")))
                )
            return
        if node:
            self._on_node.setdefault(node, {})[key] = event.obj
            self._indexed_node[key] = node
            self._changed.add(node)

    def _reindex(self) -> None:
        """Under the lock, after a full LIST: the index from the cache itself."""
        self._on_node, self._indexed_node = {}, {}
        for key, pod in self._pods.items():
            if node := _node_of(pod):
                self._on_node.setdefault(node, {})[key] = pod
                self._indexed_node[key] = node
        self._changed = set(self._on_node)
        self._deleted_shadows = {r for r in self._deleted if r.namespace == keys.DEFAULT_NAMESPACE}

    def take_due(self, also: Iterable[str] = ()) -> DueNodes | None:
        """The nodes changed since the last take, and ``also``, with their pods; None before the first LIST."""
        with self._lock:
            if not self._synced:
                return None
            fresh, self._fresh = self._fresh, False
            if fresh:
                self._reindex()
            due, self._changed = self._changed | set(also), set()
            pods = {n: tuple(self._on_node.get(n, {}).values()) for n in due}
            return DueNodes(fresh, pods, frozenset(self._deleted_shadows))


class NodeStatusPlugins:
    """``DevicePlugins`` for a node without kubelet: a device list becomes the node's capacity.

    ``core``: a ``kubernetes.client.CoreV1Api`` (pooled connections: a node side patches
    hundreds of nodes at once); without one, each patch is a ``Cluster.request``.
    """

    def __init__(self, cluster: Cluster, node: str, core: Any = None, observer: PodObserver | None = None) -> None:
        self.cluster = cluster
        self.node = node
        self._core = core
        self._observer = observer
        self.devices: dict[str, tuple[str, ...]] = {}
        self.published: dict[str, int] = {}  # the count the node's status shows, as this side wrote it
        self.patches = 0

    def set_devices(self, resource: str, devices: Iterable[Any]) -> None:
        ids = tuple(d.id for d in devices)
        before = self.devices.get(resource)
        self.devices[resource] = ids
        if not ids and not before:
            return  # no capacity and none published: the scheduler reads absent as 0
        self._write(resource, len(ids))

    def publish(self, resource: str, count: int) -> bool:
        """The agent's lowering of a draining shadow's count; like the agent's, it never raises one.

        A real node's kubelet would write the full count back at its next status; this node
        side writes a count only when the list changes, so the lowering stays until then.
        """
        if self.published.get(resource, 0) <= count:
            return False
        self._write(resource, count)
        return True

    def publish_listed(self, held: Iterable[str]) -> None:
        """Kubelet's own node status: each resource's count is its list's again, except those ``held``.

        A real kubelet writes the list's count back at every status; without this, a count a
        drain lowered stayed low after the drain was called off (a sharer landed on the shadow),
        and the scheduler never again offered that shadow's free slots.
        """
        for resource, ids in self.devices.items():
            if resource not in held and resource in self.published and self.published[resource] != len(ids):
                self._write(resource, len(ids))

    def _write(self, resource: str, count: int) -> None:
        body = {"status": {"capacity": {resource: str(count)}, "allocatable": {resource: str(count)}}}
        if self._core is not None:
            self._core.patch_node_status(self.node, body, _request_timeout=30)
        else:
            self.cluster.request("PATCH", f"/api/v1/nodes/{self.node}/status", body, "application/merge-patch+json")
        self.published[resource] = count
        self.patches += 1
        if self._observer is not None:
            self._observer.capacity_published(self.node, resource, count, time.monotonic())

    def set_spot_health(self, real_id: str, healthy: bool) -> None:
        return None

    def set_spot_lent(self, real_ids: Iterable[str]) -> None:
        return None

    def real_devices(self) -> dict[str, tuple[str, ...]]:
        return {}

    def vendor_unhealthy(self) -> dict[str, str]:
        return {}

    def set_real_devices(self, real_resource: str, devices: Any) -> None:
        return None

    def status(self) -> dict[str, dict[str, Any]]:
        return {r: {"devices": len(ids), "healthy": len(ids), "registered": True} for r, ids in self.devices.items()}


class CountingWriter:
    """The agent's writes through ``KubeClient``, counted: what the node agents would ask of the API server."""

    def __init__(self, client: KubeClient) -> None:
        self._client = client
        self._lock = threading.Lock()
        self.requests = 0

    def _count(self) -> None:
        with self._lock:
            self.requests += 1

    def list_node_pods(self, node: str) -> list[dict[str, Any]]:
        """The fresh LIST a node agent takes before it withdraws a draining shadow's slots."""
        self._count()
        return self._client.list_pods(field_selector=f"spec.nodeName={node}")[0]

    def create_pod(self, manifest: Mapping[str, Any]) -> dict[str, Any] | None:
        self._count()
        return self._client.create_pod(manifest)

    def delete_pod(self, ref: PodRef) -> bool:
        self._count()
        return self._client.delete_pod(ref)

    def patch_pod_annotations(self, ref: PodRef, annotations: Mapping[str, str | None]) -> bool:
        self._count()
        return self._client.patch_pod_annotations(ref, annotations)

    def record_event(
        self, ref: PodRef, reason: str, message: str, *, type_: Literal["Normal", "Warning"] = "Normal"
    ) -> None:
        self._count()
        self._client.record_event(ref, reason, message, type_=type_)

    def record_node_event(
        self, node: str, reason: str, message: str, *, type_: Literal["Normal", "Warning"] = "Normal"
    ) -> None:
        self._count()
        self._client.record_node_event(node, reason, message, type_=type_)


def _share_requests(pod: Mapping[str, Any]) -> list[tuple[str, str, int]]:
    """(container, share resource, count) for each share resource a container asks for."""
    out = []
    for c in (pod.get("spec") or {}).get("containers") or ():
        limits = (c.get("resources") or {}).get("limits") or {}
        for resource, value in limits.items():
            if keys.parse_share_resource(resource) is not None:
                out.append((str(c.get("name", "")), resource, int(value)))
    return out


@dataclasses.dataclass
class _Node:
    """One simulated node's agent state: its applier (what it advertised), its allocations."""

    cfg: Config
    plugins: NodeStatusPlugins
    applier: Applier
    # pod uid -> the rows kubelet would report for it
    allocated: dict[str, list[PodResourcesEntry]] = dataclasses.field(default_factory=dict)
    # (uid, resourceVersion) of its pods at the last pass; None: pass it again whatever its pods are
    # (an empty set would not do: a node whose last pod just went has exactly that).
    seen: frozenset[tuple[str, str]] | None = frozenset()
    timers: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)  # the agent's state file


class SimulatedNodeAgents:
    """Node passes for every simulated node; ``start()`` a thread, ``stop()`` it."""

    def __init__(
        self,
        cluster: Cluster,
        cfg: Config,
        nodes: Sequence[str],
        *,
        client: KubeClient | None = None,
        clock: Callable[[], float] = time.time,
        observer: PodObserver | None = None,
    ) -> None:
        self.cluster = cluster
        self.cfg = cfg
        self._client = client or KubeClient.from_kubeconfig(str(cluster.kubeconfig))
        self._owns_client = client is None
        self._clock = clock
        self._observer = observer
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._cache = NodeIndexedPodCache(self._client, on_change=self._wake.set, observer=observer)
        # Nodes a pass asked to be passed again with no pod event (a new list, a settle time).
        self._again: set[str] = set()
        self._again_lock = threading.Lock()
        # The node agents' own requests (records, evictions, Events); not the capacity patches,
        # which on a real node are kubelet's.
        self.writer = CountingWriter(self._client)
        self._api: Any = None
        self._core: Any = None
        if client is None:  # a live cluster: patch nodes over pooled connections
            import kubernetes  # noqa: PLC0415  (only the live node side needs the client library)

            self._api = cluster.api()
            self._api.configuration.connection_pool_maxsize = WORKERS
            self._core = kubernetes.client.CoreV1Api(self._api)
        self._nodes = {n: self._new_node(n) for n in nodes}
        self._threads: list[threading.Thread] = []
        self.passes = 0
        # Sharers bound where no advertised slot was free: kubelet would fail them with
        # UnexpectedAdmissionError; here they wait for a slot, and are remembered.
        self.refused: set[str] = set()

    def _new_node(self, name: str) -> _Node:
        plugins = NodeStatusPlugins(self.cluster, name, self._core, self._observer)
        # The node side writes the node's status itself, so it lowers a count without reading it.
        applier = Applier(
            client=self.writer,
            plugins=plugins,
            spot=None,
            is_leader=lambda: False,
            node_name=name,
            capacity=plugins.publish,
        )
        return _Node(dataclasses.replace(self.cfg, node_name=name), plugins, applier)

    def start(self) -> None:
        for name, target in (("watch", self._cache.run), ("nodes", self._run)):
            t = threading.Thread(target=target, args=(self._stop,), name=f"sim-node-agents-{name}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        for t in self._threads:
            t.join(timeout=90)
        if self._owns_client:
            self._client.close()
        if self._api is not None:
            self._api.close()

    def capacity(self, node: str) -> dict[str, tuple[str, ...]]:
        """The slots the node's share plugins list (what kubelet would admit sharers on)."""
        return dict(self._nodes[node].plugins.devices)

    def capacity_published(self, node: str) -> dict[str, int]:
        """The counts the node's status shows (what the scheduler places sharers by)."""
        return dict(self._nodes[node].plugins.published)

    def _run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self._wake.wait(1.0)
            self._wake.clear()
            if stop.is_set():
                return
            try:
                self.pass_once()
            except Exception:  # the next pass retries, as the agent's loop does
                log.exception("simulated node pass failed")

    def pass_once(self) -> None:
        with self._again_lock:
            again, self._again = self._again, set()
        taken = self._cache.take_due(also=again)
        if taken is None:
            return
        candidates = self._nodes if taken.fresh else [n for n in taken.pods if n in self._nodes]
        deleted = list(taken.deleted_shadows)
        due = []
        for name in candidates:
            state, pods = self._nodes[name], list(taken.pods.get(name, ()))
            seen = frozenset((str(p["metadata"].get("uid")), str(p["metadata"].get("resourceVersion"))) for p in pods)
            if seen != state.seen or taken.fresh:
                state.seen = seen
                due.append((state, pods))
        # Nodes are independent, as their agents are: their passes (mostly API writes) run side by side.
        with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:
            for done in [pool.submit(self._node_pass, st, pods, taken.fresh, deleted) for st, pods in due]:
                done.result()
        self.passes += 1

    def _node_pass(self, state: _Node, pods: list[Mapping[str, Any]], fresh: bool, deleted: list[Any]) -> None:
        now = self._clock()
        entries = self._allocate(state, pods)
        snap = build_snapshot(pods, state.cfg, pod_resources=entries, shadow_list_fresh=fresh, deleted_shadows=deleted)
        mapping = MappingCache.rebuild(snap.pod_resources, snap.pods, state.cfg.real_resources)
        pushed = state.plugins.patches
        parts = PassParts()
        node = plan_node(
            state.cfg,
            snap,
            mapping,
            now,
            parts=parts,
            spot=None,
            load=lambda kind: dict(state.timers.get(kind, {})),
            save=lambda kind, timers: state.timers.__setitem__(kind, dict(timers)),
            list_node_pods=functools.partial(self.writer.list_node_pods, state.cfg.node_name),
        )
        for action in node.actions:
            state.applier.apply(action, now)
        # What the pass publishes (a draining shadow's lower count) stays; the rest is kubelet's.
        state.plugins.publish_listed({a.resource for a in node.actions if isinstance(a, PublishCapacity)})
        settling = any(is_draining(s) and not is_drained(s) for s in snap.shadows_on(state.cfg.node_name))
        if state.plugins.patches != pushed or settling:
            # A new list can admit sharers that were waiting for it, and a settle time ends with
            # no pod event to mark it: pass this node again next time.
            state.seen = None
            with self._again_lock:
                self._again.add(state.cfg.node_name)
            self._wake.set()

    def _allocate(self, state: _Node, pods: list[Mapping[str, Any]]) -> list[PodResourcesEntry]:
        """kubelet's device manager: slots for newly bound sharers, freed for finished or gone pods."""
        live = {str(p["metadata"]["uid"]): p for p in pods if (p.get("status") or {}).get("phase") not in _TERMINAL}
        state.allocated = {uid: rows for uid, rows in state.allocated.items() if uid in live}
        taken = {vid for rows in state.allocated.values() for row in rows for vid in row.device_ids}
        for uid, pod in live.items():
            wants = _share_requests(pod)
            if not wants or uid in state.allocated:
                continue
            rows: list[PodResourcesEntry] = []
            for container, resource, count in wants:
                free = [v for v in state.plugins.devices.get(resource, ()) if v not in taken]
                chosen = prefer_share(free, [], count)
                if len(chosen) < count:
                    rows = []
                    meta = pod["metadata"]
                    self.refused.add(f"{meta.get('namespace')}/{meta.get('name')}")
                    break
                taken.update(chosen)
                meta = pod["metadata"]
                rows.append(PodResourcesEntry(meta["namespace"], meta["name"], container, resource, tuple(chosen)))
            if rows:
                state.allocated[uid] = rows
        return [row for rows in state.allocated.values() for row in rows]


__all__ = ["DueNodes", "NodeIndexedPodCache", "NodeStatusPlugins", "PodObserver", "SimulatedNodeAgents"]
