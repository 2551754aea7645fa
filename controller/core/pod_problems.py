"""What a tenant is told about a pod the pass skipped because a field of it cannot be read.

``build_snapshot`` turns such a pod into a ``PodProblem`` (``controller.core.pod_facts``) and
the pass goes on without it; the loop logs each problem once, counts it by ``field``
(``gpushare_pod_input_errors_total``) and writes the Warning Events it asks for.
Pure module (docs/architecture.md).
"""

from __future__ import annotations

import collections
from collections.abc import Iterable

from controller.core.actions import RecordEvent
from controller.core.pod_facts import PodProblem, PodRef

REASON_INVALID_POD = "GpushareInvalidPod"


class ProblemTracker:
    """What the loop keeps of pod problems from pass to pass: which are new, to log and count once.

    Only the latest pass's problems are kept, so a tenant rewriting a broken annotation again
    and again grows nothing; a problem that goes away and comes back is new again. The Events
    are asked for on every pass, like every other Event: the applier writes each once per
    ``EVENT_REPEAT_S`` and only a bounded number per pass (controller/applier.py).
    """

    def __init__(self) -> None:
        self._seen: set[str] = set()
        self.counts: collections.Counter[str] = collections.Counter()  # field -> problems seen new

    def update(self, problems: Iterable[PodProblem]) -> tuple[list[PodProblem], list[RecordEvent]]:
        """This pass's problems -> (the new ones, to log and count; the Warning owed to each pod)."""
        current = {p.message: p for p in problems}
        new = [p for m, p in current.items() if m not in self._seen]
        self.counts.update(p.field for p in new)
        self._seen = set(current)
        return new, [problem_event(p.ref, p.message) for p in current.values() if p.ref is not None]


def problem_event(ref: PodRef, message: str) -> RecordEvent:
    """The Warning a tenant sees on a pod gpushare skips (``kubectl describe pod``)."""
    return RecordEvent(
        ref, REASON_INVALID_POD, f"{message[:900]}; gpushare ignores this pod until it is fixed", "Warning"
    )


__all__ = ["REASON_INVALID_POD", "ProblemTracker", "problem_event"]
