"""Stand-ins shared by the spot unit tests: a recording gpukmod client and a watcher on a fake exporter file."""

from __future__ import annotations

import errno
from collections.abc import Callable
from pathlib import Path

from controller.core.detectors import IdleDetector
from controller.metrics.scrape import Scraper
from controller.spot.utilization import UtilizationWatcher
from gpukmod import KmodError


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
