"""The reconcile loop: one level-triggered pass over immutable inputs, then the actions in order.

Inputs, each owned by its own named thread (style.md §2.7):

- ``gpushare-controller-watch-node``: the pods bound to this node (``PodCache``);
- while this agent holds the Lease, ``-watch-pending`` (unscheduled pods, cluster-wide) and
  ``-watch-shadows`` (every shadow in ``gpushare-system``) — started the first time it leads;
- ``gpushare-controller-lease``: renews the Lease ``gpushare-controller``;
- per pass, kubelet's PodResources ``List`` (the only source of who holds which device),
  and, when spot is wired in (``SpotHooks``), idle verdicts and kernel notices.

The pass (``gpushare-controller-loop``) copies those inputs into a ``Snapshot``, calls the
decision functions (``plan_spot``, ``plan_node_shares``, and while leader ``plan_shadows``),
and applies the returned actions in list order. A watch event, a Lease change or
``wake()`` asks for a pass at once; otherwise one runs every ``period_s``. Nothing is
remembered between passes but timers (SQLite), what is advertised (to apply idempotently)
and which Events were already written; everything else is recomputed, so a lost update is
repaired by the next pass.

``last_report()`` returns the frozen ``TickReport`` of the latest pass: ``gpushare status``
and ``/metrics`` read it and never wait for the loop.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from controller.core.actions import (
    Action,
    AnnotatePod,
    CreateShadow,
    DeleteShadow,
    Evict,
    KillContainers,
    KmodCommand,
    RecordEvent,
    SetDevices,
    SetSpotHealth,
)
from controller.core.mapping import MappingCache
from controller.core.model import PodRef, PodResourcesEntry, ShareKey, Snapshot, build_snapshot
from controller.core.share_solver import KeyDemand, ShadowPlan, plan_node_shares, plan_shadows
from controller.core.spot_solver import GpuSpot, IdleVerdict, KmodView, plan_spot
from controller.io.kube import CacheView, KubeClient, LeaseElector, PodCache
from controller.io.state import TIMER_SHADOW_EMPTY, TIMER_SPOT_BACK, StateStore
from deviceplugins import Device
from gpushare import keys
from gpushare.config import Config
from gpushare.errors import GpushareError
from gpushare.log import kv

log = logging.getLogger(__name__)

REASON_SHADOW_UNSCHEDULABLE = "ShadowUnschedulable"
# An Event already written is written again only after this long (kubectl shows the count).
EVENT_REPEAT_S = 600.0


# --- the hook points spot plugs into ----------------------------------------------------------


@dataclass(frozen=True)
class SpotHooks:
    """Everything spot lends the loop; the loop calls ``plan_spot`` only when these are given."""

    verdicts: Callable[[float], Mapping[str, IdleVerdict]]  # once per pass, with `now` (wall clock)
    notices: Callable[[], Sequence[int]]  # DRAIN kernel notices (pid-ns inodes) since the last call
    kmod_view: Callable[[], KmodView]  # what the kernel module has now
    kmod: Callable[[KmodCommand], None]  # apply one command; raise GpushareError on failure
    killer: Callable[[KillContainers], None]  # SIGKILL those containers now, no API wait
    pidns_of: Callable[[str], int | None] = lambda _cid: None  # container id -> pid-ns inode


class DevicePlugins(Protocol):
    """What the loop needs of ``deviceplugins.PluginManager``."""

    def set_devices(self, resource: str, devices: Iterable[Any]) -> None: ...
    def set_spot_health(self, real_id: str, healthy: bool) -> None: ...
    def set_spot_lent(self, real_ids: Iterable[str]) -> None: ...
    def real_devices(self) -> dict[str, tuple[str, ...]]: ...
    def status(self) -> dict[str, dict[str, Any]]: ...


class PodResourcesLister(Protocol):
    def list(self) -> list[Any]: ...


# --- what a pass reports (immutable; read by status and metrics) ------------------------------


@dataclass(frozen=True)
class ShadowInfo:
    pod: str  # ns/name
    uid: str
    phase: str
    node: str
    resource: str  # the share resource it backs, e.g. gpushare/share-gpu-4
    gpu: tuple[str, ...]  # real IDs kubelet allocated to its main container ("" until known)
    users: tuple[str, ...]  # "ns/pod/container" holding its virtual devices
    unschedulable: str  # the scheduler's message while it cannot be placed


@dataclass(frozen=True)
class SharerInfo:
    pod: str
    phase: str
    node: str
    resource: str
    quantity: int
    shadows: tuple[str, ...]


@dataclass(frozen=True)
class Eviction:
    at: float  # wall clock
    pod: str
    reason: str
    message: str


@dataclass(frozen=True)
class TickReport:
    at: float = 0.0  # wall clock of the pass; 0 before the first
    took_ms: float = 0.0
    passes: int = 0
    synced: bool = False
    is_leader: bool = False
    pod_resources_ok: bool = False
    error: str = ""
    advertised: Mapping[str, int] = field(default_factory=dict)  # resource -> devices advertised
    healthy: Mapping[str, int] = field(default_factory=dict)
    registered: Mapping[str, bool] = field(default_factory=dict)
    allocated: Mapping[str, int] = field(default_factory=dict)  # resource -> device IDs held (PodResources)
    shadows: tuple[ShadowInfo, ...] = ()
    sharers: tuple[SharerInfo, ...] = ()
    demand: tuple[KeyDemand, ...] = ()
    spot: tuple[GpuSpot, ...] = ()
    evictions: tuple[Eviction, ...] = ()
    evictions_total: Mapping[str, int] = field(default_factory=dict)  # reason -> count since start
    problems: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["demand"] = [
            {"key": str(d.key), "shadows": d.shadows, "free_slots": d.free_slots, "pending": d.pending}
            for d in self.demand
        ]
        out["spot"] = [
            {
                "real_id": g.real_id,
                "state": str(g.state),
                "owner": g.owner,
                "borrowers": list(g.borrowers),
                "reason": g.reason,
            }
            for g in self.spot
        ]
        return out


# --- pure helpers (unit-tested without threads) --------------------------------------------------


def entries_from_pod_resources(pods: Iterable[Any]) -> list[PodResourcesEntry]:
    """kubelet's ``List`` answer (protobuf ``PodResources``) as plain rows, one per container x resource."""
    out: list[PodResourcesEntry] = []
    for p in pods:
        for c in p.containers:
            by_resource: dict[str, list[str]] = {}
            for d in c.devices:
                by_resource.setdefault(d.resource_name, []).extend(d.device_ids)
            for resource, ids in sorted(by_resource.items()):
                out.append(PodResourcesEntry(p.namespace, p.name, c.name, resource, tuple(ids)))
    return out


