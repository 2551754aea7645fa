"""Publishing a share count that is leaving, ahead of kubelet's next node status.

The scheduler places pods by the node's allocatable; kubelet rewrites it from its device
manager only every ``nodeStatusUpdateFrequency``. When a shadow's virtual devices are being
withdrawn the agent writes the lower count itself, so the scheduler stops placing sharers on
devices kubelet will refuse (docs/scale.md, "Shadow removal order"). It never raises a count:
a higher one is kubelet's to publish once its device manager holds the devices.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import quote

Call = Callable[..., tuple[int, Any]]  # KubeClient._call: (method, path, *, body=, content_type=) -> (status, doc)


def lower_allocatable(call: Call, node: str, resource: str, count: int) -> bool:
    """Lower ``resource`` in the node's capacity and allocatable to ``count``; True if it wrote."""
    path = f"/api/v1/nodes/{quote(node, safe='')}"
    _, doc = call("GET", path)
    status = (doc or {}).get("status") or {}
    lower: dict[str, dict[str, str]] = {}
    for field in ("capacity", "allocatable"):
        have = str((status.get(field) or {}).get(resource, ""))
        if have.isdecimal() and int(have) > count:
            lower[field] = {resource: str(count)}
    if not lower:
        return False
    call("PATCH", f"{path}/status", body={"status": lower}, content_type="application/merge-patch+json")
    return True


__all__ = ["Call", "lower_allocatable"]
