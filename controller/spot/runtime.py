"""The I/O side of spot (design §6, §7): what ``plan_spot`` decides, done on the host.

    SpotRuntime                 one object the agent builds; its methods are the loop's SpotHooks
    ├── UtilizationWatcher      thread gpushare-spot-scrape: Scraper -> IdleDetector every scrapeInterval
    ├── KmodBridge              gpukmod: register, add/delete/detect/undetect/release, notices
    │                           (thread gpushare-spot-kmod-notices); absent module = utilization only
    └── CgroupKiller            KillContainers -> SIGKILL every borrower cgroup now; a reaper thread confirms
                                the deaths (re-kill, then freeze-kill-thaw a cgroup that does not empty)

Threads only move data: a notice or a changed idle state is queued as plain values and the
loop is woken (``wake``); every decision stays in ``plan_spot``. The return-to-dead latency
is measured from the moment the signal reached this process (a notice read from the
socket, or the scrape that first showed the GPU busy) to the moment a borrower's cgroup
lists no task, one observation per borrower pod.
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from controller.core.actions import REASON_OWNER_BACK, KillContainers, KmodCommand
from controller.core.detectors import IdleDetector, IdleState, IdleStatus
from controller.core.model import PodRef
from controller.core.spot_solver import IdleVerdict, KmodView, verdict_from_status
from controller.errors import KillTimeout, MetricsError, ProcessError
from controller.loop import SpotHooks
from controller.metrics.scrape import Scraper
from controller.spot.procs import (
    CgroupIndex,
    ContainerCgroup,
    ExitBoost,
    KillReport,
    kill_cgroups,
    pidns_inode,
    signal_cgroups,
    wait_cgroups_empty,
)
from gpukmod import KmodClient, KmodError
from gpushare.config import Config
from gpushare.log import kv

log = logging.getLogger(__name__)

RETURN_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 3.0)
# The first SIGKILL goes without freezing (freezing waits for every task to be scheduled:
# 16 borrowers took 68 ms p50 frozen vs 29 ms not, on 2 loaded cores); a cgroup still not
# empty after this long is frozen before the next round.
FREEZE_AFTER_S = 0.02
# Killed tasks still listed this long after the signal are waiting for CPU: move them to the
# highest-weight cpu cgroup (procs.ExitBoost) so they run their exit now.
BOOST_AFTER_S = 0.002
KMOD_RETRY_S = 30.0  # how often an absent module is looked for again (it may be loaded later)
PIDNS_RETRY_S = 5.0  # how long a container whose cgroup was not found is not looked for again
# Commands whose ENOENT means "already done": the id left the table (module reloaded, or it
# was deleted by a timed-out hold's owner going away).
_IDEMPOTENT_ON_ENOENT = frozenset({"delete", "undetect", "release"})


class KmodLike(Protocol):
    """The part of ``gpukmod.KmodClient`` the bridge uses (tests pass a recording fake)."""

    def register(self) -> None: ...
    def add(self, *ids: int) -> None: ...
    def delete(self, *ids: int) -> None: ...
    def detect(self, *ids: int) -> None: ...
    def undetect(self, *ids: int) -> None: ...
    def release(self, *ids: int) -> None: ...
    def start_notices(self, callback: Callable[[int], None], *, name: str = ...) -> None: ...
    def close(self) -> None: ...


def _default_client(unit: int) -> KmodLike:
    return KmodClient(unit=unit)


class KmodBridge:
    """Keeps gpukmod in step with the loop's KmodCommands and queues its notices.

    ``view()`` is what the loop passes to ``plan_spot``: the ids this instance added and
    armed. After an agent restart it starts empty; ``add`` of a present id and ``detect``
    of an armed one are harmless, so the plan simply re-applies the watch list.
    """

    def __init__(
        self,
        *,
        unit: int = 31,
        wake: Callable[[], None] = lambda: None,
        client_factory: Callable[[int], KmodLike] = _default_client,
        clock: Callable[[], float] = time.monotonic,
        retry_s: float = KMOD_RETRY_S,
    ) -> None:
        self._unit = unit
        self._wake = wake
        self._factory = client_factory
        self._clock = clock
        self._retry_s = retry_s
        self._lock = threading.Lock()
        self._client: KmodLike | None = None
        self._added: set[int] = set()
        self._detecting: set[int] = set()
        self._notices: list[tuple[int, float]] = []
        self._reason = "not started"
        self._next_try = 0.0
        self.notices_total = 0

    def start(self) -> bool:
        """Open, register as THE listener and start the notice thread; False if the module is absent."""
        with self._lock:
            return self._open_locked()

    def _open_locked(self) -> bool:
        self._next_try = self._clock() + self._retry_s
        try:
            client = self._factory(self._unit)
        except KmodError as exc:
            self._set_absent(exc)
            return False
        try:
            client.register()
            client.start_notices(self._on_notice, name="gpushare-spot-kmod-notices")
        except KmodError as exc:
            client.close()
            self._set_absent(exc)
            return False
        self._client = client
        self._added.clear()
        self._detecting.clear()
        self._reason = f"registered on netlink unit {self._unit}"
        log.info("spot kernel module connected", extra=kv(unit=self._unit))
        return True

    def _set_absent(self, exc: KmodError) -> None:
        reason = (
            "gpukmod not loaded; spot works on utilization alone"
            if exc.errno == errno.EPROTONOSUPPORT
            else f"gpukmod unusable ({exc}); spot works on utilization alone"
        )
        if reason != self._reason:
            log.warning("spot: %s", reason, extra=kv(unit=self._unit))
        self._reason = reason

    def _on_notice(self, pidns: int) -> None:
        with self._lock:
            self._notices.append((pidns, self._clock()))
            self.notices_total += 1
        log.info("spot kernel notice", extra=kv(pidns=pidns))
        self._wake()

    @property
    def available(self) -> bool:
        return self._client is not None

    @property
    def reason(self) -> str:
        return self._reason

    def view(self) -> KmodView:
        with self._lock:
            if self._client is None and self._clock() >= self._next_try:
                self._open_locked()
            return KmodView(self._client is not None, frozenset(self._added), frozenset(self._detecting))

    def drain(self) -> list[tuple[int, float]]:
        """Notices since the last call, as (pidns, monotonic arrival time)."""
        with self._lock:
            out, self._notices = self._notices, []
        return out

    def apply(self, cmd: KmodCommand) -> None:
        """Send one command; the view follows what the kernel accepted. Raises KmodError."""
        with self._lock:
            client = self._client
        if client is None:
            return  # the module went away since the plan was made: nothing to keep in step
        try:
            getattr(client, cmd.op)(cmd.pidns)
        except KmodError as exc:
            if not (exc.errno == errno.ENOENT and cmd.op in _IDEMPOTENT_ON_ENOENT):
                if exc.errno in (errno.ECONNREFUSED, errno.ETIMEDOUT):
                    self._drop(exc)
                raise
        with self._lock:
            if cmd.op == "add":
                self._added.add(cmd.pidns)
            elif cmd.op == "delete":
                self._added.discard(cmd.pidns)
                self._detecting.discard(cmd.pidns)
            elif cmd.op == "detect":
                self._added.add(cmd.pidns)
                self._detecting.add(cmd.pidns)
            elif cmd.op in ("undetect", "release"):
                # release leaves the id in the table, disarmed until the next detect (docs/gpukmod.md)
                self._detecting.discard(cmd.pidns)

    def _drop(self, exc: KmodError) -> None:
        """The module vanished under us (unloaded): forget it and look for it again later."""
        with self._lock:
            client, self._client = self._client, None
            self._set_absent(exc)
            self._next_try = self._clock() + self._retry_s
        if client is not None:
            client.close()

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()  # joins the notice thread

    def status(self) -> dict[str, Any]:
        with self._lock:
            return {
                "available": self._client is not None,
                "reason": self._reason,
                "added": len(self._added),
                "detecting": len(self._detecting),
                "notices": self.notices_total,
            }


class UtilizationWatcher:
    """Reads the metrics source every ``interval_s`` into an ``IdleDetector`` (thread gpushare-spot-scrape).

    The loop asks for ``verdicts(now)``; a state change (a GPU turned busy: maybe an owner
    back) wakes the loop at once instead of at its next period.
    """

    def __init__(
        self,
        scraper: Scraper,
        detector: IdleDetector,
        *,
        interval_s: float,
        is_process_level: bool,
        wake: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._scraper = scraper
        self._detector = detector
        self._interval_s = interval_s
        self.is_process_level = is_process_level
        self._wake = wake
        self._clock = clock
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._states: dict[str, IdleState] = {}
        self._busy_at: list[float] = []
        self.last_error = ""
        self.last_scrape_at: float | None = None
        self._thread: threading.Thread | None = None

    def scrape_once(self) -> dict[str, IdleStatus]:
        """One read (tests call it directly); failures mark every device unknown."""
        now = self._clock()
        try:
            result = self._scraper.read()
        except MetricsError as exc:
            with self._lock:
                statuses = self._detector.observe_failure(now, str(exc))
                if str(exc) != self.last_error:
                    log.warning("spot: metrics unreadable: %s", exc)
                self.last_error = str(exc)
        else:
            with self._lock:
                statuses = self._detector.observe_scrape(result.devices, now)
                self.last_error = ""
                self.last_scrape_at = now
        changed = False
        with self._lock:
            for device_id, st in statuses.items():
                if self._states.get(device_id) != st.state:
                    changed = True
                    if st.state is IdleState.BUSY:
                        self._busy_at.append(self._monotonic())
                self._states[device_id] = st.state
        if changed:
            self._wake()
        return statuses

    def take_busy_times(self) -> list[float]:
        """Monotonic times GPUs turned busy since the last call (candidate return signals)."""
        with self._lock:
            out, self._busy_at = self._busy_at, []
        return out

    def verdicts(self, now: float) -> dict[str, IdleVerdict]:
        with self._lock:
            statuses = self._detector.statuses(now)
        return {
            rid: verdict_from_status(rid, st, is_process_level=self.is_process_level) for rid, st in statuses.items()
        }

    def start(self, stop: threading.Event) -> None:
        def run() -> None:
            while not stop.is_set():
                try:
                    self.scrape_once()
                except Exception:  # top of a thread loop only (style §2.4): log, go on next interval
                    log.exception("spot: scrape pass failed")
                stop.wait(self._interval_s)

        self._thread = threading.Thread(target=run, name="gpushare-spot-scrape", daemon=True)
        self._thread.start()

    def join(self, timeout_s: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout_s)


class CgroupKiller:
    """``KillContainers`` -> every process of those containers dead (through their cgroups)."""

    def __init__(
        self,
        *,
        index: CgroupIndex | None = None,
        timeout_s: float = 2.0,
        use_freezer: bool = False,
        kill: Callable[..., KillReport] = kill_cgroups,
    ) -> None:
        self.index = index or CgroupIndex()
        self.use_freezer = use_freezer
        self._timeout_s = timeout_s
        self._kill = kill

    def prepare(self, container_ids: Iterable[str]) -> None:
        """Find cgroups ahead of a kill (the walk then is not on the return path)."""
        self.index.locate(container_ids)

    @property
    def timeout_s(self) -> float:
        return self._timeout_s

    def signal(self, action: KillContainers) -> tuple[list[ContainerCgroup], set[int]]:
        """SIGKILL every task of the containers' cgroups without waiting: (cgroups to watch, pids signalled)."""
        found = self.index.locate(action.container_ids)
        cgroups = list(found.values())
        signalled, _ = signal_cgroups(cgroups, use_freezer=self.use_freezer)
        self.index.forget(action.container_ids)
        log.info(
            "spot kill",
            extra=kv(
                pod=action.ref.key,
                reason=action.reason,
                containers=len(found),
                not_found=len(set(action.container_ids) - set(found)),
                signalled=len(signalled),
            ),
        )
        return cgroups, signalled

    def __call__(self, action: KillContainers) -> KillReport:
        found = self.index.locate(action.container_ids)
        report = self._kill(list(found.values()), timeout_s=self._timeout_s)
        self.index.forget(action.container_ids)
        gone = sorted(set(action.container_ids) - set(found))
        log.info(
            "spot kill done",
            extra=kv(
                pod=action.ref.key,
                reason=action.reason,
                containers=len(found),
                not_found=len(gone),
                signalled=report.signalled,
                took_ms=round(report.took_s * 1000, 2),
            ),
        )
        return report


