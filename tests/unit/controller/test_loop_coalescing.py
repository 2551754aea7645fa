"""A burst of pod events costs a bounded number of passes: events that arrive during a pass ask
for one more pass between them, not one each. Driven through the loop's real caches and thread."""

from __future__ import annotations

import threading

from controller.io.kube_client import WatchEvent
from controller.loop import ReconcileLoop
from controller.report import TickReport
from tests.unit.controller.loop_pods import pod
from tests.unit.controller.test_loop import make_loop

BURST = 1000


class _GatedLoop:
    """Wraps ``loop.tick`` so the test decides when each pass may end, and counts passes."""

    def __init__(self, loop: ReconcileLoop) -> None:
        self.loop = loop
        self.passes = 0
        self.in_pass = threading.Event()
        self.release = threading.Semaphore(0)
        self._tick = loop.tick
        loop.tick = self._gated_tick  # type: ignore[method-assign]

    def _gated_tick(self) -> TickReport:
        self.passes += 1
        self.in_pass.set()
        self.release.acquire()
        return self._tick()


def _events(n: int) -> list[WatchEvent]:
    return [WatchEvent("ADDED", pod(f"p{i}", rv=str(i + 2), node="n1", phase="Running")) for i in range(n)]


def _run(loop: ReconcileLoop, stop: threading.Event) -> threading.Thread:
    loop.period_s = 3600.0  # no timed pass: every pass here was asked for by an event
    t = threading.Thread(target=loop._run_passes, args=(stop,), name="test-loop")
    t.start()
    return t


def test_a_burst_during_a_pass_costs_exactly_one_more_pass() -> None:
    loop, _, _ = make_loop([])
    gate, stop = _GatedLoop(loop), threading.Event()
    loop.wake()
    thread = _run(loop, stop)
    try:
        assert gate.in_pass.wait(10)
        gate.in_pass.clear()
        for event in _events(BURST):  # the node cache's watch thread, while the pass runs
            loop._node.apply(event)
        gate.release.release()  # the first pass ends
        assert gate.in_pass.wait(10)  # the burst asked for a second one
        gate.in_pass.clear()
        gate.release.release()
        assert not gate.in_pass.wait(0.5)  # and for nothing more
        assert gate.passes == 2
        assert len(loop._node.view().pods) == BURST  # the second pass read every pod of the burst
    finally:
        stop.set()
        loop.wake()
        gate.release.release()
        thread.join(10)
    assert not thread.is_alive()


def test_events_spread_over_passes_cost_at_most_one_pass_per_pass_they_overlap() -> None:
    """Events trickle in across several passes: each pass absorbs every event that came before it."""
    loop, _, _ = make_loop([])
    gate, stop = _GatedLoop(loop), threading.Event()
    loop.wake()
    thread = _run(loop, stop)
    rounds = 10
    try:
        events = _events(BURST)
        per_round = BURST // rounds
        for r in range(rounds):
            assert gate.in_pass.wait(10)
            gate.in_pass.clear()
            for event in events[r * per_round : (r + 1) * per_round]:
                loop._node.apply(event)
            gate.release.release()
        assert gate.in_pass.wait(10)
        gate.in_pass.clear()
        gate.release.release()
        assert not gate.in_pass.wait(0.5)
        # The first pass, then one per round of 100 events: 11 passes for 1,000 events.
        assert gate.passes == rounds + 1
    finally:
        stop.set()
        loop.wake()
        gate.release.release()
        thread.join(10)
    assert not thread.is_alive()


def test_wake_after_stop_ends_the_loop_without_a_pass() -> None:
    loop, _, _ = make_loop([])
    gate, stop = _GatedLoop(loop), threading.Event()
    stop.set()
    loop.wake()
    thread = _run(loop, stop)
    thread.join(10)
    assert not thread.is_alive() and gate.passes == 0
