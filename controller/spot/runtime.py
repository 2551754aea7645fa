"""The I/O side of spot (design §6, §7): what ``plan_spot`` decides, done on the host.

    SpotRuntime                 one object the agent builds; its methods are the loop's SpotHooks
    ├── UtilizationWatcher      utilization.py: thread gpushare-spot-scrape, Scraper -> IdleDetector
    ├── KmodBridge              kmod_bridge.py: gpukmod commands and notices (thread
    │                           gpushare-spot-kmod-notices); absent module = utilization only
    ├── PodKiller               killer.py: KillPods -> SIGKILL every task of each borrower pod
    │                           through its pod cgroup; bounded; never reports a kill that did nothing
    └── PidnsCache              pidns.py: container ID -> pid namespace gpukmod watches

The owner waits only for the kill. Each pass hands the runtime its return table
(``SpotPlan.returns``: which borrowers each watched owner's notice must kill). A kernel notice
is acted on at once, on a thread of its own (gpushare-spot-return), before any pass: the owner's spot devices turn
Unhealthy, its borrowers are killed (returning the moment their pod cgroups are empty, or at
the bound), the notice is queued for the pass, and the owner's held ioctl is released. Only then
does the pass run, deleting the pods and writing the Events; its own kill finds nothing left
and its ``release`` is a no-op. Kills a pass asks for (reclaims without a kernel notice) run on
a short thread each (gpushare-spot-kill), so the pass never waits on a dying task; ``kmod
release`` from a pass waits for every kill in flight.

Latencies are measured from the moment the return signal reached this process (a notice read
from the socket, or the scrape that first showed the GPU busy): to every task of the
borrowers dead (one observation per return), and, for a notice, to the owner released.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from controller.core.actions import REASON_OWNER_BACK, KillPods, KmodCommand
from controller.core.detectors import IdleDetector, IdleVerdict
from controller.io.exporter_pods import ExporterPods
from controller.io.kube_client import KubeClient
from controller.spot.counters import SpotCounters
from controller.spot.hooks import SpotHooks
from controller.spot.killer import KillOutcome, PodKiller
from controller.spot.kmod_bridge import KmodBridge, open_kmod, refuse_kmod
from controller.spot.solver import KmodView, ReturnTarget
from controller.spot.utilization import UtilizationWatcher
from gpukmod import KmodError
from gpumetrics.discovery import is_pod_source, parse_pod_source
from gpumetrics.scrape import Scraper
from gpushare.config import Config
from gpushare.errors import GpushareError
from gpushare.log import kv
from gpushare.rules import return_signal
from podcgroups.cgroups import PROC_ROOT, CgroupIndex
from podcgroups.errors import ExitBoostJournalError
from podcgroups.pidns import PidnsCache
from podcgroups.pod_kill import EXIT_BOOST, urgent

log = logging.getLogger(__name__)

SIGNAL_KEEP_S = 10.0  # how long a return signal waits for the kill it starts
_MAX_KILLED = 1024  # pods remembered as killed, so a pod killed again each pass is counted once


# -- what one kill or return adds to the counters, the dead list and the last return ---------------------


@dataclass(frozen=True)
class ReturnRecord:
    """What one kill or return adds to the counters, ``dead`` and ``last_return``.

    A kill counts as a return only when it did its job: an error (no task found although kubelet
    reports the pod running, no pod cgroup, a failed write) or the kill bound passing is counted
    on its own and never enters ``gpushare_spot_return_seconds`` as a fast return. The release
    time is observed whenever the owner's held call was let go, since that is what the owner waited.
    """

    outcome: KillOutcome | None  # None: nothing was lent, so nothing was killed
    first: frozenset[str]  # uids of the pods killed for the first time
    signal_at: float | None  # monotonic arrival of the return signal; None for a reclaim without one
    released_at: float | None  # monotonic time the owner's held call was released (notice path only)
    owner: str  # "ns/pod/container" when known

    @property
    def is_clean(self) -> bool:
        """The kill reached every task: no error, nothing left at the bound."""
        return self.outcome is not None and not self.outcome.error and not self.outcome.timed_out

    def count(self, counters: SpotCounters) -> None:
        """Add to the counters (under the runtime's lock); pods killed again count no error."""
        if self.outcome is not None and self.first:
            if self.outcome.error:
                counters.kill_errors[self.outcome.error] += 1
            elif self.outcome.timed_out:
                counters.bound_exceeded += 1
        if self.signal_at is None:
            return
        if self.released_at is not None:
            counters.observe_release(self.released_at - self.signal_at)
        if self.outcome is not None and self.first and self.is_clean:
            counters.observe_return(self.outcome.dead_at - self.signal_at)

    def dead(self) -> list[tuple[str, float]]:
        """(pod, time its tasks were seen gone) for each pod of a clean kill."""
        if self.outcome is None or not self.is_clean:
            return []
        return [(ref.key, self.outcome.dead_at) for ref in self.outcome.action.refs]

    def summary(self) -> dict[str, Any]:
        """``last_return`` for ``gpushare status``; {} for a kill that was no return."""
        if self.signal_at is None or (self.outcome is not None and not self.first):
            return {}
        out: dict[str, Any] = {"owner": self.owner, "at": time.time(), "pods": [], "borrowers": 0}
        if self.released_at is not None:
            out["release_ms"] = round((self.released_at - self.signal_at) * 1000, 2)
        if self.outcome is None:
            return out
        out.update(
            pods=[ref.key for ref in self.outcome.action.refs],
            borrowers=len(self.outcome.action.pods),
            signalled=self.outcome.signalled,
            kill_ms=round(self.outcome.took_s * 1000, 2),
        )
        if self.outcome.error:
            out["error"] = f"{self.outcome.error}: {self.outcome.detail}"
        elif self.outcome.timed_out:
            out["bound_exceeded"] = True
        else:
            out["return_to_dead_ms"] = round((self.outcome.dead_at - self.signal_at) * 1000, 2)
        return out


def log_return_failure(what: str, who: str, exc: Exception) -> None:
    """A step of the return path failed (closing a device, releasing the owner); the path goes on."""
    log.error("spot: %s: %s", what, exc, extra=kv(target=who))


class SpotRuntime:
    """What the agent builds for spot; ``hooks()`` are the loop's ``SpotHooks`` (controller/spot/hooks.py)."""

    def __init__(
        self,
        watcher: UtilizationWatcher | None,
        bridge: KmodBridge,
        killer: PodKiller,
        *,
        proc_root: str = PROC_ROOT,
        monotonic: Callable[[], float] = time.monotonic,
        pidns_index: CgroupIndex | None = None,
    ) -> None:
        self.watcher = watcher
        self.pod_killer = killer
        self._monotonic = monotonic
        index = pidns_index if pidns_index is not None else CgroupIndex(cgroup_root=killer.cgroup_root)
        self._pidns = PidnsCache(index, proc_root=proc_root, monotonic=monotonic)
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)  # notified when a kill ends
        self._kills_running = 0
        self._returns: Mapping[int, ReturnTarget] = {}
        self._pass_signals: list[float] = []
        self._killed: OrderedDict[str, None] = OrderedDict()  # pod uids, oldest first
        self._blocked = ""
        # (pod, monotonic time its tasks were seen gone), newest last: for benchmarks and tests.
        self.dead: deque[tuple[str, float]] = deque(maxlen=256)
        # A collector in the agent's registry; the bridge is looked up at scrape time (tests swap it).
        self.counters = SpotCounters(
            kmod_available=lambda: self.bridge.available, lending_blocked=lambda: self._blocked
        )
        self.wake_target: Callable[[], None] = lambda: None  # the loop's wake(), set by the agent
        # PluginManager.set_spot_health, set by the agent: a notice closes the owner's devices at once.
        self.spot_health_target: Callable[[str, bool], None] | None = None
        self.last_return: dict[str, Any] = {}
        self.bridge = bridge
        # The API client of a k8s://pods/ metrics source (closed with the runtime); None otherwise.
        self.exporter_pods: ExporterPods | None = None

    @property
    def bridge(self) -> KmodBridge:
        return self._bridge

    @bridge.setter
    def bridge(self, bridge: KmodBridge) -> None:
        """Kernel notices of this bridge come to the runtime's return path first."""
        self._bridge = bridge
        bridge.on_notice = self._on_notice

    @classmethod
    def from_config(cls, cfg: Config, *, use_kmod: bool = True, kubeconfig: str | None = None) -> SpotRuntime:
        """Build from the config; the threads wake ``self.wake_target`` (set it to the loop's ``wake``).

        A ``k8s://pods/`` metrics source lists its exporter pod with a client of its own, from
        ``kubeconfig`` (None: the pod's service account), so a slow list never holds a
        connection the loop's watches need. ``MetricsError`` for a malformed source."""
        holder: list[SpotRuntime] = []

        def wake() -> None:
            holder[0].wake_target()

        watcher = None
        exporter_pods = None
        if cfg.metrics.source:
            if is_pod_source(cfg.metrics.source):
                parse_pod_source(cfg.metrics.source)  # a malformed source is refused before a client is opened
                exporter_pods = ExporterPods(
                    KubeClient.from_kubeconfig(kubeconfig, timeout_s=cfg.metrics.scrape_timeout_s + 3.0)
                )
            watcher = UtilizationWatcher(
                Scraper.from_config(cfg.metrics, node=cfg.node_name, list_pods=exporter_pods),
                IdleDetector.from_config(cfg),
                interval_s=cfg.metrics.scrape_interval_s,
                is_process_level=cfg.metrics.process_level,
                wake=wake,
                state_dir=cfg.state_dir,
            )
        factory = open_kmod if use_kmod else refuse_kmod
        bridge = KmodBridge(unit=cfg.netlink_protocol, wake=wake, client_factory=factory)
        rt = cls(watcher, bridge, PodKiller(cgroup_root=cfg.spot.cgroup_root))
        rt.exporter_pods = exporter_pods
        # A kill of the agent's previous run that it never finished left weights raised.
        try:
            if restored := EXIT_BOOST.recover():
                log.warning(
                    "spot: CPU weights left raised by an unfinished kill were put back", extra=kv(files=len(restored))
                )
        except ExitBoostJournalError as exc:
            log.error("spot: %s", exc)
        holder.append(rt)
        return rt

    def hooks(self) -> SpotHooks:
        """The loop's hook points, bound to this runtime."""
        return SpotHooks(
            verdicts=self.verdicts,
            notices=self.notices,
            kmod_view=self.kmod_view,
            kmod=self.kmod,
            killer=self.killer,
            pidns_of=self.pidns_of,
            arm=self.arm,
            blocked=self.blocked,
        )

    def start(self, stop: threading.Event) -> None:
        self.blocked()  # says at start whether pod cgroups were found (one log line either way)
        self.bridge.start()
        if self.watcher is not None:
            self.watcher.start(stop)

    def close(self) -> None:
        """Stop the notice thread; the scrape thread ends with the ``stop`` event given to ``start``."""
        self.wait_dead()
        self.bridge.close()
        if self.watcher is not None:
            self.watcher.join(5.0)
        if self.exporter_pods is not None:
            self.exporter_pods.close()

    # --- SpotHooks --------------------------------------------------------------------------------

    def verdicts(self, now: float) -> Mapping[str, IdleVerdict]:
        return {} if self.watcher is None else self.watcher.verdicts(now)

    def notices(self) -> Sequence[int]:
        """Drain this pass's kernel notices; also collects the return-signal times a kill will take."""
        drained = self.bridge.drain()
        busy = self.watcher.take_busy_times() if self.watcher is not None else []
        now = self._monotonic()
        with self._lock:
            # A signal waits for the kill it starts: the pass that reads the owner busy may only
            # turn the GPU back, and the kill come a pass later. Older than SIGNAL_KEEP_S, it is
            # not this return's (an owner busy while nothing was lent).
            kept = [t for t in self._pass_signals if now - t <= SIGNAL_KEEP_S]
            self._pass_signals = kept + [t for _, t in drained] + busy
        return [p for p, _ in drained]

    def kmod_view(self) -> KmodView:
        return self.bridge.view()

    def kmod(self, cmd: KmodCommand) -> None:
        if cmd.op == "release":
            self.wait_dead()  # the owner's held ioctl runs only once every borrower is dead (design §6)
        self.bridge.apply(cmd)

    def killer(self, action: KillPods) -> None:
        """Start killing the pods and return at once; a short thread waits for their tasks to go."""
        with self._lock:
            first = self._take_first(action)
            is_return = bool(first) and action.reason == REASON_OWNER_BACK and bool(self._pass_signals)
            signal_at = min(self._pass_signals) if is_return else None
            if is_return:
                self._pass_signals = []  # taken by this return
            self._kills_running += 1
        threading.Thread(
            target=self._kill_off_path, args=(action, first, signal_at), name="gpushare-spot-kill", daemon=True
        ).start()

    def arm(self, returns: Mapping[int, ReturnTarget]) -> None:
        """Take this pass's return table, and find its borrowers' pod cgroups now rather than on a return."""
        with self._lock:
            self._returns = dict(returns)
        self.pod_killer.prepare(t.ref.uid for r in returns.values() if r.kill is not None for t in r.kill.pods)

    def blocked(self) -> str:
        """Why nothing may be lent here ("" when pod cgroups are found); kept for /metrics."""
        self._blocked = self.pod_killer.blocked()
        return self._blocked

    def was_reclaimed(self, pod_uid: str) -> bool:
        """Whether a kill took this pod (its lend ended); the NRI plugin never gives it the GPU again."""
        with self._lock:
            return pod_uid in self._killed

    def pidns_of(self, container_id: str) -> int | None:
        """The pid-namespace inode of a container's first process (cached: it never changes)."""
        return self._pidns.lookup(container_id)

    def wait_dead(self, timeout_s: float | None = None) -> bool:
        """Block until no kill is in flight (each ends by its bound); False on timeout."""
        limit = self.pod_killer.timeout_s + 1.0 if timeout_s is None else timeout_s
        with self._idle:
            return self._idle.wait_for(lambda: self._kills_running == 0, limit)

    # --- the return path (notice thread) and kills off the pass ----------------------------------------

    def _on_notice(self, pidns: int, at: float) -> None:
        """A kernel notice: start killing the owner's borrowers (from the last pass's table) at once.

        Each armed notice gets its own thread, so owners returning together are killed together
        rather than one after another on the notice thread."""
        with self._lock:
            target = self._returns.get(pidns)
            first = self._take_first(target.kill) if target is not None and target.kill is not None else frozenset()
            if target is not None:
                self._kills_running += 1
        if target is None:  # not an owner the last pass armed: the pass decides
            self.bridge.queue_notice(pidns, at)
            self.bridge.wake()
            return
        threading.Thread(
            target=self._return, args=(pidns, at, target, first), name="gpushare-spot-return", daemon=True
        ).start()

    def _return(self, pidns: int, at: float, target: ReturnTarget, first: frozenset[str]) -> None:
        """Close the owner's spot devices, kill its borrowers, release the owner, then wake the pass.

        At real-time priority up to the release (``podcgroups.pod_kill.urgent``): the node's daemons,
        busy tearing down the containers this kills, otherwise keep the thread from a CPU for tens
        of ms between the pods' last task and the owner's release."""
        outcome: KillOutcome | None = None
        released_at: float | None = None
        try:
            with urgent():
                try:
                    self._close_devices(target.real_ids)
                    if target.kill is not None:
                        outcome = self.pod_killer.kill(target.kill, first=first)
                finally:
                    self.bridge.queue_notice(pidns, at)  # before the release: a pass now cannot re-arm it
                    released_at = self._release(pidns, target)
            self._record(ReturnRecord(outcome, first, at, released_at, target.owner))
        finally:
            self._end_kill()
            self.bridge.wake()  # the pass deletes the pods and writes the Events, off the owner's path

    def _kill_off_path(self, action: KillPods, first: frozenset[str], signal_at: float | None) -> None:
        try:
            self._record(ReturnRecord(self.pod_killer.kill(action, first=first), first, signal_at, None, ""))
        finally:
            self._end_kill()

    def _close_devices(self, real_ids: Iterable[str]) -> None:
        if self.spot_health_target is None:
            return
        for rid in real_ids:
            try:
                self.spot_health_target(rid, False)
            except GpushareError as exc:
                log_return_failure("cannot close the spot device", rid, exc)

    def _release(self, pidns: int, target: ReturnTarget) -> float | None:
        try:
            self.bridge.release(pidns)
        except KmodError as exc:  # the module answers for itself: it releases at maxBlockMs anyway
            log_return_failure("cannot release the owner", target.owner, exc)
            return None
        return self._monotonic()

    def _take_first(self, action: KillPods) -> frozenset[str]:
        """Under the lock: the action's pods never killed before; remembers them and counts them."""
        first = frozenset(t.ref.uid for t in action.pods if t.ref.uid not in self._killed)
        for uid in sorted(first):
            self._killed[uid] = None
        while len(self._killed) > _MAX_KILLED:
            self._killed.popitem(last=False)
        if first:
            self.counters.kills[action.reason] += len(first)
        return first

    def _end_kill(self) -> None:
        with self._idle:
            self._kills_running -= 1
            self._idle.notify_all()

    def _record(self, rec: ReturnRecord) -> None:
        with self._lock:
            rec.count(self.counters)
            self.dead.extend(rec.dead())
            summary = rec.summary()
            if summary:
                self.last_return = summary

    # --- status ---------------------------------------------------------------------------------------

    def mode(self) -> str:
        """How this node sees owners return (``rules.return_signal``), as ``/status`` reports it."""
        process_level = self.watcher is not None and self.watcher.is_process_level
        return return_signal(kmod_watches=self.bridge.available, metrics_name_users=process_level).value

    def status(self) -> dict[str, Any]:
        """For ``gpushare status``: how returns are seen, the cgroups, kills and their failures, the last return."""
        with self._lock:
            kills = dict(self.counters.kills)
            errors = dict(self.counters.kill_errors)
            bound_exceeded = self.counters.bound_exceeded
            last = dict(self.last_return)
        return {
            "mode": self.mode(),
            "lending_blocked": self._blocked,
            "cgroups": self.pod_killer.describe(),
            "kmod": self.bridge.status(),
            "metrics": None
            if self.watcher is None
            else {
                "process_level": self.watcher.is_process_level,
                "source": self.watcher.source,
                # The URL scraped: the source itself, or the pod a k8s://pods/ source found ("" until one is).
                "endpoint": self.watcher.endpoint,
                "last_scrape_at": self.watcher.last_scrape_at,
                "error": self.watcher.last_error,
            },
            "kills": kills,
            "kill_errors": errors,
            "kill_bound_exceeded": bound_exceeded,
            "kill_bound_s": self.pod_killer.timeout_s,
            "last_return": last,
        }


__all__ = ["SpotRuntime"]
