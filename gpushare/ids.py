"""Device IDs our plugins advertise, and their one parser each.

Virtual IDs (design §3): ``<shadow-namespace>/<shadow-name>-<index>``, one per slot of a
shadow pod. Spot IDs (design §2, §6): ``spot-<real ID>``, one per real GPU of the node.
Every part that builds or reads either format calls this module, so the format lives once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpushare.errors import InstructionRefused

# DNS-1123 label for namespaces, DNS-1123 subdomain for pod names (what the API server accepts).
_NS = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
_POD = r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?"
_VIRTUAL_ID = re.compile(rf"^(?P<ns>{_NS})/(?P<pod>{_POD})-(?P<index>0|[1-9][0-9]{{0,3}})$")
# Longer than any namespace, pod name and index together: refused before the regex runs.
_MAX_VIRTUAL_ID_CHARS = 320

_SPOT_PREFIX = "spot-"


@dataclass(frozen=True, order=True)
class VirtualId:
    """One slot of one shadow pod."""

    namespace: str
    shadow: str
    index: int

    def __str__(self) -> str:
        return f"{self.namespace}/{self.shadow}-{self.index}"

    @property
    def shadow_key(self) -> str:
        """``<namespace>/<shadow>``: the shadow pod this slot belongs to."""
        return f"{self.namespace}/{self.shadow}"


def format_virtual_id(namespace: str, shadow: str, index: int) -> str:
    return str(VirtualId(namespace, shadow, index))


def parse_virtual_id_or_none(text: object) -> VirtualId | None:
    """Read ``ns/shadow-3``, or None for anything else. The index is the part after the *last* dash."""
    if not isinstance(text, str) or len(text) > _MAX_VIRTUAL_ID_CHARS:
        return None
    m = _VIRTUAL_ID.fullmatch(text)
    if m is None:
        return None
    return VirtualId(m.group("ns"), m.group("pod"), int(m.group("index")))


def parse_virtual_id(text: object) -> VirtualId:
    """Read a virtual ID that an instruction names; anything else is refused (``InstructionRefused``)."""
    parsed = parse_virtual_id_or_none(text)
    if parsed is None:
        raise InstructionRefused(
            f"gpushare: {text!r:.80} is not a virtual device ID; expected <namespace>/<shadow-pod>-<index> (design §3)"
        )
    return parsed


def is_virtual_id(text: object) -> bool:
    return parse_virtual_id_or_none(text) is not None


def virtual_ids_of(namespace: str, shadow: str, spec: int) -> list[str]:
    """All N virtual IDs a shadow of share spec N advertises."""
    return [format_virtual_id(namespace, shadow, i) for i in range(spec)]


# NVIDIA's device plugin names the replicas of a GPU it shares itself (time-slicing, MPS) "<uuid>::<n>".
REPLICA_SEPARATOR = "::"


def is_replica_id(real_id: str) -> bool:
    """Whether a vendor's device ID is a replica of a GPU the vendor shares itself."""
    return REPLICA_SEPARATOR in real_id


def format_spot_id(real_id: str) -> str:
    """The spot device that lends real GPU ``real_id``: ``spot-<real ID>``."""
    return _SPOT_PREFIX + real_id


def parse_spot_id(device_id: str) -> str | None:
    """The real ID inside a spot device ID, or None for any other device ID."""
    if not device_id.startswith(_SPOT_PREFIX):
        return None
    return device_id[len(_SPOT_PREFIX) :]
