"""What one reconcile pass read from each pod, kept for the next: only changed pods are read again.

The API server gives a pod a new ``metadata.resourceVersion`` on every write, so a pod
seen before with the same uid and resourceVersion has the same content, and reading it
again gives the same answer. The leader reads every shadow and every unscheduled pod of
the cluster on each pass; after one pod event only that pod is new. docs/scale.md has the
figures.

A memo belongs to one caller that builds one snapshot per pass (the leader's cluster
pass) and keeps only the pods of its latest call, so it never holds more than one cache's
worth of reads. Pods without a uid and resourceVersion (hand-made test pods) are read every
time. Pure module: stdlib only (docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any, Generic, TypeVar

T = TypeVar("T")


def pod_stamp(pod: object) -> tuple[str, str] | None:
    """``(uid, resourceVersion)`` of a pod as the API returned it, or None when either is missing."""
    # type() first: the ABC check costs more than the rest of this function.
    if type(pod) is not dict and not isinstance(pod, Mapping):
        return None
    meta = pod.get("metadata")
    if type(meta) is not dict and not isinstance(meta, Mapping):
        return None
    uid = meta.get("uid")
    version = meta.get("resourceVersion")
    if version is None:
        version = meta.get("resource_version")
    if isinstance(uid, str) and uid and isinstance(version, str) and version:
        return uid, version
    return None


class PodMemo(Generic[T]):
    """Reads of pods by ``(uid, resourceVersion)``, from the latest ``read_all`` only."""

    def __init__(self) -> None:
        self._reads: dict[tuple[str, str], T] = {}
        self._context: Hashable = None
        self.reused = 0  # reads the latest call took from the memo
        self.read = 0  # pods the latest call read afresh

    def read_all(
        self, pods: Iterable[Mapping[str, Any]], read: Callable[[Mapping[str, Any]], T], context: Hashable
    ) -> list[T]:
        """``read(pod)`` for each pod, reusing the previous call's read of an unchanged pod.

        ``context``: whatever else ``read`` depends on (the default pool); when it changes,
        every pod is read again.
        """
        known = self._reads if context == self._context else {}
        kept: dict[tuple[str, str], T] = {}
        out: list[T] = []
        reused = fresh = 0
        for pod in pods:
            stamp = pod_stamp(pod)
            if stamp is None:
                out.append(read(pod))
                fresh += 1
                continue
            if stamp in kept:  # the same pod twice in one call
                value = kept[stamp]
            elif stamp in known:
                value = kept[stamp] = known[stamp]
                reused += 1
            else:
                value = kept[stamp] = read(pod)
                fresh += 1
            out.append(value)
        self._reads, self._context = kept, context
        self.reused, self.read = reused, fresh
        return out


__all__ = ["PodMemo", "pod_stamp"]