def _resource_version(pod: Mapping[str, Any]) -> int:
    rv = (pod.get("metadata") or {}).get("resourceVersion") or (pod.get("metadata") or {}).get("resource_version")
    try:
        return int(str(rv))
    except (TypeError, ValueError):
        return 0


def merge_pods(*views: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """One pod per ns/name across caches; the newest resourceVersion wins (caches lag differently)."""
    best: dict[tuple[str, str], Mapping[str, Any]] = {}
    for view in views:
        for pod in view:
            meta = pod.get("metadata") or {}
            key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
            if key not in best or _resource_version(pod) > _resource_version(best[key]):
                best[key] = pod
    return list(best.values())


def unschedulable_message(pod: Mapping[str, Any]) -> str:
    """The scheduler's message when a pod is Pending because it cannot be placed, else ""."""
    status = pod.get("status") or {}
    if status.get("phase", "Pending") != "Pending":
        return ""
    for cond in status.get("conditions") or ():
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return str(cond.get("message") or cond.get("reason") or "unschedulable")
    return ""


def plan_waiting_events(snapshot: Snapshot, unschedulable: Mapping[str, str]) -> list[RecordEvent]:
    """A pending sharer whose every shadow with free slots cannot be placed learns why, on itself.

    The scheduler's own Event on the sharer only says the share resource is insufficient; the
    real reason (no GPU left for a new shadow) is on the shadow, which users rarely look at.
    ``unschedulable``: shadow ``ns/name`` -> the scheduler's message.
    """
    stuck: dict[ShareKey, list[tuple[str, str]]] = {}
    for s in snapshot.shadows:
        msg = unschedulable.get(s.ref.key, "")
        if msg and s.facts.is_alive:
            stuck.setdefault(s.key, []).append((s.ref.key, msg))
    out: list[RecordEvent] = []
    for sharer in snapshot.sharers:
        if not sharer.is_pending or sharer.key not in stuck:
            continue
        names = ", ".join(n for n, _ in sorted(stuck[sharer.key]))
        why = sorted(stuck[sharer.key])[0][1]
        out.append(
            RecordEvent(
                sharer.ref,
                REASON_SHADOW_UNSCHEDULABLE,
                f"gpushare: no free slot of {sharer.key.resource}; the shadow pod {names} that would hold a "
                f"{sharer.key.pool.resource} GPU for it cannot be scheduled: {why}",
                "Warning",
            )
        )
    return out


def describe_node(
    snapshot: Snapshot,
    mapping: MappingCache,
    unschedulable: Mapping[str, str],
    real_resources: Iterable[str],
    pod_resources: Iterable[PodResourcesEntry] = (),
) -> tuple[tuple[ShadowInfo, ...], tuple[SharerInfo, ...]]:
    """Shadows and sharers as ``gpushare status`` shows them; ``pod_resources``: this node's rows."""
    real = set(real_resources)
    gpu_of: dict[str, tuple[str, ...]] = {}
    for e in (*snapshot.pod_resources, *pod_resources):
        if e.resource in real and e.namespace == keys.SHADOW_NAMESPACE and e.container == keys.SHADOW_CONTAINER:
            gpu_of[e.pod_key] = tuple(sorted(e.device_ids))
    shadows = tuple(
        ShadowInfo(
            pod=s.ref.key,
            uid=s.ref.uid,
            phase="Terminating" if s.facts.is_terminating else s.facts.phase,
            node=s.node_name,
            resource=s.key.resource,
            gpu=gpu_of.get(s.ref.key, ()),
            users=tuple(sorted(mapping.users_of(s.ref.key) or s.users)),
            unschedulable=unschedulable.get(s.ref.key, ""),
        )
        for s in snapshot.shadows
    )
    sharers = tuple(
        SharerInfo(
            pod=p.ref.key,
            phase="Terminating" if p.facts.is_terminating else p.facts.phase,
            node=p.node_name,
            resource=p.key.resource,
            quantity=p.quantity,
            shadows=tuple(sorted(mapping.shadows_of(p.ref.key) or p.owner_shadows)),
        )
        for p in snapshot.sharers
    )
    return shadows, sharers


# --- the loop ------------------------------------------------------------------------------------


class ReconcileLoop:
    """Owns its threads; ``start(stop)`` returns at once, ``join()`` waits for them after ``stop`` is set."""

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
    ) -> None:
        if not cfg.node_name:
            raise GpushareError("gpushare: the loop needs nodeName (config nodeName or the NODE_NAME variable)")
        self.cfg = cfg
        self._client = client
        self._plugins = plugins
        self._podres = podresources
        # SQLite objects belong to the thread that opened them: the loop thread opens the store.
        self._state_dir = state_dir
        self._store: StateStore | None = None
        self._elector = elector
        self._spot = spot
        self.period_s = period_s
        self._clock = clock
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._node = PodCache(
            client, field_selector=f"spec.nodeName={cfg.node_name}", resync_s=resync_s, on_change=self.wake
        )
        self._pending = PodCache(
            client, field_selector="spec.nodeName=,status.phase=Pending", resync_s=resync_s, on_change=self.wake
        )
        self._shadows = PodCache(
            client,
            namespace=keys.SHADOW_NAMESPACE,
            label_selector=f"{keys.LABEL_ROLE}={keys.ROLE_SHADOW}",
            resync_s=resync_s,
            on_change=self.wake,
        )
        self._cluster_started = False
        self._carry_fresh = False  # a full LIST not yet used by a node pass (PodResources was down)
        self._advertised: dict[str, tuple[str, ...]] = {}
        self._spot_health: dict[str, bool] = {}
        self._events_written: dict[tuple[str, str, str], float] = {}
        self._evictions: collections.deque[Eviction] = collections.deque(maxlen=50)
        self._evictions_total: collections.Counter[str] = collections.Counter()
        self._report = TickReport()
        self._passes = 0
        self._problems_logged: set[str] = set()
        self._mem_timers: dict[str, dict[str, float]] = {}  # timers when no StateStore is given

    # -- threads ---------------------------------------------------------------------------------

    def wake(self) -> None:
        """Ask for a pass now (watch events, Lease changes, kernel notices)."""
        self._wake.set()

    def start(self, stop: threading.Event) -> None:
        self._stop = stop
        self._spawn("watch-node", self._node.run)
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
            self._wake.wait(self.period_s)
            self._wake.clear()
            if stop.is_set():
                break
            try:
                self.tick()
            except Exception as exc:  # one bad pass must not end the agent; the next one retries
                log.exception("reconcile pass failed")
                self._report = dataclasses.replace(self._report, error=f"{type(exc).__name__}: {exc}")
            # Coalesce a burst of watch events into one pass.
            stop.wait(0.05)

    def last_report(self) -> TickReport:
        return self._report

    def is_leader(self) -> bool:
        return self._elector is None or self._elector.is_leader()

    # -- one pass --------------------------------------------------------------------------------

    def tick(self) -> TickReport:
        started = time.monotonic()
        now = self._clock()
        node_view = self._node.view()
        fresh = node_view.is_fresh or self._carry_fresh
        if not node_view.is_synced:
            self._report = dataclasses.replace(self._report, error="waiting for the first pod LIST")
            return self._report

        pr_error = ""
        entries: list[PodResourcesEntry] = []
        try:
            entries = entries_from_pod_resources(self._podres.list())
        except GpushareError as exc:
            pr_error = str(exc)
            log.warning("pod-resources unavailable; node pass skipped", extra=kv(reason=pr_error))

        snap = self._node_snapshot(node_view, entries, fresh)
        mapping = MappingCache.rebuild(snap.pod_resources, snap.pods, self.cfg.real_resources)
        for problem in (*snap.problems, *mapping.problems):
            if problem not in self._problems_logged:
                self._problems_logged.add(problem)
                log.warning("skipped an unreadable object", extra=kv(problem=problem))

        actions: list[Action] = []
        spot_gpus: tuple[GpuSpot, ...] = ()
        if not pr_error:
            self._carry_fresh = False
            if self._spot is not None:
                spot_plan = plan_spot(
                    snap,
                    mapping,
                    real_resources=self.cfg.real_resources,
                    verdicts=self._spot.verdicts(now),
                    notices=self._spot.notices(),
                    kmod=self._spot.kmod_view(),
                    back_at=self._load(TIMER_SPOT_BACK),
                    now=now,
                    idle_window_s=self.cfg.idle_window_s,
                )
                actions += spot_plan.actions
                spot_gpus = spot_plan.gpus
                self._save(TIMER_SPOT_BACK, spot_plan.back_at)
                with contextlib.suppress(GpushareError):
                    self._plugins.set_spot_lent(spot_plan.lent_real_ids)
            actions += plan_node_shares(snap, mapping, self.cfg)
        else:
            self._carry_fresh = fresh

        # Cluster-wide: only while the Lease is ours, checked again before each action.
        is_leader = self.is_leader() and self._cluster_started
        demand: tuple[KeyDemand, ...] = ()
        cluster = snap
        unschedulable: dict[str, str] = {}
        if is_leader:
            pending_view, shadow_view = self._pending.view(), self._shadows.view()
            if pending_view.is_synced and shadow_view.is_synced:
                raw = merge_pods(node_view.pods, pending_view.pods, shadow_view.pods)
                unschedulable = {
                    f"{(p.get('metadata') or {}).get('namespace')}/{(p.get('metadata') or {}).get('name')}": m
                    for p in shadow_view.pods
                    if (m := unschedulable_message(p))
                }
                cluster = build_snapshot(raw, self.cfg)
                timers = self._load(TIMER_SHADOW_EMPTY)
                plan = plan_shadows(cluster, self.cfg, now, timers)
                if any(isinstance(a, DeleteShadow) for a in plan.actions):
                    plan = self._confirm_deletions(plan, cluster, raw, now, timers)
                actions += plan.actions
                actions += plan_waiting_events(cluster, unschedulable)
                demand = plan.demand
                self._save(TIMER_SHADOW_EMPTY, plan.empty_since)

        for action in actions:
            self._apply(action, now)

        shadows, sharers = describe_node(
            cluster if is_leader else snap, mapping, unschedulable, self.cfg.real_resources, entries
        )
        self._passes += 1
        dp = self._safe_plugin_status()
        allocated: collections.Counter[str] = collections.Counter()
        for e in entries:
            if e.resource.startswith(keys.RESOURCE_PREFIX) or e.resource in self.cfg.real_resources:
                allocated[e.resource] += len(e.device_ids)
        self._report = TickReport(
            at=now,
            took_ms=round((time.monotonic() - started) * 1000, 3),
            passes=self._passes,
            synced=True,
            is_leader=is_leader,
            pod_resources_ok=not pr_error,
            error=pr_error,
            advertised={r: int(s.get("devices", 0)) for r, s in dp.items()},
            healthy={r: int(s.get("healthy", 0)) for r, s in dp.items()},
            registered={r: bool(s.get("registered")) for r, s in dp.items()},
            allocated=dict(allocated),
            shadows=shadows,
            sharers=sharers,
            demand=demand,
            spot=spot_gpus,
            evictions=tuple(self._evictions),
            evictions_total=dict(self._evictions_total),
            problems=snap.problems,
        )
        return self._report

    def _confirm_deletions(
        self,
        plan: ShadowPlan,
        cluster: Snapshot,
        cached: list[Mapping[str, Any]],
        now: float,
        timers: Mapping[str, float],
    ) -> ShadowPlan:
        """Plan again from fresh LISTs before deleting a shadow; keep only deletions both plans agree on.

        The caches lag differently: a sharer that was just bound leaves the pending watch before
        it shows up in any node's, and until the node agent records it on the shadow the leader
        cannot see it at all. In that window an in-use shadow looks idle. Deletions are rare (one
        per idle timeout), so the price of three targeted LISTs is small; a pod still in a stale
        cache only makes the answer more conservative.
        """
        deleting = {a.ref for a in plan.actions if isinstance(a, DeleteShadow)}
        nodes = sorted({s.node_name for s in cluster.shadows if s.ref in deleting and s.node_name})
        try:
            fresh: list[list[dict[str, Any]]] = [
                self._client.list_pods(field_selector="spec.nodeName=,status.phase=Pending")[0],
                self._client.list_pods(
                    namespace=keys.SHADOW_NAMESPACE, label_selector=f"{keys.LABEL_ROLE}={keys.ROLE_SHADOW}"
                )[0],
            ]
            fresh += [self._client.list_pods(field_selector=f"spec.nodeName={n}")[0] for n in nodes]
        except GpushareError as exc:
            log.warning("cannot confirm idle shadows; not deleting this pass", extra=kv(reason=str(exc)))
            return dataclasses.replace(plan, actions=tuple(a for a in plan.actions if not isinstance(a, DeleteShadow)))
        again = plan_shadows(build_snapshot(merge_pods(cached, *fresh), self.cfg), self.cfg, now, timers)
        confirmed = {a for a in again.actions if isinstance(a, DeleteShadow)}
        for a in plan.actions:
            if isinstance(a, DeleteShadow) and a not in confirmed:
                log.info("idle shadow is in use after all; kept", extra=kv(shadow=a.ref.key))
        return dataclasses.replace(
            plan,
            actions=tuple(a for a in plan.actions if not isinstance(a, DeleteShadow) or a in confirmed),
            empty_since=again.empty_since,
        )

    def _node_snapshot(self, view: CacheView, entries: list[PodResourcesEntry], fresh: bool) -> Snapshot:
        pidns: dict[str, int] = {}
        lendable: list[str] = []
        if self._spot is not None:
            for pod in view.pods:
                for st in (pod.get("status") or {}).get("containerStatuses") or ():
                    cid = str(st.get("containerID") or "").split("://", 1)[-1]
                    if cid and (ino := self._spot.pidns_of(cid)) is not None:
                        pidns[cid] = ino
            try:
                lendable = self._client.namespaces_with_label(f"{keys.LABEL_LENDABLE}=true")
            except GpushareError as exc:
                log.warning("cannot list lendable namespaces", extra=kv(reason=str(exc)))
        return build_snapshot(
            view.pods,
            self.cfg,
            pod_resources=entries,
            allocatable=self._plugins.real_devices(),
            lendable_namespaces=lendable,
            pidns_by_container=pidns,
            shadow_list_fresh=fresh,
            deleted_shadows=[r for r in view.deleted if r.namespace == keys.SHADOW_NAMESPACE],
        )

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

    # -- applying actions --------------------------------------------------------------------------

    def _apply(self, action: Action, now: float) -> None:
        """Apply one action; a failure is logged and the pass goes on (the next pass retries)."""
        try:
            if isinstance(action, SetDevices):
                if self._advertised.get(action.resource) == action.ids:
                    return
                self._plugins.set_devices(action.resource, [Device(i, True) for i in action.ids])
                self._advertised[action.resource] = action.ids
            elif isinstance(action, SetSpotHealth):
                if self._spot_health.get(action.real_id) == action.is_healthy:
                    return
                self._plugins.set_spot_health(action.real_id, action.is_healthy)
                self._spot_health[action.real_id] = action.is_healthy
            elif isinstance(action, CreateShadow):
                if not self.is_leader():
                    return
                if not self._client.create_pod(action.manifest):
                    log.info("shadow already exists", extra=kv(shadow=action.name))
            elif isinstance(action, DeleteShadow):
                if not self.is_leader():
                    return
                self._client.delete_pod(action.ref)
            elif isinstance(action, Evict):
                self._evict(action, now)
            elif isinstance(action, KillContainers):
                if self._spot is None:
                    log.warning("no killer wired in; containers left running", extra=kv(**action.log_fields()))
                    return
                self._spot.killer(action)
            elif isinstance(action, KmodCommand):
                if self._spot is None:
                    return
                self._spot.kmod(action)
            elif isinstance(action, AnnotatePod):
                self._client.patch_pod_annotations(action.ref, {action.key: action.value})
            elif isinstance(action, RecordEvent):
                if not self._event_once(action.ref, action.reason, action.message, now):
                    return
                self._client.record_event(action.ref, action.reason, action.message, type_=action.type)
        except GpushareError as exc:
            log.warning("action failed; retried next pass", extra=kv(**action.log_fields(), error=str(exc)))
            return
        log.info("decision", extra=kv(**action.log_fields()))

    def _event_once(self, ref: PodRef, reason: str, message: str, now: float) -> bool:
        key = (ref.uid, reason, message)
        last = self._events_written.get(key)
        if last is not None and now - last < EVENT_REPEAT_S:
            return False
        self._events_written[key] = now
        if len(self._events_written) > 4096:  # forget the oldest half; a repeat Event is harmless
            for k, _ in sorted(self._events_written.items(), key=lambda kv_: kv_[1])[:2048]:
                del self._events_written[k]
        return True

    def _evict(self, action: Evict, now: float) -> None:
        if not self._client.delete_pod(action.ref):
            return  # already gone or replaced: nothing was evicted
        self._evictions.append(Eviction(now, action.ref.key, action.reason, action.message))
        self._evictions_total[action.reason] += 1
        if self._store is not None:
            with contextlib.suppress(GpushareError):
                self._store.add_counter("evictions", action.reason)
        with contextlib.suppress(GpushareError):
            self._client.record_event(action.ref, action.reason, action.message, type_="Warning")


__all__ = [
    "EVENT_REPEAT_S",
    "REASON_SHADOW_UNSCHEDULABLE",
    "DevicePlugins",
    "Eviction",
    "PodResourcesLister",
    "ReconcileLoop",
    "ShadowInfo",
    "SharerInfo",
    "SpotHooks",
    "TickReport",
    "describe_node",
    "entries_from_pod_resources",
    "merge_pods",
    "plan_waiting_events",
    "unschedulable_message",
]
