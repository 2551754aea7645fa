"""controller.spot.killer: which pod cgroups a KillPods reaches, and a kill that did nothing is an error.

The cgroup side is replaced by recording functions here (what ``kill_pods`` does to real tasks is
tested in tests/unit/podcgroups/test_pod_kill.py, and end to end in test_runtime.py and the spot tiers).
"""

from __future__ import annotations

import pytest

from controller.core.actions import REASON_OWNER_BACK, KillPods, PodToKill
from controller.core.pod_facts import PodRef
from controller.spot.killer import (
    ERROR_FAILED,
    ERROR_NO_CGROUP,
    ERROR_NO_CGROUPS,
    ERROR_NO_TASKS,
    PodKiller,
)
from podcgroups.errors import ProcessError
from tests.unit.controller.spot.spotfakes import LAYOUT, FakeHost, kill_report

A = PodRef("spot", "a", "uid-a")
B = PodRef("spot", "b", "uid-b")


def killer(host: FakeHost, clock: list[float] | None = None) -> PodKiller:
    now = clock or [0.0]
    return PodKiller(detect=host.detect, find=host.find, kill=host.kill, monotonic=lambda: now[0], recheck_s=30.0)


def kill_of(*pods: tuple[PodRef, int]) -> KillPods:
    return KillPods(tuple(PodToKill(ref, running) for ref, running in pods), REASON_OWNER_BACK)


def test_every_pod_of_the_action_is_killed_together_through_its_pod_cgroup() -> None:
    host = FakeHost()
    out = killer(host).kill(kill_of((A, 1), (B, 2)), first=frozenset({"uid-a", "uid-b"}))
    assert host.killed == [("uid-a", "uid-b")]
    assert not out.error and not out.timed_out and out.signalled == 5 and out.took_s == 0.004


def test_pod_cgroups_found_ahead_are_not_looked_for_on_the_return_path() -> None:
    host = FakeHost()
    k = killer(host)
    k.prepare(["uid-a", "uid-gone"])
    assert host.found == ["uid-a", "uid-gone"]
    k.kill(kill_of((A, 1)), first=frozenset({"uid-a"}))
    assert host.found == ["uid-a", "uid-gone"]  # cached
    host.pods.add("uid-late")
    k.kill(kill_of((PodRef("spot", "late", "uid-late"), 1)), first=frozenset({"uid-late"}))
    assert host.found[-1] == "uid-late" and host.killed[-1] == ("uid-late",)  # not armed in time: looked up then


@pytest.mark.parametrize(
    ("host", "running", "first", "error"),
    [
        (FakeHost(report=kill_report(0)), 1, True, ERROR_NO_TASKS),  # found nothing to signal, yet running
        (FakeHost(report=kill_report(0)), 0, True, ""),  # nothing running: nothing to signal is right
        (FakeHost(report=kill_report(0)), 1, False, ""),  # killed before: finding nothing is right
        (FakeHost(pods={"uid-b"}), 1, True, ERROR_NO_CGROUP),  # a running pod without a pod cgroup
        (FakeHost(fail=ProcessError("gpushare: cannot write cgroup.kill")), 1, True, ERROR_FAILED),
        (FakeHost(report=kill_report(0, errors=("pod uid-a: cannot read cgroup.procs",))), 0, True, ERROR_FAILED),
        (FakeHost(layout="no kubepods cgroup under /x"), 1, True, ERROR_NO_CGROUPS),
        (FakeHost(layout="no kubepods cgroup under /x"), 0, True, ""),  # nothing was running there
    ],
)
def test_a_kill_that_did_nothing_is_an_error_never_a_success(
    host: FakeHost, running: int, first: bool, error: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("ERROR"):
        out = killer(host).kill(kill_of((A, running), (B, 0)), first=frozenset({"uid-a"} if first else ()))
    assert out.error == error
    assert bool(error and first) == ("spot kill failed" in caplog.text)


def test_the_bound_is_reported_with_the_survivors(caplog: pytest.LogCaptureFixture) -> None:
    host = FakeHost(report=kill_report(3, took_s=2.0, remaining=(4242,)))
    with caplog.at_level("ERROR"):
        out = killer(host).kill(kill_of((A, 1)), first=frozenset({"uid-a"}))
    assert out.timed_out and not out.error and out.remaining == (4242,)
    assert "[4242] survived SIGKILL" in caplog.text


def test_the_layout_is_looked_at_again_later_and_blocked_says_why(caplog: pytest.LogCaptureFixture) -> None:
    clock = [0.0]
    host = FakeHost(layout="no kubepods cgroup under /empty (cgroup v2): kubelet is not running")
    k = killer(host, clock)
    with caplog.at_level("WARNING"):
        assert k.blocked() == host.layout and k.blocked() == host.layout
    assert host.detected == 1 and caplog.text.count("nothing is lent on this node") == 1
    assert k.describe().startswith("none (no kubepods cgroup")
    host.layout = LAYOUT  # kubelet started after the agent
    clock[0] = 29.0
    assert k.blocked() != ""
    clock[0] = 30.0
    assert k.blocked() == "" and host.detected == 2
    assert k.describe() == LAYOUT.describe()