@dataclass
class SpotCounters:
    """Counters and the return-to-dead histogram, rendered into the agent's /metrics."""

    kills: Counter[str] = field(default_factory=Counter)
    buckets: tuple[float, ...] = RETURN_BUCKETS_S
    counts: list[int] = field(default_factory=lambda: [0] * len(RETURN_BUCKETS_S))
    total: int = 0
    sum_s: float = 0.0
    last_return_s: float | None = None

    def observe_return(self, seconds: float) -> None:
        for i, bound in enumerate(self.buckets):
            if seconds <= bound:
                self.counts[i] += 1
        self.total += 1
        self.sum_s += seconds
        self.last_return_s = seconds

    def render(self, *, kmod_available: bool) -> list[str]:
        name = "gpushare_spot_return_seconds"
        lines = [
            "# HELP gpushare_spot_kills_total Borrower pods whose processes the agent killed, by reason.",
            "# TYPE gpushare_spot_kills_total counter",
            *(f'gpushare_spot_kills_total{{reason="{r}"}} {n}' for r, n in sorted(self.kills.items())),
            f"# HELP {name} From an owner's return signal to every process of a borrower pod dead.",
            f"# TYPE {name} histogram",
            *(f'{name}_bucket{{le="{b!r}"}} {n}' for b, n in zip(self.buckets, self.counts, strict=True)),
            f'{name}_bucket{{le="+Inf"}} {self.total}',
            f"{name}_sum {self.sum_s:g}",
            f"{name}_count {self.total}",
            "# HELP gpushare_spot_kmod_available 1 while the agent is gpukmod's registered listener.",
            "# TYPE gpushare_spot_kmod_available gauge",
            f"gpushare_spot_kmod_available {int(kmod_available)}",
        ]
        return lines


