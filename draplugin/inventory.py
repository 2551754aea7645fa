"""Which GPUs a node has, read from the vendor's CDI spec: one GPU per device-node set.

A vendor's spec may name one GPU several ways (NVIDIA's toolkit writes ``0`` and ``GPU-<uuid>``
with ``--device-name-strategy`` lists) and adds an ``all`` device. Devices that give the same
device nodes are one GPU; a device whose nodes strictly contain another's is an aggregate and
is no GPU of its own. Every name of a GPU is kept; the first is its identity, the name the
vendor's exporter also uses where there is one (a UUID before an index), and is the one a
prepared claim names: spot reads it back from kubelet to match the GPU with its utilization.
GPUs are numbered in the vendor's index order.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from gpushare.cdi import CdiEdits

_DIGITS = re.compile(r"^[0-9]+$")


@dataclass(frozen=True)
class Gpu:
    """One physical GPU as the driver publishes it."""

    index: int  # position on the node, 0-based, in the vendor's order
    cdi_names: tuple[str, ...]  # every qualified vendor CDI name of this GPU; the first is its identity
    host_nodes: tuple[str, ...]  # host paths of its device nodes, sorted

    @property
    def name(self) -> str:
        """The DNS label devices and counter sets are named after."""
        return f"gpu-{self.index}"

    @property
    def cdi_name(self) -> str:
        return self.cdi_names[0]

    @property
    def vendor_id(self) -> str:
        """The vendor's name of the GPU (``GPU-<uuid>``, ``fakegpu0``): its identity to spot."""
        return vendor_id_of(self.cdi_name)


def vendor_id_of(qualified: str) -> str:
    """``nvidia.com/gpu=GPU-1`` → ``GPU-1``."""
    return qualified.partition("=")[2]


def _identity_first(qualified: str) -> tuple[int, str]:
    return (1 if _DIGITS.match(vendor_id_of(qualified)) else 0, qualified)


def _order_key(qualified: str) -> tuple[int, int, str]:
    device = qualified.partition("=")[2]
    if _DIGITS.match(device):
        return (0, int(device), device)
    return (1, 0, device)


def gpus_from_cdi(devices: Mapping[str, CdiEdits], vendor_kind: str) -> list[Gpu]:
    """The GPUs of ``vendor_kind`` (``vendor/class``) among a node's CDI devices, in index order."""
    prefix = f"{vendor_kind}="
    by_nodes: dict[frozenset[str], list[str]] = {}
    for qualified, edits in devices.items():
        if not qualified.startswith(prefix):
            continue
        nodes = frozenset(n.host_path or n.path for n in edits.device_nodes)
        if nodes:
            by_nodes.setdefault(nodes, []).append(qualified)
    # Nodes every GPU device shares (NVIDIA's control devices sit in the spec-wide edits) are
    # part of each set, so a single GPU is told from an aggregate by strict containment.
    singles = [nodes for nodes in by_nodes if not any(other < nodes for other in by_nodes)]
    groups = sorted(
        ((sorted(by_nodes[n], key=_identity_first), n) for n in singles), key=lambda g: min(map(_order_key, g[0]))
    )
    return [
        Gpu(index=i, cdi_names=tuple(names), host_nodes=tuple(sorted(nodes))) for i, (names, nodes) in enumerate(groups)
    ]
