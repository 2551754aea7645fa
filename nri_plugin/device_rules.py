"""Which of a holder's device nodes belong to one GPU: the per-vendor rule table (design §8).

A borrower is given a lent GPU either from the vendor plugin's own ``Allocate`` answer for
exactly those IDs (``DeviceResolver``) or, when that is not available, from the device nodes of
the container kubelet allocated the GPU to (the holder). A holder may see far more than its GPU:
a privileged holder sees every host device (``/dev/kmsg``, ``/dev/mem``, every other GPU). So a
holder's nodes are never copied wholesale; only the nodes this table says belong to the lent
GPUs are, and a vendor without a rule gets nothing from a holder.

A rule names, for the resources of one vendor:

- ``per_gpu``: the pattern of a node that stands for one GPU (``/dev/nvidia0``);
- ``node_of_id``: how a device ID names its node, when the vendor's IDs say it (the fake
  vendor's ``fakegpu3`` is ``/dev/fakegpu3``); NVIDIA's UUIDs and AMD's PCI addresses do not;
- ``nodes_per_gpu``: how many ``per_gpu`` nodes one GPU has (AMD: ``card<N>`` and ``renderD<N>``);
- ``control``: the vendor's shared control nodes every user of any GPU needs (``/dev/nvidiactl``).

Without ``node_of_id``, the GPU nodes of a holder can be told apart only when the holder sees
exactly its own GPUs: the lent IDs are all the holder was allocated and the holder has exactly
``nodes_per_gpu`` such nodes per GPU. Anything else (a privileged holder, lending one GPU of
several) is refused here and needs the vendor's ``Allocate`` answer.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gpushare.errors import REFUSED_DEVICES_UNKNOWN, InstructionRefused
from nri_plugin.model import DeviceNode


@dataclass(frozen=True)
class VendorRule:
    vendor: str
    resources: tuple[str, ...]  # fnmatch patterns of the vendor's resource names
    per_gpu: re.Pattern[str]
    control: frozenset[str] = frozenset()
    nodes_per_gpu: int = 1
    node_of_id: Callable[[str], str | None] | None = None

    def matches(self, resource: str) -> bool:
        return any(fnmatch.fnmatchcase(resource, pattern) for pattern in self.resources)


_FAKE_ID = re.compile(r"fakegpu[0-9]+")


def _fake_node(device_id: str) -> str | None:
    return f"/dev/{device_id}" if _FAKE_ID.fullmatch(device_id) else None


# The one place the per-vendor knowledge lives; docs/nri.md reproduces it for operators.
RULES: tuple[VendorRule, ...] = (
    VendorRule(
        vendor="NVIDIA",
        resources=("nvidia.com/*",),
        per_gpu=re.compile(r"/dev/nvidia[0-9]+"),
        control=frozenset({"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"}),
    ),
    VendorRule(
        vendor="AMD",
        resources=("amd.com/*",),
        per_gpu=re.compile(r"/dev/dri/(card|renderD)[0-9]+"),
        control=frozenset({"/dev/kfd"}),
        nodes_per_gpu=2,
    ),
    # gpushare's fake vendor plugin (`gpushare fake-gpus`, default resource example.com/gpu).
    VendorRule(
        vendor="fake",
        resources=("example.com/*",),
        per_gpu=re.compile(r"/dev/fakegpu[0-9]+"),
        node_of_id=_fake_node,
    ),
)


def rule_for(resource: str) -> VendorRule | None:
    return next((r for r in RULES if r.matches(resource)), None)


def gpu_nodes(
    resource: str,
    lent: Iterable[str],
    allocated: frozenset[str],
    devices: Iterable[DeviceNode],
    holder: str,
) -> tuple[DeviceNode, ...]:
    """The holder's nodes that belong to the ``lent`` IDs of ``resource``, by the vendor's rule.

    ``allocated`` is every ID of ``resource`` kubelet gave the holder; ``devices`` are its
    injectable nodes. Raises ``InstructionRefused`` naming why when the rule cannot say which
    nodes are the lent GPUs'. Nodes the rule does not name are never returned.
    """
    wanted = tuple(dict.fromkeys(lent))
    rule = rule_for(resource)
    if rule is None:
        raise InstructionRefused(
            f"gpushare: no per-vendor device rule covers {resource}, so which of {holder}'s device nodes are "
            f"{list(wanted)} is unknown; only the vendor device plugin's own Allocate answer can give them "
            "(name its socket with --spot-from; docs/nri.md)",
            reason=REFUSED_DEVICES_UNKNOWN,
        )
    by_path = {d.path: d for d in devices}
    control = tuple(d for p, d in sorted(by_path.items()) if p in rule.control)
    if rule.node_of_id is not None:
        picked = []
        for device_id in wanted:
            path = rule.node_of_id(device_id)
            node = by_path.get(path) if path is not None else None
            if node is None:
                raise InstructionRefused(
                    f"gpushare: {holder} was allocated {resource} {device_id} but has no device node "
                    f"{path or '(none the ' + rule.vendor + ' rule names)'}; refused (docs/nri.md)",
                    reason=REFUSED_DEVICES_UNKNOWN,
                )
            picked.append(node)
        return (*picked, *control)
    gpus = tuple(d for p, d in sorted(by_path.items()) if rule.per_gpu.fullmatch(p))
    if frozenset(wanted) != allocated or len(gpus) != rule.nodes_per_gpu * len(wanted):
        raise InstructionRefused(
            f"gpushare: cannot tell which of {holder}'s {len(gpus)} {rule.vendor} GPU device nodes are "
            f"{resource} {list(wanted)} (it was allocated {sorted(allocated)}): {rule.vendor} IDs do not name their "
            "nodes, so a holder's nodes are used only when it sees exactly the lent GPUs; the vendor device "
            "plugin's own Allocate answer is needed (name its socket with --spot-from; docs/nri.md)",
            reason=REFUSED_DEVICES_UNKNOWN,
        )
    return (*gpus, *control)
