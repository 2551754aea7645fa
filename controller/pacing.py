"""The loop's pace: how soon a pass may follow the one before, so that passes keep to a share of one core.

A pass is level-triggered and reads its inputs from caches, so a pass that starts a little
later misses nothing: every event that arrived meanwhile is in it. During a burst of pod
events, though, the wake is set again while each pass runs, and without a rest the loop runs
passes back to back for as long as the burst lasts. On a leader of 1,000 nodes with thousands
of pending sharers, that spent half a core recomputing plans a few hundred events apart, on
the machine that also runs the control plane's share of the same burst (docs/scale.md).

So after each pass the loop rests for a time in proportion to the CPU time that pass took:
``PASS_SHARE`` bounds the share of one core the passes take, whatever the burst. A node
agent's pass of a few milliseconds rests a few tens of milliseconds; a leader's pass over a
large cluster rests longer and takes in more events at once. The rest is CPU time, not wall
time: a pass that waited on the API server (its creates) did not keep a core busy.

A rest is never longer than ``MAX_REST_S``. A rare pass costs far more than the others: the
one that confirms idle shadows' deletion from fresh LISTs (controller/share/cluster_pass.py) spends
about two seconds of CPU at 1,000 nodes, and a rest nine times that held the next batch of
deletions back by 18 s. Past a second the share of a core is allowed to rise for such a pass.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gpushare.errors import GpushareError

# At most this share of one core goes to passes, however many events arrive (passes of up to
# MAX_REST_S * PASS_SHARE / (1 - PASS_SHARE) seconds of CPU, 0.11 s; longer ones rest MAX_REST_S).
PASS_SHARE = 0.1
MAX_REST_S = 1.0


class Pacer:
    """``passed(cpu_s)`` after each pass; ``rest_s()`` is how long the next one must wait."""

    def __init__(self, share: float = PASS_SHARE, clock: Callable[[], float] = time.monotonic) -> None:
        if not 0.0 < share <= 1.0:
            raise GpushareError(f"gpushare: the passes' share of a core must be in (0, 1], got {share}")
        self.share = share
        self._clock = clock
        self._not_before = clock()

    def passed(self, cpu_s: float) -> None:
        """A pass just ended after ``cpu_s`` of CPU time: the next may start ``cpu_s * (1/share - 1)`` later."""
        rest = max(0.0, cpu_s) * (1.0 / self.share - 1.0)
        self._not_before = self._clock() + min(rest, MAX_REST_S)

    def rest_s(self) -> float:
        return max(0.0, self._not_before - self._clock())


__all__ = ["MAX_REST_S", "PASS_SHARE", "Pacer"]