class SpotRuntime:
    """What the agent builds for spot; ``verdicts``/``notices``/``kmod_view``/``kmod``/``killer``/``pidns_of``
    are the loop's ``SpotHooks`` (controller/loop.py)."""

    def __init__(
        self,
        watcher: UtilizationWatcher | None,
        bridge: KmodBridge,
        killer: CgroupKiller,
        *,
        proc_root: str = "/proc",
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.watcher = watcher
        self.bridge = bridge
        self.kill_runner = killer
        self._proc_root = proc_root
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._pass_signals: list[float] = []
        self._pidns: dict[str, int] = {}
        self._pidns_missing: dict[str, float] = {}
        # (action, cgroups, return-signal time, time signalled, pids signalled, pids CPU-boosted)
        self._reaping: list[tuple[KillContainers, list[ContainerCgroup], float | None, float, set[int], set[int]]] = []
        self.exit_boost = ExitBoost()
        self._reaper: threading.Thread | None = None
        self._reaped = threading.Event()
        self._killed: OrderedDict[PodRef, None] = OrderedDict()
        # (pod, monotonic time its cgroups were seen empty), newest last: for benchmarks and tests.
        self.dead: deque[tuple[str, float]] = deque(maxlen=256)
        self.counters = SpotCounters()
        self.wake_target: Callable[[], None] = lambda: None  # the loop's wake(), set by the agent
        self.last_return: dict[str, Any] = {}

    @classmethod
    def from_config(cls, cfg: Config, *, use_kmod: bool = True) -> SpotRuntime:
        """Build from the config; the threads wake ``self.wake_target`` (set it to the loop's ``wake``)."""
        holder: list[SpotRuntime] = []

        def wake() -> None:
            holder[0].wake_target()

        watcher = None
        if cfg.metrics.source:
            watcher = UtilizationWatcher(
                Scraper.from_config(cfg.metrics),
                IdleDetector.from_config(cfg),
                interval_s=cfg.metrics.scrape_interval_s,
                is_process_level=cfg.metrics.process_level,
                wake=wake,
            )
        factory = _default_client if use_kmod else _refuse_kmod
        rt = cls(watcher, KmodBridge(unit=cfg.netlink_protocol, wake=wake, client_factory=factory), CgroupKiller())
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
        )

    def start(self, stop: threading.Event) -> None:
        self.bridge.start()
        if self.watcher is not None:
            self.watcher.start(stop)

    def close(self) -> None:
        """Stop the notice thread; the scrape thread ends with the ``stop`` event given to ``start``."""
        self.wait_dead()
        self.bridge.close()
        if self.watcher is not None:
            self.watcher.join(5.0)

    # --- SpotHooks --------------------------------------------------------------------------------

    def verdicts(self, now: float) -> Mapping[str, IdleVerdict]:
        return {} if self.watcher is None else self.watcher.verdicts(now)

    def notices(self) -> Sequence[int]:
        """Drain this pass's kernel notices; also fixes this pass's return-signal times."""
        drained = self.bridge.drain()
        busy = self.watcher.take_busy_times() if self.watcher is not None else []
        with self._lock:
            self._pass_signals = [t for _, t in drained] + busy
        return [p for p, _ in drained]

    def kmod_view(self) -> KmodView:
        return self.bridge.view()

    def kmod(self, cmd: KmodCommand) -> None:
        if cmd.op == "release":
            self.wait_dead()  # the owner's held ioctl runs only once every borrower is dead (design §6)
        self.bridge.apply(cmd)

    def killer(self, action: KillContainers) -> None:
        """SIGKILL the containers now and return; the reaper thread confirms the deaths.

        Signalling every borrower of a return first and waiting once lets their exits run in
        parallel (16 borrowers die in about the time of one). ``kmod("release")`` waits for
        the reaper, so the owner's ioctl still runs only after every borrower is dead.
        """
        cgroups, signalled = self.kill_runner.signal(action)
        with self._lock:
            # The plan kills a still-terminating pod again on every pass; count each pod once.
            is_first = action.ref not in self._killed
            if is_first:
                self._killed[action.ref] = None
                while len(self._killed) > 1024:
                    self._killed.popitem(last=False)
                self.counters.kills[action.reason] += 1
            is_return = is_first and action.reason == REASON_OWNER_BACK and bool(self._pass_signals)
            signal_at = min(self._pass_signals) if is_return else None
            self._reaping.append((action, cgroups, signal_at, self._monotonic(), signalled, set()))
            if self._reaper is None:
                self._reaped.clear()
                self._reaper = threading.Thread(target=self._reap, name="gpushare-spot-reaper", daemon=True)
                self._reaper.start()

    def _reap(self) -> None:
        while True:
            with self._lock:
                batch = list(self._reaping)
                if not batch:
                    self._reaper = None
                    self._reaped.set()
                    return
            done: list[Any] = []
            for entry in batch:
                action, cgroups, signal_at, signalled_at, signalled, boosted = entry
                listed = [(cg, cg.pids()) for cg in cgroups]
                left = [cg for cg, pids in listed if pids]
                now = self._monotonic()
                if not left:
                    done.append(entry)
                    self._observe_dead(action, signal_at, signalled_at, now)
                elif now - signalled_at > self.kill_runner.timeout_s:
                    done.append(entry)
                    try:
                        wait_cgroups_empty(left, timeout_s=0.0)
                    except KillTimeout as exc:
                        log.error("spot: %s", exc, extra=kv(pod=action.ref.key, reason=action.reason))
                elif now - signalled_at > BOOST_AFTER_S and (
                    slow := [p for _, pids in listed for p in pids if p in signalled and p not in boosted]
                ):
                    # Signalled but not yet gone: waiting for CPU behind their pod's weight.
                    boosted.update(slow)
                    self.exit_boost.move(slow)
                if any(p not in signalled for _, pids in listed for p in pids):
                    # Tasks we never signalled: children forked between our read and our signal.
                    # Kill them; if forks still come after FREEZE_AFTER_S, freeze first so a fork
                    # loop cannot stay ahead. Tasks already signalled are only dying: wait.
                    again, _ = signal_cgroups(left, use_freezer=now - signalled_at > FREEZE_AFTER_S)
                    signalled |= again
            with self._lock:
                self._reaping = [e for e in self._reaping if e not in done]
            if len(done) < len(batch):
                time.sleep(0.0005)

    def _observe_dead(
        self, action: KillContainers, signal_at: float | None, signalled_at: float, dead_at: float
    ) -> None:
        with self._lock:
            self.dead.append((action.ref.key, dead_at))
            if signal_at is not None:
                took_s = dead_at - signal_at
                self.counters.observe_return(took_s)
                self.last_return = {
                    "pod": action.ref.key,
                    "return_to_dead_ms": round(took_s * 1000, 2),
                    "kill_ms": round((dead_at - signalled_at) * 1000, 2),
                    "at": time.time(),
                }

    def wait_dead(self, timeout_s: float | None = None) -> bool:
        """Block until every killed borrower is confirmed dead (or given up on); False on timeout."""
        with self._lock:
            if self._reaper is None:
                return True
        return self._reaped.wait(self.kill_runner.timeout_s + 1.0 if timeout_s is None else timeout_s)

    def pidns_of(self, container_id: str) -> int | None:
        """The pid-namespace inode of a container's first process (cached: it never changes)."""
        now = self._monotonic()
        with self._lock:
            if container_id in self._pidns:
                return self._pidns[container_id]
            # The loop asks for every container every pass; one not found (exited, not started)
            # is looked for again only after a pause, so the cgroup walk stays off most passes.
            if now - self._pidns_missing.get(container_id, -PIDNS_RETRY_S) < PIDNS_RETRY_S:
                return None
        cg = self.kill_runner.index.locate([container_id]).get(container_id)
        if cg is None:
            with self._lock:
                if len(self._pidns_missing) > 4096:
                    self._pidns_missing.clear()
                self._pidns_missing[container_id] = now
            return None
        try:
            pid = cg.first_pid(proc_root=self._proc_root)
            inode = None if pid is None else pidns_inode(pid, proc_root=self._proc_root)
        except ProcessError as exc:
            log.debug("spot: no pidns for %s: %s", container_id, exc)
            return None
        if inode is not None:
            with self._lock:
                if len(self._pidns) > 4096:  # containers come and go; never grow without bound
                    self._pidns.clear()
                self._pidns[container_id] = inode
        return inode

    # --- status and metrics -----------------------------------------------------------------------

    def mode(self) -> str:
        if self.bridge.available:
            return "kernel module + utilization"
        if self.watcher is not None and self.watcher.is_process_level:
            return "utilization alone (gpukmod not loaded)"
        return "no return signal (gpukmod not loaded, metrics do not attribute GPU use to pods): nothing is lent"

    def status(self) -> dict[str, Any]:
        """For ``gpushare status``: how returns are seen, the module, metrics, the last return."""
        with self._lock:
            kills = dict(self.counters.kills)
            last = dict(self.last_return)
        return {
            "mode": self.mode(),
            "kmod": self.bridge.status(),
            "metrics": None
            if self.watcher is None
            else {
                "process_level": self.watcher.is_process_level,
                "last_scrape_at": self.watcher.last_scrape_at,
                "error": self.watcher.last_error,
            },
            "kills": kills,
            "last_return": last,
        }

    def metrics_lines(self) -> list[str]:
        with self._lock:
            return self.counters.render(kmod_available=self.bridge.available)


def _refuse_kmod(unit: int) -> KmodLike:
    raise KmodError(errno.EPROTONOSUPPORT, "open", "the kernel module is disabled (gpushare agent --no-kmod)")


__all__ = [
    "CgroupKiller",
    "KmodBridge",
    "SpotCounters",
    "SpotRuntime",
    "UtilizationWatcher",
]
