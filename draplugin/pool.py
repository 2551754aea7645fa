"""What a node publishes: its pool of ResourceSlices, built from its GPUs and the share specs.

Per GPU ``gpu-<i>``, one counter set of the same name:

- ``milli`` = 1000, the GPU in thousandths (the unit of Alibaba's ``gpu_milli`` and of exact claims);
- ``slices`` = L, the least common multiple of every configured share spec, so that a 1/N slot
  consumes exactly L/N and no mix of slots can round its way past a whole GPU.

And the devices that consume it, so the scheduler never places more than the GPU holds across
every kind of claim on it:

| device | kind | consumes | served to |
|---|---|---|---|
| ``gpu-<i>`` | ``whole`` | all | a claim for the whole GPU |
| ``gpu-<i>-share<N>-<k>`` | ``share`` | 1/N | ``gpushare/share-gpu-N`` (k = 1..N) |
| ``gpu-<i>-dev<N>-<k>`` | ``share-dev`` | 1/N | ``gpushare/share-dev-gpu-N`` |
| ``gpu-<i>-exact`` | ``exact`` | all, once | claims asking ``capacity.requests.milli`` (1..1000), several at once |
| ``gpu-<i>-spot`` | ``spot`` | nothing | ``gpushare/spot-gpu``: the owner's GPU while it is idle |

The exact device allows multiple allocations; the 1.37 allocator charges a multi-allocatable
device's counters once, when its first claim lands, and sums its claims' ``milli`` against its
capacity. So exact claims of any sizes pack on one GPU, slots of any N pack on another, and a
GPU never holds both at once. The spot device consumes nothing: a borrower runs on a GPU
someone owns, and the node agent takes it back (docs/spot.md); its taints keep borrowers off
while the owner is busy.

Slices: the counter sets go in slices of their own (1.35+ forbids counters and devices in one
slice), at most 8 sets each; then each GPU's devices, at most 64 per slice (the cap for devices
that consume counters or carry taints). Everything here is plain data: ``publisher`` writes it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from draplugin.inventory import Gpu
from gpushare import keys

MILLI_PER_GPU = 1000
KIND_WHOLE = "whole"
KIND_SHARE = "share"
KIND_SHARE_DEV = "share-dev"
KIND_EXACT = "exact"
KIND_SPOT = "spot"
KINDS = (KIND_WHOLE, KIND_SHARE, KIND_SHARE_DEV, KIND_EXACT, KIND_SPOT)
# API limits (k8s.io/api resource/v1): counter sets per slice, and devices per slice when any
# device consumes counters or has taints.
MAX_COUNTER_SETS_PER_SLICE = 8
MAX_DEVICES_PER_SLICE = 64
MAX_ATTRIBUTE_STRING = 64


@dataclass(frozen=True)
class PoolShape:
    """What each GPU is cut into; the agent's configured share specs."""

    share_specs: tuple[int, ...] = (2, 3, 4, 5)
    dev_share_specs: tuple[int, ...] = (2, 4, 8, 16)
    spot: bool = True

    @property
    def slices_per_gpu(self) -> int:
        return math.lcm(1, *self.share_specs, *self.dev_share_specs)


