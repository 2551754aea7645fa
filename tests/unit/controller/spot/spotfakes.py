"""Stand-ins shared by the spot unit tests: a recording gpukmod client, a watcher on a fake exporter
file, and the host's cgroups as recording functions (``FakeHost``)."""

from __future__ import annotations

import errno
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from controller.core.detectors import IdleDetector
from controller.spot.utilization import UtilizationWatcher
from gpukmod import KmodError
from gpumetrics.scrape import Scraper
from podcgroups.cgroups import CgroupDriver, CgroupLayout, CgroupVersion, PodCgroup
from podcgroups.pod_kill import PodKillReport


class RecordingClient:
    """Stands in for gpukmod.KmodClient: records commands, fails the ones told to."""

    def __init__(self, fail: dict[str, int] | None = None) -> None:
        self.calls: list[tuple[str, int]] = []
        self.fail = fail or {}
        self.callback: Callable[[int], None] | None = None
        self.closed = False
        self.registered = False

    def register(self) -> None:
        self.registered = True

    def _cmd(self, op: str, ids: tuple[int, ...]) -> None:
        if op in self.fail:
            raise KmodError(self.fail[op], op, f"ids {list(ids)}")
        self.calls.extend((op, i) for i in ids)

    def add(self, *ids: int) -> None:
        self._cmd("add", ids)

    def delete(self, *ids: int) -> None:
        self._cmd("delete", ids)

    def detect(self, *ids: int) -> None:
        self._cmd("detect", ids)

    def undetect(self, *ids: int) -> None:
        self._cmd("undetect", ids)

    def release(self, *ids: int) -> None:
        self._cmd("release", ids)

    def start_notices(self, callback: Callable[[int], None], *, name: str = "") -> None:
        self.callback = callback

    def close(self) -> None:
        self.closed = True


def absent(unit: int) -> RecordingClient:
    raise KmodError(errno.EPROTONOSUPPORT, "open")


def watcher_on(path: Path, *, window_s: float = 10.0) -> tuple[UtilizationWatcher, list[int], list[float]]:
    wall = [1000.0]
    wakes: list[int] = []
    watcher = UtilizationWatcher(
        Scraper(str(path)),
        IdleDetector(window_s=window_s, threshold_pct=0.0, max_gap_s=30.0),
        interval_s=1.0,
        is_process_level=True,
        wake=lambda: wakes.append(1),
        clock=lambda: wall[0],
    )
    return watcher, wakes, wall


LAYOUT = CgroupLayout(CgroupVersion.V2, CgroupDriver.CGROUPFS, Path("/sys/fs/cgroup"))


def kill_report(
    signalled: int, took_s: float = 0.004, remaining: tuple[int, ...] = (), errors: tuple[str, ...] = ()
) -> PodKillReport:
    """What ``kill_pods`` answers: ``signalled`` tasks found and signalled, ``remaining`` alive at the bound."""
    return PodKillReport(
        signalled=signalled,
        took_s=took_s,
        remaining=remaining,
        used_cgroup_kill=True,
        tasks_at_start=signalled,
        unconfirmed=("uid-a",) if remaining or errors else (),
        errors=errors,
    )


@dataclass
class FakeHost:
    """detect/find/kill as PodKiller calls them; ``pods`` are the uids that have a pod cgroup."""

    layout: CgroupLayout | str = LAYOUT
    pods: set[str] = field(default_factory=lambda: {"uid-a", "uid-b"})
    report: PodKillReport = field(default_factory=lambda: kill_report(5))
    fail: Exception | None = None
    on_kill: Callable[[], None] | None = None  # runs inside kill (order checks, a slow kill)
    detected: int = 0
    found: list[str] = field(default_factory=list)
    killed: list[tuple[str, ...]] = field(default_factory=list)

    def detect(self, _root: Path) -> CgroupLayout | str:
        self.detected += 1
        return self.layout

    def find(self, uid: str, layout: CgroupLayout) -> PodCgroup | None:
        self.found.append(uid)
        return PodCgroup(uid, layout, (layout.root / f"pod{uid}",)) if uid in self.pods else None

    def kill(self, pods: Sequence[PodCgroup], *, timeout_s: float) -> PodKillReport:
        self.killed.append(tuple(p.pod_uid for p in pods))
        if self.on_kill is not None:
            self.on_kill()
        if self.fail is not None:
            raise self.fail
        return self.report
