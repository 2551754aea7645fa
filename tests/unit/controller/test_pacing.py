"""The loop rests after each pass in proportion to its CPU time: passes keep to a share of one core."""

from __future__ import annotations

import time
from typing import Any

import pytest

from controller.pacing import MAX_REST_S, PASS_SHARE, Pacer
from gpushare.errors import GpushareError
from tests.unit.controller.share.test_node_watch import Clock
from tests.unit.controller.test_loop import make_loop, running_passes, wait_for


def test_the_rest_is_the_cpu_time_over_the_share_less_the_pass_itself() -> None:
    clock = Clock()
    pacer = Pacer(share=0.1, clock=clock)
    assert pacer.rest_s() == 0.0  # the first pass waits for nothing
    pacer.passed(0.05)
    assert pacer.rest_s() == pytest.approx(0.45)  # 0.05 s of CPU in every 0.5 s: a tenth of a core
    clock.now += 0.3
    assert pacer.rest_s() == pytest.approx(0.15)
    clock.now += 1.0
    assert pacer.rest_s() == 0.0
    pacer.passed(-1.0)  # a clock that went backwards owes no rest
    assert pacer.rest_s() == 0.0
    whole = Pacer(share=1.0, clock=clock)
    whole.passed(5.0)
    assert whole.rest_s() == 0.0  # a whole core: passes back to back


def test_a_heavy_pass_rests_no_longer_than_the_longest_rest() -> None:
    clock = Clock()
    pacer = Pacer(share=0.1, clock=clock)
    pacer.passed(2.0)  # confirming idle shadows from fresh LISTs at 1,000 nodes: 18 s uncapped
    assert pacer.rest_s() == MAX_REST_S


@pytest.mark.parametrize("share", [0.0, -0.5, 1.5])
def test_a_share_outside_zero_to_one_is_refused(share: float) -> None:
    with pytest.raises(GpushareError, match="share of a core"):
        Pacer(share=share)


def test_a_pass_that_burned_cpu_is_followed_by_its_rest_and_the_burst_still_costs_one_pass() -> None:
    loop, _, _ = make_loop([])
    loop.period_s = 60.0
    starts: list[float] = []
    ends: list[float] = []
    spent: list[float] = []

    def tick() -> Any:
        starts.append(time.monotonic())
        cpu0 = time.thread_time()
        while time.thread_time() - cpu0 < 0.02:  # a pass that keeps the core busy for 20 ms
            pass
        if len(starts) == 1:
            for _ in range(50):  # a burst of watch events while the pass runs
                loop.wake()
        spent.append(time.thread_time() - cpu0)
        ends.append(time.monotonic())
        return loop.last_report()

    with running_passes(loop, tick):
        wait_for(lambda: len(starts) >= 2)
        time.sleep(0.5)
        assert len(starts) == 2
        # The second pass started no sooner than the first one's CPU time over the share, less itself.
        assert starts[1] - ends[0] >= spent[0] * (1 / PASS_SHARE - 1) * 0.99


class _Burned(Pacer):
    def passed(self, cpu_s: float) -> None:
        self._not_before = time.monotonic() + 300.0  # a rest of minutes after every pass


def test_stop_during_the_rest_ends_the_loop_without_another_pass() -> None:
    loop, _, _ = make_loop([])
    loop.period_s = 60.0
    loop._pacer = _Burned()
    passes: list[float] = []

    def tick() -> Any:
        passes.append(time.monotonic())
        loop.wake()  # an event during the pass: the next one is owed, after the rest
        return loop.last_report()

    with running_passes(loop, tick):  # which stops the loop, and asserts it ended, on the way out
        wait_for(lambda: bool(passes))
    assert len(passes) == 1
