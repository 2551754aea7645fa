"""The reconcile loop: one level-triggered pass over immutable inputs, then the actions in order.

Inputs, each owned by its own named thread:

- ``gpushare-controller-watch-node``: the pods bound to this node (``PodCache``);
- ``-watch-node-status``: this node's Node object (``NodeWatch``), which lowers again at once a
  share count kubelet writes back while a shadow drains;
- with spot, ``-watch-namespaces``: the namespaces labelled lendable (``NamespaceCache``);
- while this agent holds the Lease, ``-watch-pending`` (unscheduled pods, cluster-wide) and
  ``-watch-shadows`` (every shadow in the installation's namespace) — started the first time it leads;
- ``gpushare-controller-lease``: renews the Lease ``gpushare-controller``;
- per pass, kubelet's PodResources ``List`` (the only source of who holds which device),
  and, when spot is wired in (``SpotHooks``), idle verdicts and kernel notices.

The pass (``gpushare-controller-loop``) copies those inputs into a ``Snapshot``, calls the
decision functions (the node's part, controller/node_pass.py: ``plan_spot`` and
``plan_node_shares``; while leader, controller/share/cluster_pass.py: ``plan_shadows``), each part
failing alone, and hands the returned actions, in list order, to the ``Applier``
(controller/applier.py); pods it cannot read are skipped, logged once, counted and told why. A
watch event, a Lease change or ``wake()`` asks for a pass at once; otherwise one runs at the
next deadline a plan computed (an idle owner's window ending) or after ``period_s``, whichever
is first. Events during a pass ask for one more (a burst costs one pass, not one each), which
starts after a rest in proportion to the last pass's CPU time (controller/pacing.py). Nothing is
remembered between passes but timers (SQLite) and what the applier keeps to write
idempotently; everything else is recomputed, so a lost update is repaired by the next pass.

With spot, a kernel notice is acted on before the pass it wakes (controller/spot/runtime.py):
the pass hands spot its return table each time (``SpotHooks.arm``), and on a return does the
rest (evictions, Events, ``undetect``).

``last_report()`` returns the frozen ``TickReport`` (controller/report.py) of the latest pass:
``gpushare status`` and ``/metrics`` read it and never wait for the loop.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from controller.applier import Applier, DevicePlugins
from controller.core.actions import RecordEvent
from controller.core.mapping import MappingCache
from controller.core.model import PodResourcesEntry, Snapshot, SnapshotMemo, build_snapshot
from controller.core.pod_problems import ProblemTracker
from controller.core.real_devices import kubelet_real_devices
from controller.io.kube_client import KubeClient
from controller.io.lease import LeaseElector
from controller.io.namespace_cache import NamespaceCache
from controller.io.pod_cache import CacheView, PodCache
from controller.io.podresources_entries import entries_from_pod_resources
from controller.io.shadow_devices import ShadowDevices
from controller.io.state import TIMER_SHADOW_EMPTY, StateStore
from controller.metrics.attribution import attribute
from controller.node_pass import NodePass, PassParts, plan_node
from controller.pacing import Pacer
from controller.report import TickReport, build_report, count_allocated, describe_node
from controller.share.cluster_pass import ClusterPass, plan_cluster
from controller.share.count_catch_up import CountCatchUp
from controller.share.node_watch import NodeWatch
from controller.share.placing import Placing
from controller.share.shadow_drain import WRITE_BACK_SETTLE_S, published_counts
from controller.spot.hooks import SpotHooks
from deviceplugins import AdvertisedDevice
from gpushare import installation, keys, rules
from gpushare.config import Config
from gpushare.errors import GpushareError
from gpushare.log import kv

log = logging.getLogger(__name__)


class PodResourcesLister(Protocol):
    """What the loop needs of ``PodResourcesClient``: kubelet's ``List`` answer (protobuf ``PodResources``)
    and its allocatable devices (resource -> IDs kubelet lists Healthy)."""

    def list(self) -> list[Any]: ...
    def allocatable(self) -> dict[str, tuple[str, ...]]: ...


class ReconcileLoop:
    """Owns its threads; ``start(stop)`` returns at once, ``join()`` waits for them after ``stop`` is set."""

    _lendable: NamespaceCache | None = None  # with spot, made by start(): the lendable namespaces' watch

    def __init__(
        self,
        cfg: Config,
        *,
        client: KubeClient,
        plugins: DevicePlugins,
        podresources: PodResourcesLister,
        state_dir: str | None = None,
        elector: LeaseElector | None = None,
        spot: SpotHooks | None = None,
        period_s: float = 2.0,
        resync_s: float = 300.0,
        clock: Callable[[], float] = time.time,
        shadow_devices: ShadowDevices | None = None,
    ) -> None:
        if not cfg.node_name:
            raise GpushareError("gpushare: the loop needs nodeName (config nodeName or the NODE_NAME variable)")
        self.cfg = cfg
        self._client = client
        self._plugins = plugins
        self._podres = podresources
        self._real_devices: dict[str, tuple[AdvertisedDevice, ...]] = {}
        self._shadow_devices = shadow_devices
        # SQLite objects belong to the thread that opened them: the loop thread opens the store.
        self._state_dir = state_dir
        self._store: StateStore | None = None
        self._elector, self._spot = elector, spot
        # The leader's reads of pods from its last pass (after one pod event, one pod is read again),
        # and the sharers it saw pending (controller/share/placing.py).
        self._cluster_memo = SnapshotMemo()
        self._placing: Placing = {}
        self.period_s, self._clock = period_s, clock
        self._wake, self._stop, self._pacer = threading.Event(), threading.Event(), Pacer()
        self._threads: list[threading.Thread] = []
        self._node = PodCache(
            client, field_selector=rules.on_node_selector(cfg.node_name), resync_s=resync_s, on_change=self.wake
        )
        self._pending = PodCache(
            client, field_selector=rules.PENDING_UNBOUND_SELECTOR, resync_s=resync_s, on_change=self.wake
        )
        self._shadows = PodCache(
            client,
            namespace=installation.namespace(),
            label_selector=rules.SHADOW_SELECTOR,
            resync_s=resync_s,
            on_change=self.wake,
        )
        # The pass's clock: the times it keeps are compared with the pass's ``now``.
        self._node_status = NodeWatch(client, cfg.node_name, resync_s=resync_s, clock=clock)
        # Device-plugin nodes only: on a DRA node the share resources are DRA's, not kubelet's devices.
        self._count_catch_up = (
            None if cfg.dra.enabled else CountCatchUp(podresources.allocatable, self._node_status.catch_up)
        )
        self._applier = Applier(
            client=client,
            plugins=plugins,
            spot=spot,
            is_leader=self.is_leader,
            store=lambda: self._store,
            node_name=cfg.node_name,
            capacity=self._node_status.lower,
            offered=self._count_catch_up.offered if self._count_catch_up is not None else None,
            created=self._shadows.assume,
        )
        self._cluster_started = False
        self._carry_fresh = False  # a full LIST not yet used by a node pass (PodResources was down)
        self._report, self._passes = TickReport(), 0
        self._problems_logged: set[str] = set()  # kubelet rows the mapping could not read, last pass
        self._pod_problems = ProblemTracker()
        self._mem_timers: dict[str, dict[str, float]] = {}  # timers when no StateStore is given
        self._next_due: float | None = None  # wall clock at which a plan asked for the next pass

    # -- threads ---------------------------------------------------------------------------------

    def wake(self) -> None:
        """Ask for a pass now (watch events, Lease changes, kernel notices)."""
        self._wake.set()

    def start(self, stop: threading.Event) -> None:
        self._stop = stop
        self._spawn("watch-node", self._node.run)
        self._spawn("watch-node-status", self._node_status.run)
        if self._count_catch_up is not None:
            self._spawn("count-catch-up", self._count_catch_up.run)
        if self._spot is not None:
            # Spot's lendable opt-in, from a watch: a LIST in the pass would be one per pod event.
            selector = f"{keys.LABEL_LENDABLE}=true"
            self._lendable = NamespaceCache(
                self._client, label_selector=selector, resync_s=self._node.resync_s, on_change=self.wake
            )
            self._spawn("watch-namespaces", self._lendable.run)
        if self._elector is not None:
            self._spawn("lease", self._lease_loop)
        else:  # no elector: a single agent that always leads (tests, one-node demo)
            self._start_cluster_watches()
        self._spawn("loop", self._run)

    def _spawn(self, job: str, target: Callable[[threading.Event], None]) -> None:
        t = threading.Thread(target=target, args=(self._stop,), name=f"gpushare-controller-{job}")
        self._threads.append(t)
        t.start()

    def _start_cluster_watches(self) -> None:
        if not self._cluster_started:
            self._cluster_started = True
            self._spawn("watch-pending", self._pending.run)
            self._spawn("watch-shadows", self._shadows.run)

    def join(self, timeout_s: float = 15.0) -> None:
        deadline = time.monotonic() + timeout_s
        self._wake.set()
        for t in list(self._threads):
            t.join(max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                log.warning("loop thread did not stop in time", extra=kv(thread=t.name))
        if self._elector is not None:
            self._elector.release()

    def _lease_loop(self, stop: threading.Event) -> None:
        assert self._elector is not None
        renew_s = max(1.0, self._elector.duration_s / 3)
        was = False
        while not stop.is_set():
            now_leader = self._elector.try_acquire_or_renew()
            if now_leader:
                self._start_cluster_watches()
            if now_leader != was:
                self.wake()
            was = now_leader
            stop.wait(renew_s)

    def _run(self, stop: threading.Event) -> None:
        if self._state_dir is not None:
            self._store = StateStore(self._state_dir)
        try:
            self._run_passes(stop)
        finally:
            if self._store is not None:
                self._store.close()
                self._store = None

    def _run_passes(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self._wake.wait(self.wait_s())
            # Cleared after the rest and before the pass: whatever arrives meanwhile asks for exactly one more.
            if stop.wait(self._pacer.rest_s()):
                break
            self._wake.clear()
            cpu0 = time.thread_time()
            try:
                self.tick()
            except Exception as exc:  # one bad pass must not end the agent; the next one retries
                log.exception("reconcile pass failed")
                self._report = dataclasses.replace(self._report, error=f"{type(exc).__name__}: {exc}")
            self._pacer.passed(time.thread_time() - cpu0)

    def wait_s(self) -> float:
        """How long the loop may wait for an event before the next pass is due."""
        if self._next_due is None:
            return self.period_s
        return min(self.period_s, max(0.0, self._next_due - self._clock()))

    def node_pod(self, key: str) -> Mapping[str, Any] | None:
        """A pod bound to this node by ``"<namespace>/<name>"``, as the node's watch last saw it."""
        return self._node.get(key)

    def last_report(self) -> TickReport:
        return self._report

    def is_leader(self) -> bool:
        return self._elector is None or self._elector.is_leader()

    # -- one pass --------------------------------------------------------------------------------

    def tick(self) -> TickReport:
        """One pass: read the inputs, plan the node, plan the cluster (leader), apply, report."""
        started = time.monotonic()
        now = self._clock()
        self._next_due = None  # only this pass's plan may set a deadline: a stale one would spin the loop
        node_view = self._node.view()
        fresh = node_view.is_fresh or self._carry_fresh
        if not node_view.is_synced:
            self._report = dataclasses.replace(self._report, error="waiting for the first pod LIST")
            return self._report

        entries, pr_error = self._list_pod_resources()
        if not pr_error:
            self._learn_real_devices(entries)
        snap = self._node_snapshot(node_view, entries, fresh)
        mapping = MappingCache.rebuild(snap.pod_resources, snap.pods, self.cfg.real_resources)
        self._log_new_problems(mapping.problems)
        # Without PodResources nobody on the node is known to hold anything: touch nothing there,
        # and keep a fresh LIST's news (deleted shadows) for the next pass that can use it.
        self._carry_fresh = fresh if pr_error else False
        # Each part fails on its own: the leader's cluster plan raising costs no node action, and
        # the other way round (the next pass retries the part that failed).
        parts = PassParts()
        node = NodePass() if pr_error else self._plan_node(snap, mapping, now, parts)
        idle = ClusterPass(is_leader=self.is_leader(), snapshot=snap)
        cluster = parts.run("cluster", lambda: self._plan_cluster(node_view, snap, now), idle)
        told = self._note_pod_problems(snap, cluster.snapshot)

        # Before the actions: a count written back while they run is lowered to this pass's number.
        self._node_status.hold(published_counts(node.actions))
        self._applier.apply_all((*node.actions, *cluster.actions, *told), now)

        self._passes += 1
        node_rows = describe_node(cluster.snapshot, mapping, cluster.unschedulable, self.cfg.real_resources, entries)
        plugin_status = self._safe_plugin_status()
        self._report = build_report(
            at=now,
            took_ms=round((time.monotonic() - started) * 1000, 3),
            passes=self._passes,
            is_leader=cluster.is_leader,
            pod_resources_error=pr_error,
            plugin_status=plugin_status,
            allocated=count_allocated(entries, self.cfg.real_resources),
            node=node_rows,
            demand=cluster.demand,
            blocked=cluster.blocked,
            spot=node.spot,
            evictions=self._applier.evictions(),
            evictions_total=self._applier.evictions_total(),
            problems=tuple(dict.fromkeys((*snap.problems, *cluster.snapshot.problems))),
            attribution=attribute(snap, mapping),
            pod_input_errors_total=dict(self._pod_problems.counts),
        )
        if parts.failures:
            error = "; ".join(filter(None, (pr_error, *parts.failures)))
            self._report = dataclasses.replace(self._report, error=error)
        return self._report

    def _note_pod_problems(self, *snapshots: Snapshot) -> list[RecordEvent]:
        """Log and count each unreadable pod once; the Warning Events owed to them (a few per pass)."""
        problems = {p.message: p for s in snapshots for p in s.pod_problems}
        new, events = self._pod_problems.update(problems.values())
        for p in new:
            pod = str(p.ref) if p.ref is not None else "?"
            log.warning("skipped a pod that cannot be read", extra=kv(pod=pod, field=p.field, problem=p.message))
        return events

    def _list_pod_resources(self) -> tuple[list[PodResourcesEntry], str]:
        """kubelet's rows, or none and why not."""
        try:
            return entries_from_pod_resources(self._podres.list()), ""
        except GpushareError as exc:
            log.warning("pod-resources unavailable; node pass skipped", extra=kv(reason=str(exc)))
            return [], str(exc)

    def _learn_real_devices(self, entries: Iterable[PodResourcesEntry]) -> None:
        """The vendors' GPUs and their health as kubelet has them, for spot and the share slots
        (controller/core/real_devices.py)."""
        try:
            allocatable = self._podres.allocatable()
        except GpushareError as exc:
            log.warning(
                "kubelet's allocatable devices unavailable; spot keeps the last ones", extra=kv(reason=str(exc))
            )
            return
        for resource, known in kubelet_real_devices(allocatable, entries, self.cfg.real_resources).items():
            devices = tuple(AdvertisedDevice(i, healthy) for i, healthy in known)
            if self._real_devices.get(resource) != devices:
                self._real_devices[resource] = devices
                self._plugins.set_real_devices(resource, devices)

    def _log_new_problems(self, problems: Iterable[str]) -> None:
        current = set(problems)
        for problem in sorted(current - self._problems_logged):
            log.warning("skipped an unreadable object", extra=kv(problem=problem))
        self._problems_logged = current  # only the last pass's: the set never grows past one pass

    def _plan_node(self, snap: Snapshot, mapping: MappingCache, now: float, parts: PassParts) -> NodePass:
        # A withdrawal waits for the gap after a write-back (controller/share/shadow_drain.py): the
        # pass is due when the next gap opens, not at whatever event comes after it closed.
        lowered = self._node_status.lowered_at()
        if gaps := [at + WRITE_BACK_SETTLE_S for at in lowered.values() if at + WRITE_BACK_SETTLE_S > now]:
            self._next_due = min(gaps)
        node = plan_node(
            self.cfg,
            snap,
            mapping,
            now,
            parts=parts,
            spot=self._spot,
            load=self._load,
            save=self._save,
            list_node_pods=lambda: self._client.list_pods(field_selector=rules.on_node_selector(self.cfg.node_name))[0],
            write_backs=lambda: lowered,
        )
        if self._spot is not None and node.spot_plan is not None:
            # Before any action: a detect applied below may be answered by a notice at once.
            self._spot.arm(node.spot_plan.returns)
            due = [t for t in (self._next_due, node.spot_plan.next_change_at) if t is not None]
            self._next_due = min(due) if due else None
            with contextlib.suppress(GpushareError):
                self._plugins.set_spot_lent(node.spot_plan.lent_real_ids)
        return node

    def _plan_cluster(self, node_view: CacheView, snap: Snapshot, now: float) -> ClusterPass:
        """Cluster-wide: only while the Lease is ours (the applier asks again before creating or deleting a shadow)."""
        if not (self.is_leader() and self._cluster_started):
            self._placing = {}  # what a former term saw pending is stale by the next one
            return ClusterPass(is_leader=False, snapshot=snap)
        pending_view, shadow_view = self._pending.view(), self._shadows.view()
        if not (pending_view.is_synced and shadow_view.is_synced):
            return ClusterPass(is_leader=True, snapshot=snap)
        cached = (node_view.pods, pending_view.pods, shadow_view.pods)
        timers = self._load(TIMER_SHADOW_EMPTY)
        cluster = plan_cluster(
            self.cfg, self._client, cached, timers, now, memo=self._cluster_memo, placing=self._placing
        )
        self._save(TIMER_SHADOW_EMPTY, cluster.empty_since)
        self._placing = cluster.placing
        return cluster

    def _node_snapshot(self, view: CacheView, entries: list[PodResourcesEntry], fresh: bool) -> Snapshot:
        lendable = self._lendable.names() if self._spot is not None and self._lendable is not None else []
        snap = build_snapshot(
            view.pods,
            self.cfg,
            pod_resources=entries,
            allocatable=self._plugins.real_devices(),
            lendable_namespaces=lendable,
            shadow_list_fresh=fresh,
            deleted_shadows=[r for r in view.deleted if r.namespace == installation.namespace()],
        )
        unhealthy = self._plugins.vendor_unhealthy()
        if unhealthy:
            snap = dataclasses.replace(snap, vendor_unhealthy=unhealthy)
        if self._shadow_devices is not None:
            here = snap.shadows_on(self.cfg.node_name)
            self._shadow_devices.keep_only({s.ref.key for s in here})
            mains = {
                s.ref.key: c.container_id
                for s in here
                for c in s.facts.containers
                if c.name == keys.SHADOW_CONTAINER and c.container_id
            }
            # Not reported by kubelet yet: the NRI plugin's word for that very pod (its uid) stands.
            pending = {s.ref.key: s.ref.uid for s in here if s.ref.key not in mains}
            snap = dataclasses.replace(
                snap,
                shadow_device_nodes={**self._shadow_devices.observed(mains), **self._shadow_devices.started(pending)},
                shadows_created=self._shadow_devices.created(pending),
            )
        if self._spot is None:
            return snap
        # Container IDs of the pods as the pass read them: a pod it cannot read has none to look up.
        cids = sorted({c.container_id for f in snap.pods.values() for c in f.containers if c.container_id})
        pidns = {cid: ino for cid in cids if (ino := self._spot.pidns_of(cid)) is not None}
        return dataclasses.replace(snap, pidns_by_container=pidns)

    def _safe_plugin_status(self) -> dict[str, dict[str, Any]]:
        try:
            return self._plugins.status()
        except GpushareError:
            return {}

    def _load(self, kind: str) -> dict[str, float]:
        return self._store.load_timers(kind) if self._store is not None else dict(self._mem_timers.get(kind, {}))

    def _save(self, kind: str, timers: Mapping[str, float]) -> None:
        if self._store is not None:
            try:
                self._store.save_timers(kind, timers)
            except GpushareError as exc:
                log.warning("cannot store timers", extra=kv(kind=kind, reason=str(exc)))
        self._mem_timers[kind] = dict(timers)


__all__ = ["PodResourcesLister", "ReconcileLoop"]
