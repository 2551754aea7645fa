"""Publishing a share count that is leaving, ahead of kubelet's next node status.

The scheduler places pods by the node's allocatable; kubelet rewrites it from its device
manager only every ``nodeStatusUpdateFrequency``. When a shadow's virtual devices are being
withdrawn the agent writes the lower count itself, so the scheduler stops placing sharers on
devices kubelet will refuse (docs/scale.md, "Shadow removal order"). It never raises a count:
a higher one is kubelet's to publish once its device manager holds the devices.
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


def patch_status(call: Call, node: str, status: Mapping[str, Any]) -> None:
    """One merge-patch of ``nodes/<node>/status``."""
    path = f"/api/v1/nodes/{quote(node, safe='')}/status"
    call("PATCH", path, body={"status": dict(status)}, content_type="application/merge-patch+json")


__all__ = ["Call", "lower_fields", "patch_status"]
