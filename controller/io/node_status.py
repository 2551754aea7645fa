"""Publishing a share count ahead of kubelet's next node status, in both directions.

The scheduler places pods by the node's allocatable; kubelet rewrites it from its device
manager only every ``nodeStatusUpdateFrequency`` (10 s by default). So the agent writes it too:

- **lower**: when a shadow's virtual devices are being withdrawn, so the scheduler stops placing
  sharers on devices kubelet will refuse (docs/scale.md, "Shadow removal order");
- **catch up**: when new slots are offered, but only to the count kubelet's device manager
  already holds (PodResources ``GetAllocatableResources``): exactly what kubelet writes at its next
  node status, written now, so a sharer waiting for a new shadow is placed without waiting for it.
  A count kubelet does not hold is never written: kubelet admits a pod only on devices its device
  manager holds, so a higher count would only turn placements into admission failures.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

Call = Callable[..., tuple[int, Any]]  # KubeClient._call: (method, path, *, body=, content_type=) -> (status, doc)
_FIELDS = ("capacity", "allocatable")


def lower_fields(node: Any, counts: Mapping[str, int]) -> tuple[dict[str, dict[str, str]], list[str]]:
    """The ``status`` of a merge-patch that lowers the node to ``counts``, and what could not be read.

    Only a count the node shows higher is in the patch. A document without a status, or a
    quantity that is not a whole number ("1k", "x"), writes nothing for it and is named in the
    second value, for the caller to log.
    """
    status = node.get("status") if isinstance(node, Mapping) else None
    if not isinstance(status, Mapping):
        return {}, ["the Node has no status"] if counts else []
    lower: dict[str, dict[str, str]] = {}
    problems: list[str] = []
    for field in _FIELDS:
        have_all = status.get(field)
        have_all = have_all if isinstance(have_all, Mapping) else {}
        for resource, count in sorted(counts.items()):
            if resource not in have_all:
                continue  # not published yet: nothing to lower
            have = str(have_all[resource])
            if not have.isdecimal():
                problems.append(f"status.{field}[{resource}] is {have[:40]!r}, not a whole count")
            elif int(have) > count:
                lower.setdefault(field, {})[resource] = str(count)
    return lower, problems


def catch_up_fields(node: Any, counts: Mapping[str, int]) -> tuple[dict[str, dict[str, str]], list[str]]:
    """The ``status`` of a merge-patch that raises the node to ``counts``, and what could not be read.

    ``allocatable`` is raised to the count where the node shows less or nothing; ``capacity``
    (which also counts devices listed Unhealthy) only where it would otherwise fall below the
    allocatable. A quantity that is not a whole number writes nothing for its resource.
    """
    status = node.get("status") if isinstance(node, Mapping) else None
    if not isinstance(status, Mapping):
        return {}, ["the Node has no status"] if counts else []
    shown: dict[str, Mapping[str, Any]] = {}
    for f in _FIELDS:
        values = status.get(f)
        shown[f] = values if isinstance(values, Mapping) else {}
    patch: dict[str, dict[str, str]] = {}
    problems: list[str] = []
    for resource, count in sorted(counts.items()):
        have = {f: str(shown[f].get(resource, "0")) for f in _FIELDS}
        odd = [f for f in _FIELDS if not have[f].isdecimal()]
        if odd:
            problems += [f"status.{f}[{resource}] is {have[f][:40]!r}, not a whole count" for f in odd]
            continue
        if int(have["allocatable"]) < count:
            patch.setdefault("allocatable", {})[resource] = str(count)
            if int(have["capacity"]) < count:
                patch.setdefault("capacity", {})[resource] = str(count)
    return patch, problems


def merged(node: Mapping[str, Any], status: Mapping[str, Mapping[str, str]]) -> dict[str, Any]:
    """``node`` as it reads once a merge-patch of ``status`` (fields of quantities) went through."""
    have_status = node.get("status")
    old: Mapping[str, Any] = have_status if isinstance(have_status, Mapping) else {}
    new_status = dict(old)
    for field, values in status.items():
        have = old.get(field)
        new_status[field] = {**(have if isinstance(have, Mapping) else {}), **values}
    return {**node, "status": new_status}


def patch_status(call: Call, node: str, status: Mapping[str, Any]) -> None:
    """One merge-patch of ``nodes/<node>/status``."""
    path = f"/api/v1/nodes/{quote(node, safe='')}/status"
    call("PATCH", path, body={"status": dict(status)}, content_type="application/merge-patch+json")


__all__ = ["Call", "catch_up_fields", "lower_fields", "merged", "patch_status"]
