"""``KillPods`` done on the host: every task of each borrower pod, through its pod-level cgroup.

``PodKiller`` finds where kubelet puts pods on this node (``cgroups.detect_layout``: cgroup v1
or v2, cgroupfs or systemd driver), finds each borrower's pod cgroup by its uid
(``find_pod_cgroup``, cached: the walk is done when the pass first sees a borrower, not on the
return path) and kills them all together with ``podcgroups.pod_kill.kill_pods``, which returns the moment
every pod cgroup is empty or at the bound. The pod cgroup holds every container of the pod:
ephemeral ones, and ones kubelet (re)starts after the kill began.

It never reports a kill that did nothing as a success (docs/spot.md, "never pretend"): the
outcome names an error when no pod cgroup can be found on the node, when the kill failed, or
when it signalled no task although kubelet reported the pod's containers running.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from controller.core.actions import KillPods
from gpushare.errors import GpushareError
from gpushare.log import kv
from podcgroups.cgroups import CgroupLayout, PodCgroup, detect_layout, find_pod_cgroup
from podcgroups.pod_kill import PodKillReport, kill_pods

log = logging.getLogger(__name__)

DEFAULT_KILL_BOUND_S = 2.0  # a task alive this long after SIGKILL is stuck in the kernel (D state)
LAYOUT_RECHECK_S = 30.0  # how often the node's cgroup layout is looked at again (kubelet may start later)
_MAX_CACHED = 4096  # pod cgroups remembered; pods come and go

# The error labels of gpushare_spot_kill_errors_total.
ERROR_NO_CGROUPS = "no_cgroups"  # the node's pod cgroups cannot be found at all (lending is blocked)
ERROR_NO_CGROUP = "no_cgroup"  # a pod kubelet reports running has no pod cgroup here
ERROR_NO_TASKS = "no_tasks"  # the kill signalled no task while kubelet reports the pods' containers running
ERROR_FAILED = "failed"  # writing the cgroup files or signalling failed

Detect = Callable[[Path], "CgroupLayout | str"]
Find = Callable[[str, CgroupLayout], "PodCgroup | None"]
Kill = Callable[..., PodKillReport]


@dataclass(frozen=True)
class KillOutcome:
    """What one ``PodKiller.kill`` did; ``error`` is "" or one of the ``ERROR_*`` labels."""

    action: KillPods
    started_at: float  # monotonic
    took_s: float  # from the start to every pod cgroup empty (or the bound)
    signalled: int
    remaining: tuple[int, ...] = ()  # tasks still alive at the bound
    not_found: tuple[str, ...] = ()  # pods ("ns/name") with no pod cgroup on this node
    error: str = ""
    detail: str = ""
    signalled_s: float = 0.0  # from the start until every pod had its first signal
    boosted: int = 0  # CPU weights raised for the kill (podcgroups.exit_boost)
    froze: bool = False  # a freezer was used (v2 without cgroup.kill, or v1 against a fork loop)

    @property
    def timed_out(self) -> bool:
        return bool(self.remaining)

    @property
    def dead_at(self) -> float:
        return self.started_at + self.took_s


class PodKiller:
    """Kills borrower pods through their pod cgroups; safe to call from several threads."""

    def __init__(
        self,
        *,
        cgroup_root: str = "/sys/fs/cgroup",
        timeout_s: float = DEFAULT_KILL_BOUND_S,
        detect: Detect = detect_layout,
        find: Find = find_pod_cgroup,
        kill: Kill = kill_pods,
        monotonic: Callable[[], float] = time.monotonic,
        recheck_s: float = LAYOUT_RECHECK_S,
    ) -> None:
        self.cgroup_root = cgroup_root
        self._timeout_s = timeout_s
        self._detect, self._find, self._kill = detect, find, kill
        self._monotonic = monotonic
        self._recheck_s = recheck_s
        self._lock = threading.Lock()
        self._layout: CgroupLayout | str = "not looked for yet"
        self._next_check = float("-inf")
        self._cache: dict[str, PodCgroup] = {}

    @property
    def timeout_s(self) -> float:
        """The kill bound: how long a killed pod's tasks may take to die before the owner is released anyway."""
        return self._timeout_s

    def layout(self) -> CgroupLayout | str:
        """The node's pod-cgroup layout, or why there is none; looked at again every ``recheck_s``."""
        now = self._monotonic()
        with self._lock:
            if now < self._next_check:
                return self._layout
            self._next_check = now + self._recheck_s
            before = self._layout
        found = self._detect(Path(self.cgroup_root))
        with self._lock:
            self._layout = found
            if isinstance(found, str) or found != before:
                self._cache.clear()
        if isinstance(found, str) and found != before:
            log.warning("spot: no pod cgroups; nothing is lent on this node: %s", found)
        elif not isinstance(found, str) and found != before:
            log.info("spot: pod cgroups found: %s", found.describe())
        return found

    def blocked(self) -> str:
        """Why no borrower could be killed here ("" when pod cgroups are found)."""
        found = self.layout()
        return found if isinstance(found, str) else ""

    def describe(self) -> str:
        """The layout in one line, for ``gpushare status``."""
        with self._lock:
            found = self._layout
        return f"none ({found})" if isinstance(found, str) else found.describe()

    def prepare(self, pod_uids: Iterable[str]) -> None:
        """Find these pods' cgroups ahead of a kill (the pass calls it for every borrower it arms)."""
        found = self.layout()
        if isinstance(found, str):
            return
        wanted = set(pod_uids)
        with self._lock:
            missing = wanted - set(self._cache)
            if len(self._cache) > _MAX_CACHED:
                self._cache = {uid: cg for uid, cg in self._cache.items() if uid in wanted}
        for uid in sorted(missing):
            try:
                cg = self._find(uid, found)
            except (GpushareError, ValueError) as exc:
                log.warning("spot: cannot look for a pod cgroup: %s", exc, extra=kv(uid=uid))
                continue
            if cg is not None:
                with self._lock:
                    self._cache[uid] = cg

    def _locate(self, action: KillPods, layout: CgroupLayout) -> tuple[list[PodCgroup], list[str]]:
        cgroups, not_found = [], []
        for target in action.pods:
            with self._lock:
                cg = self._cache.get(target.ref.uid)
            if cg is None:
                cg = self._find(target.ref.uid, layout)  # not started when armed, or never armed
                if cg is not None:
                    with self._lock:
                        self._cache[target.ref.uid] = cg
            if cg is None:
                not_found.append(target.ref.key)
            else:
                cgroups.append(cg)
        return cgroups, not_found

    def kill(self, action: KillPods, *, first: frozenset[str] = frozenset()) -> KillOutcome:
        """SIGKILL every task of the pods and return once all are gone or the bound has passed.

        ``first``: uids of the pods killed here for the first time. Only those can make the kill
        an error: a pod killed again (every pass until the API deletes it) rightly finds nothing.
        """
        started = self._monotonic()
        found = self.layout()
        if isinstance(found, str):
            # Nothing could be killed; an error only if kubelet reports something running there.
            running = any(t.running > 0 for t in action.pods if t.ref.uid in first)
            error = ERROR_NO_CGROUPS if running else ""
            return self._done(KillOutcome(action, started, 0.0, 0, error=error, detail=found), first)
        try:
            cgroups, not_found = self._locate(action, found)
            report = self._kill(cgroups, timeout_s=self._timeout_s) if cgroups else None
        except (GpushareError, OSError, ValueError) as exc:
            took = self._monotonic() - started
            return self._done(KillOutcome(action, started, took, 0, error=ERROR_FAILED, detail=str(exc)), first)
        if report is None:
            outcome = KillOutcome(action, started, self._monotonic() - started, 0, not_found=tuple(not_found))
            return self._done(outcome, first)
        error, detail = "", ""
        # Tasks were there and none could be signalled, or a pod could not even be read: not a kill.
        if report.signalled_none or (report.errors and report.unconfirmed and not report.timed_out):
            error, detail = ERROR_FAILED, "; ".join(report.errors) or "tasks listed but none could be signalled"
        outcome = KillOutcome(
            action,
            started,
            report.took_s,
            report.signalled,
            report.remaining,
            tuple(not_found),
            error,
            detail,
            report.signalled_s,
            report.boosted,
            report.froze,
        )
        return self._done(outcome, first)

    def _done(self, outcome: KillOutcome, first: frozenset[str]) -> KillOutcome:
        """Classify (``_error_of``) and log the outcome: one INFO line, or an ERROR naming what went wrong."""
        error, detail = outcome.error, outcome.detail
        if not error:
            error, detail = _error_of(outcome, first)
        fields = kv(
            pods=",".join(r.key for r in outcome.action.refs),
            reason=outcome.action.reason,
            signalled=outcome.signalled,
            took_ms=round(outcome.took_s * 1000, 2),
            signalled_ms=round(outcome.signalled_s * 1000, 2),
            boosted=outcome.boosted,
            froze=outcome.froze,
            not_found=",".join(outcome.not_found),
        )
        if error and not first:
            # A pod killed before, killed again each pass until the API deletes it: known already.
            log.debug("spot kill again failed (%s): %s", error, detail, extra=fields)
        elif error:
            log.error("spot kill failed (%s): %s", error, detail, extra=fields)
        elif outcome.timed_out:
            log.error(
                "spot kill: tasks %s survived SIGKILL for %gs (stuck in the kernel, D state); the owner is "
                "released anyway",
                list(outcome.remaining),
                self._timeout_s,
                extra=fields,
            )
        else:
            log.info("spot kill", extra=fields)
        return dataclasses.replace(outcome, error=error, detail=detail)


def _error_of(outcome: KillOutcome, first: frozenset[str]) -> tuple[str, str]:
    """("", "") for a kill that did what it should; else the error label and what happened."""
    running = [t for t in outcome.action.pods if t.ref.uid in first and t.running > 0]
    if not running:
        return "", ""
    if outcome.signalled == 0:
        names = ", ".join(f"{t.ref.key} ({t.running} running)" for t in running)
        return ERROR_NO_TASKS, f"signalled no task although kubelet reports containers running: {names}"
    missing = [t.ref.key for t in running if t.ref.key in outcome.not_found]
    if missing:
        return ERROR_NO_CGROUP, f"no pod cgroup found for running pods {', '.join(missing)}"
    return "", ""


__all__ = [
    "DEFAULT_KILL_BOUND_S",
    "ERROR_FAILED",
    "ERROR_NO_CGROUP",
    "ERROR_NO_CGROUPS",
    "ERROR_NO_TASKS",
    "LAYOUT_RECHECK_S",
    "KillOutcome",
    "PodKiller",
]
