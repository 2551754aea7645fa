"""The I/O side of spot (design §6, §7): what ``plan_spot`` decides, done on the host.

    SpotRuntime                 one object the agent builds; its methods are the loop's SpotHooks
    ├── UtilizationWatcher      utilization.py: thread gpushare-spot-scrape, Scraper -> IdleDetector
    ├── KmodBridge              kmod_bridge.py: gpukmod commands and notices (thread
    │                           gpushare-spot-kmod-notices); absent module = utilization only
    ├── CgroupKiller, Reaper    killer.py: KillContainers -> SIGKILL every borrower cgroup now; the
    │                           thread gpushare-spot-reaper confirms the deaths
    └── PidnsCache              pidns.py: container ID -> pid namespace gpukmod watches

Threads only move data: a notice or a changed idle state is queued as plain values and the
loop is woken (``wake``); every decision stays in ``plan_spot``. The return-to-dead latency
is measured from the moment the signal reached this process (a notice read from the
socket, or the scrape that first showed the GPU busy) to the moment a borrower's cgroup
lists no task, one observation per borrower pod.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from controller.core.actions import REASON_OWNER_BACK, KillContainers, KmodCommand
from controller.core.detectors import IdleDetector, IdleVerdict
from controller.core.pod_facts import PodRef
from controller.core.spot_solver import KmodView
from controller.metrics.scrape import Scraper
from controller.spot.cgroups import PROC_ROOT
from controller.spot.counters import SpotCounters
from controller.spot.killer import CgroupKiller, Reaper
from controller.spot.kmod_bridge import KmodBridge, open_kmod, refuse_kmod
from controller.spot.pidns import PidnsCache
from controller.spot.utilization import UtilizationWatcher
from controller.spot_hooks import SpotHooks
from gpushare.config import Config

_MAX_KILLED = 1024  # pods remembered as killed, so a pod killed again each pass is counted once


class SpotRuntime:
    """What the agent builds for spot; ``verdicts``/``notices``/``kmod_view``/``kmod``/``killer``/``pidns_of``
    are the loop's ``SpotHooks`` (controller/spot_hooks.py)."""

    def __init__(
        self,
        watcher: UtilizationWatcher | None,
        bridge: KmodBridge,
        killer: CgroupKiller,
        *,
        proc_root: str = PROC_ROOT,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.watcher = watcher
        self.bridge = bridge
        self.kill_runner = killer
        self.reaper = Reaper(killer, self._observe_dead, monotonic=monotonic)
        self._pidns = PidnsCache(killer.index, proc_root=proc_root, monotonic=monotonic)
        self._lock = threading.Lock()
        self._pass_signals: list[float] = []
        self._killed: OrderedDict[PodRef, None] = OrderedDict()
        # (pod, monotonic time its cgroups were seen empty), newest last: for benchmarks and tests.
        self.dead: deque[tuple[str, float]] = deque(maxlen=256)
        # A collector in the agent's registry; the bridge is looked up at scrape time (tests swap it).
        self.counters = SpotCounters(kmod_available=lambda: self.bridge.available)
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
        factory = open_kmod if use_kmod else refuse_kmod
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

        ``kmod("release")`` waits for the reaper, so the owner's ioctl still runs only after
        every borrower is dead.
        """
        cgroups, signalled = self.kill_runner.signal(action)
        with self._lock:
            # The plan kills a still-terminating pod again on every pass; count each pod once.
            is_first = action.ref not in self._killed
            if is_first:
                self._killed[action.ref] = None
                while len(self._killed) > _MAX_KILLED:
                    self._killed.popitem(last=False)
                self.counters.kills[action.reason] += 1
            is_return = is_first and action.reason == REASON_OWNER_BACK and bool(self._pass_signals)
            signal_at = min(self._pass_signals) if is_return else None
        self.reaper.watch(action, cgroups, signal_at, signalled)

    def pidns_of(self, container_id: str) -> int | None:
        """The pid-namespace inode of a container's first process (cached: it never changes)."""
        return self._pidns.lookup(container_id)

    def wait_dead(self, timeout_s: float | None = None) -> bool:
        """Block until every killed borrower is confirmed dead (or given up on); False on timeout."""
        return self.reaper.wait(timeout_s)

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

    # --- status ---------------------------------------------------------------------------------------

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


__all__ = ["SpotRuntime"]
