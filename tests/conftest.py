"""Test-suite rules shared by every tier.

- Integration tests (real containerd, kubelet, kernel in QEMU) run after everything else.
- A test that leaves a thread running fails: leaked threads hide hangs and races.
- A skip is never a pass: any skipped (or xfailed) test fails the run, unless its tier is named in
  ``GPUSHARE_ALLOW_SKIP`` (space- or comma-separated; CI never sets it), e.g.
  ``GPUSHARE_ALLOW_SKIP="kernel containerd" make test`` on a machine without QEMU or root. A tier is
  ``unit``, ``property`` or the name of a ``tests/integration/<tier>`` directory. Plain ``pytest``
  behaves exactly like ``make test``.
- The terminal summary ends with each tier's time (setup, call and teardown of its tests).
- ``make test`` runs the tiers in three lanes side by side (pytest-xdist, ``-n 3 --dist loadgroup``):
  each tier belongs to one lane (``LANES``) and a lane's tests run in order in one worker. The
  lanes are sized so they end together: the QEMU guests need about one core and nothing else,
  while the cluster tiers leave the machine's cores half idle waiting on kubelet and containerd.
  Each worker is its own process, so a lane whose tiers use the session cluster gets its own.
  Plain ``pytest`` runs the same tests in one process, one after the other.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

# The property tests check outcomes, never time: on a loaded CI machine hypothesis's default
# 200 ms deadline per example would fail them for being slow, which is noise, not a defect.
settings.register_profile("gpushare", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("gpushare")

TESTS = Path(__file__).resolve().parent
ALLOW_SKIP_ENV = "GPUSHARE_ALLOW_SKIP"


def known_tiers() -> list[str]:
    integration = sorted(p.name for p in (TESTS / "integration").iterdir() if p.is_dir() and p.name != "__pycache__")
    return ["unit", "property", *integration]


def tier_of(path: Path) -> str:
    """``unit``, ``property`` or ``<tier>`` of tests/integration/<tier>; ``other`` outside them."""
    try:
        parts = path.resolve().relative_to(TESTS).parts
    except ValueError:
        return "other"
    if len(parts) > 2 and parts[0] == "integration":
        return parts[1]
    return parts[0] if len(parts) > 1 else "other"


def allowed_skip_tiers(value: str, known: list[str]) -> set[str]:
    """The tiers named in ``GPUSHARE_ALLOW_SKIP``; a name that is no tier is an error, not a no-op."""
    names = {n for n in value.replace(",", " ").split() if n}
    unknown = sorted(names - set(known))
    if unknown:
        raise pytest.UsageError(f"{ALLOW_SKIP_ENV} names no tier: {', '.join(unknown)}; tiers: {', '.join(known)}")
    return names


def skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    if getattr(report, "wasxfail", None) is not None:
        return f"xfail: {getattr(report, 'wasxfail', '')}"
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # (path, line, "Skipped: reason")
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def tier_order(tier: str) -> tuple[int, str]:
    order = known_tiers()
    return (order.index(tier), tier) if tier in order else (len(order), tier)


@dataclass(eq=False)  # pluggy keeps plugins in sets: hashed by identity
class TierLedger:
    """A pytest plugin: per tier, the wall time of its test phases, its tests, and its skips."""

    allowed: set[str]
    seconds: dict[str, float] = field(default_factory=dict)
    tests: dict[str, set[str]] = field(default_factory=dict)
    skipped: list[tuple[str, str, str]] = field(default_factory=list)  # (tier, nodeid, reason)

    def hidden(self) -> list[tuple[str, str, str]]:
        """Skips that fail the run: those of tiers not allowed to skip."""
        return [s for s in self.skipped if s[0] not in self.allowed]

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.skipped:  # a whole module skipped at import (pytest.skip(allow_module_level=True))
            self.skipped.append((tier_of(Path(str(report.fspath))), report.nodeid, skip_reason(report)))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        tier = tier_of(Path(str(report.fspath)))
        self.seconds[tier] = self.seconds.get(tier, 0.0) + report.duration
        self.tests.setdefault(tier, set()).add(report.nodeid)
        if report.skipped:
            self.skipped.append((tier, report.nodeid, skip_reason(report)))

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        # Runs inside the terminal reporter's hook wrapper, before its summary; the exit status set
        # here is the one pytest exits with.
        if self.hidden() and exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.seconds:
            terminalreporter.section("wall time per tier")
            for tier, seconds in sorted(self.seconds.items(), key=lambda kv: tier_order(kv[0])):
                terminalreporter.line(f"{tier:14} {seconds:8.1f} s  {len(self.tests[tier]):5} tests")
        allowed = [s for s in self.skipped if s[0] in self.allowed]
        if allowed:
            terminalreporter.section(f"skips allowed by {ALLOW_SKIP_ENV}", yellow=True)
            for tier, nodeid, reason in allowed:
                terminalreporter.line(f"[{tier}] {nodeid}: {reason}")
        hidden = self.hidden()
        if hidden:
            terminalreporter.section("skipped tests fail the run", red=True)
            for tier, nodeid, reason in hidden:
                terminalreporter.line(f"[{tier}] {nodeid}: {reason}", red=True)
            tiers = " ".join(sorted({s[0] for s in hidden}, key=tier_order))
            terminalreporter.line(
                "a skip is never a pass: make the tier run here or, on a machine that cannot run it, "
                f'allow it by name: {ALLOW_SKIP_ENV}="{tiers}"',
                red=True,
            )


def pytest_configure(config: pytest.Config) -> None:
    allowed = allowed_skip_tiers(os.environ.get(ALLOW_SKIP_ENV, ""), known_tiers())
    config.pluginmanager.register(TierLedger(allowed), "gpushare-tier-ledger")


# Which lane each tier runs in under ``make test`` (about 16 to 17 minutes each on a 2-core
# machine): the session cluster's longest tiers; the CPU-bound unit tiers with the private-cluster
# ones and the rest of the session cluster's; the QEMU guests with the tiers that start no kubelet
# (nvidia: NVIDIA's binaries on the fake driver and two private containerds), and the DRA and
# admission tiers, which share that lane's own session cluster, and the oldest-kubelet tier.
LANES = {
    "admission": "guests",
    "cluster": "session-cluster",
    "doctor": "session-cluster",
    "e2e": "session-cluster",
    "kubelet_peer": "session-cluster",
    "unit": "mixed",
    "property": "mixed",
    "containerd": "mixed",
    "failover": "mixed",
    "lowest_deps": "mixed",  # the unit and property tiers again, at the floors: after them, on the same cores
    "kubectl_dist": "mixed",
    "scale": "mixed",
    "spot": "mixed",
    "kernel": "guests",
    "failclosed": "guests",
    "kube": "guests",
    "nvidia": "guests",
    "dra": "guests",
    "kube_oldest": "guests",
    "replay": "guests",  # a 50-node slice of the GPU trace on the lane's own session cluster
}


def lane_of(nodeid: str) -> str:
    """The lane of a test id (``tests/integration/e2e/test_x.py::test_y``); a tier not in LANES
    (a new one) runs in the session cluster's lane rather than on its own."""
    return LANES.get(tier_of(TESTS.parent / nodeid.split("::", 1)[0]), "session-cluster")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under ``--dist loadgroup``, the groups are the lanes: each lane is one unit of work, sent
    whole to one worker, its tests in collection order (pytest-xdist's scope scheduling)."""
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling  # noqa: PLC0415  (only a parallel run has xdist loaded)

    class LaneScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return lane_of(nodeid)

    return LaneScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "/tests/integration/" in str(item.fspath):
            item.add_marker(pytest.mark.integration)
    # Stable sort: non-integration first, in collection order.
    items.sort(key=lambda it: it.get_closest_marker("integration") is not None)


@pytest.fixture(autouse=True)
def _root_logger_restored() -> Iterator[None]:
    """Each test leaves the root logger as it found it. A command run in-process installs a
    handler on sys.stderr (gpushare/log.py), which under CliRunner is a buffer closed when the
    command returns; left in place, every later log line of any test, from any thread, fails
    with 'I/O operation on closed file'."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def _pool_of(thread: threading.Thread) -> str | None:
    """The prefix of a pool worker's name ("<prefix>_<n>", as ThreadPoolExecutor names them), else None."""
    head, sep, tail = thread.name.rpartition("_")
    return head if sep and head and tail.isdecimal() else None


@pytest.fixture(autouse=True)
def _no_leaked_threads() -> Iterator[None]:
    before = set(threading.enumerate())
    # A thread pool is named "<prefix>_<n>" and starts its workers only as work comes: a server a
    # wider-scoped fixture started before this test may grow a worker during it and stop it later.
    pools_before = {_pool_of(t) for t in before} - {None}
    yield
    # A gRPC server's executor threads end seconds after stop() on a machine running three lanes of
    # clusters; only a thread still alive after this is a leak.
    deadline = time.monotonic() + 10.0
    while True:
        new = [t for t in threading.enumerate() if t not in before and t.is_alive() and _pool_of(t) not in pools_before]
        leaked = [t for t in new if not t.daemon and not t.name.startswith("grpc")]
        leaked += [t for t in new if t.daemon and t.name.startswith("gpushare-")]
        if not leaked or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    assert not leaked, f"test leaked threads: {[t.name for t in leaked]}"
