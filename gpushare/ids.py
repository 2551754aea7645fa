"""Virtual device IDs of shared GPUs (design §3): ``<shadow-namespace>/<shadow-name>-<index>``."""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpushare.errors import InstructionRefused

# DNS-1123 label for namespaces, DNS-1123 subdomain for pod names (what the API server accepts).
_NS = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
_POD = r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?"
_VIRTUAL_ID = re.compile(rf"^(?P<ns>{_NS})/(?P<pod>{_POD})-(?P<index>0|[1-9][0-9]{{0,3}})$")


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


def parse_virtual_id(text: str) -> VirtualId:
    """Parse ``ns/shadow-3``. The index is the part after the *last* dash."""
    m = _VIRTUAL_ID.match(text) if isinstance(text, str) and len(text) <= 320 else None
    if m is None:
        raise InstructionRefused(
            f"gpushare: {text!r:.80} is not a virtual device ID; expected <namespace>/<shadow-pod>-<index> (design §3)"
        )
    return VirtualId(m.group("ns"), m.group("pod"), int(m.group("index")))


def virtual_ids_of(namespace: str, shadow: str, spec: int) -> list[str]:
    """All N virtual IDs a shadow of share spec N advertises."""
    return [format_virtual_id(namespace, shadow, i) for i in range(spec)]