@dataclass(frozen=True)
class Taint:
    key: str
    effect: str  # NoSchedule | NoExecute
    value: str = ""
    time_added: str = ""  # RFC 3339; set by the publisher when it first publishes the taint

    def as_api(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": self.key, "effect": self.effect}
        if self.value:
            out["value"] = self.value
        if self.time_added:
            out["timeAdded"] = self.time_added
        return out


@dataclass(frozen=True)
class DeviceInfo:
    """What one published device is, for the prepare path."""

    name: str
    gpu: Gpu
    kind: str
    share_n: int = 0  # N of a slot; 0 otherwise

    @property
    def exclusive(self) -> bool:
        """Only the exact device is held by several claims at once."""
        return self.kind != KIND_EXACT

    @property
    def milli(self) -> int:
        """The share of the GPU it stands for (the exact device: whatever each claim asked)."""
        if self.share_n:
            return MILLI_PER_GPU // self.share_n
        return MILLI_PER_GPU if self.kind in (KIND_WHOLE, KIND_SPOT) else 0


_DEVICE_NAME = re.compile(
    r"^(?P<gpu>gpu-(?:0|[1-9][0-9]*))(?:-(?P<tag>share|dev)(?P<n>[1-9][0-9]*)-[1-9][0-9]*|-(?P<one>exact|spot))?$"
)
_TAG_KIND = {"share": KIND_SHARE, "dev": KIND_SHARE_DEV, "exact": KIND_EXACT, "spot": KIND_SPOT}


def parse_device_name(name: str) -> tuple[str, str, int] | None:
    """``(gpu, kind, N)`` of a device name this driver publishes (N is 0 but for slots), else None."""
    m = _DEVICE_NAME.match(name)
    if m is None:
        return None
    if m["tag"]:
        return m["gpu"], _TAG_KIND[m["tag"]], int(m["n"])
    return m["gpu"], _TAG_KIND[m["one"]] if m["one"] else KIND_WHOLE, 0


def spot_device(gpu: str) -> str:
    return f"{gpu}-spot"


@dataclass(frozen=True)
class PoolSpec:
    """A pool's slices, without the per-write bookkeeping (generation, names) the publisher adds."""

    name: str
    slices: tuple[Mapping[str, Any], ...] = field(default_factory=tuple)  # each a ResourceSlice spec minus pool


def devices_of(gpus: Iterable[Gpu], shape: PoolShape) -> dict[str, DeviceInfo]:
    """Every device the node publishes, by name."""
    out: dict[str, DeviceInfo] = {}
    for gpu in gpus:
        infos = [DeviceInfo(gpu.name, gpu, KIND_WHOLE)]
        for kind, tag, specs in (
            (KIND_SHARE, "share", shape.share_specs),
            (KIND_SHARE_DEV, "dev", shape.dev_share_specs),
        ):
            for n in specs:
                infos.extend(DeviceInfo(f"{gpu.name}-{tag}{n}-{k}", gpu, kind, n) for k in range(1, n + 1))
        infos.append(DeviceInfo(f"{gpu.name}-exact", gpu, KIND_EXACT))
        if shape.spot:
            infos.append(DeviceInfo(f"{gpu.name}-spot", gpu, KIND_SPOT))
        out.update((i.name, i) for i in infos)
    return out


def spot_taints(gpus: Iterable[Gpu], lendable: Collection[str], reclaiming: Collection[str]) -> dict[str, list[Taint]]:
    """The spot devices' taints: no new borrower unless the GPU is lendable now (its owner idle),
    and an eviction of every borrower while it is taken back. Without the agent nothing is lendable."""
    out: dict[str, list[Taint]] = {}
    for g in gpus:
        taints = [] if g.name in lendable else [Taint(keys.TAINT_OWNER_ACTIVE, "NoSchedule")]
        if g.name in reclaiming:
            taints.append(Taint(keys.TAINT_RECLAIMED, "NoExecute"))
        if taints:
            out[spot_device(g.name)] = taints
    return out


def _counters(milli: int, slices: int) -> dict[str, Any]:
    return {"milli": {"value": str(milli)}, "slices": {"value": str(slices)}}


def _device(info: DeviceInfo, shape: PoolShape, taints: Sequence[Taint]) -> dict[str, Any]:
    gpu = info.gpu
    attributes: dict[str, Any] = {
        "kind": {"string": info.kind},
        "gpu": {"string": gpu.name},
        "index": {"int": gpu.index},
    }
    if len(gpu.cdi_name) <= MAX_ATTRIBUTE_STRING:
        attributes["vendorDevice"] = {"string": gpu.cdi_name}
    device: dict[str, Any] = {"name": info.name, "attributes": attributes}
    whole = shape.slices_per_gpu
    if info.share_n:
        attributes["shareN"] = {"int": info.share_n}
        consumes = _counters(MILLI_PER_GPU // info.share_n, whole // info.share_n)
    elif info.kind in (KIND_WHOLE, KIND_EXACT):
        consumes = _counters(MILLI_PER_GPU, whole)
    else:
        consumes = {}
    if consumes:
        device["consumesCounters"] = [{"counterSet": gpu.name, "counters": consumes}]
    if info.kind == KIND_EXACT:
        device["allowMultipleAllocations"] = True
        device["capacity"] = {
            "milli": {
                "value": str(MILLI_PER_GPU),
                "requestPolicy": {
                    "default": str(MILLI_PER_GPU),
                    "validRange": {"min": "1", "max": str(MILLI_PER_GPU), "step": "1"},
                },
            }
        }
    if taints:
        device["taints"] = [t.as_api() for t in taints]
    return device


def build_pool(
    driver: str,
    node: str,
    gpus: Sequence[Gpu],
    shape: PoolShape,
    taints: Mapping[str, Sequence[Taint]] | None = None,
) -> PoolSpec:
    """The node's pool (named after the node): counter slices, then each GPU's device slices.

    ``taints`` maps a device name to the taints it carries now (the spot devices' lend state).
    """
    taints = taints or {}
    base: dict[str, Any] = {"driver": driver, "nodeName": node}
    slices: list[dict[str, Any]] = []
    for start in range(0, len(gpus), MAX_COUNTER_SETS_PER_SLICE):
        sets = [
            {"name": g.name, "counters": _counters(MILLI_PER_GPU, shape.slices_per_gpu)}
            for g in gpus[start : start + MAX_COUNTER_SETS_PER_SLICE]
        ]
        slices.append({**base, "sharedCounters": sets})
    infos = devices_of(gpus, shape)
    for gpu in gpus:
        mine = [_device(i, shape, taints.get(i.name, ())) for i in infos.values() if i.gpu == gpu]
        for start in range(0, len(mine), MAX_DEVICES_PER_SLICE):
            slices.append({**base, "devices": mine[start : start + MAX_DEVICES_PER_SLICE]})
    return PoolSpec(node, tuple(slices))
