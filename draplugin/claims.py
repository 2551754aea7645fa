"""What preparing one allocated ResourceClaim means on this node: plain data in, a plan out.

kubelet sends a claim's namespace, name and UID; the driver reads the claim itself and hands it
here with what the node publishes and which exclusive devices other claims hold. The plan names,
per allocated device of ours, the vendor's own CDI device for its GPU (so the container gets the
vendor's exact edits) and a CDI device of the claim's own that adds only gpushare's variables.

A claim is refused (``ClaimRefused``, with the reason kubelet shows on the pod) when it is not
the claim kubelet named, is not allocated, was allocated from another node's pool, names a
device this node does not publish, or takes an exclusive device another prepared claim holds.
Nothing is written for a refused claim.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from draplugin.pool import KIND_EXACT, DeviceInfo

CDI_VENDOR_PREFIX = "k8s."
CDI_CLASS = "claim"
# A device name that starts with a digit (a claim UID) needs CDI 0.5.0; nothing newer is used.
CDI_VERSION = "0.5.0"
ENV_GPU = "GPUSHARE_GPU"
ENV_KIND = "GPUSHARE_SHARE_KIND"
ENV_MILLI = "GPUSHARE_GPU_MILLI"

_SUFFIX = {
    "m": Decimal("0.001"),
    "": Decimal(1),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
}


class ClaimRefused(ValueError):
    """The claim cannot be prepared here; the message says why."""


@dataclass(frozen=True)
class ClaimRef:
    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name} ({self.uid})"


@dataclass(frozen=True)
class PreparedDevice:
    request: str  # the claim's request name ("req" of "req/sub")
    device: str
    kind: str
    gpu: str
    milli: int
    share_id: str
    cdi_ids: tuple[str, ...]  # the vendor's device, then the claim's own


@dataclass(frozen=True)
class PreparedClaim:
    ref: ClaimRef
    devices: tuple[PreparedDevice, ...]

    @property
    def exclusive_devices(self) -> frozenset[str]:
        return frozenset(d.device for d in self.devices if d.kind != KIND_EXACT)


def cdi_kind(driver: str) -> str:
    return f"{CDI_VENDOR_PREFIX}{driver}/{CDI_CLASS}"


def parse_quantity(text: str) -> Decimal:
    """A Kubernetes quantity (``250``, ``1k``, ``500m``, ``2Gi``, ``1e3``) as an exact decimal."""
    s = text.strip()
    for suffix in sorted(_SUFFIX, key=len, reverse=True):
        if suffix and s.endswith(suffix):
            number, scale = s[: -len(suffix)], _SUFFIX[suffix]
            break
    else:
        number, scale = s, Decimal(1)
    try:
        value = Decimal(number) * scale
    except InvalidOperation:
        raise ValueError(f"{text!r} is not a quantity") from None
    if not value.is_finite():
        raise ValueError(f"{text!r} is not a quantity")
    return value


@dataclass(frozen=True)
class NodeView:
    """What a claim is checked against: the node's driver, pool and devices, and their use now."""

    driver: str
    pool: str
    devices: Mapping[str, DeviceInfo]
    # Each exclusive device prepared on this node → the UID of the claim holding it.
    held: Mapping[str, str] = field(default_factory=dict)
    # A device no claim may be prepared on now → why (a spot device whose owner is active: the
    # scheduler allocated it before the taint reached it).
    blocked: Mapping[str, str] = field(default_factory=dict)


def plan_claim(claim: Mapping[str, Any], ref: ClaimRef, node: NodeView) -> PreparedClaim:
    """The plan for ``claim`` (the API object), or ClaimRefused."""
    uid = str(claim.get("metadata", {}).get("uid", ""))
    if uid != ref.uid:
        raise ClaimRefused(f"claim {ref.namespace}/{ref.name} has UID {uid or 'none'}, kubelet asked for {ref.uid}")
    allocation = (claim.get("status") or {}).get("allocation")
    if not isinstance(allocation, Mapping):
        raise ClaimRefused(f"claim {ref} is not allocated")
    results = (allocation.get("devices") or {}).get("results") or []
    out: list[PreparedDevice] = []
    for result in results:
        if not isinstance(result, Mapping) or result.get("driver") != node.driver:
            continue
        out.append(_prepared(result, ref, node))
    return PreparedClaim(ref, tuple(out))


def _prepared(result: Mapping[str, Any], ref: ClaimRef, node: NodeView) -> PreparedDevice:
    name = str(result.get("device", ""))
    if result.get("pool") != node.pool:
        raise ClaimRefused(
            f"claim {ref} was given {name} from pool {result.get('pool')!r}, not this node's {node.pool!r}"
        )
    info = node.devices.get(name)
    if info is None:
        raise ClaimRefused(f"claim {ref} was given device {name!r}, which this node does not publish")
    if name in node.blocked:
        raise ClaimRefused(f"claim {ref} was given {name}: {node.blocked[name]}")
    holder = node.held.get(name)
    if info.exclusive and holder is not None and holder != ref.uid:
        raise ClaimRefused(f"claim {ref} was given {name}, which claim {holder} holds on this node")
    milli = info.milli
    if info.kind == KIND_EXACT:
        consumed = (result.get("consumedCapacity") or {}).get("milli")
        try:
            milli = int(parse_quantity(str(consumed))) if consumed is not None else 1000
        except ValueError as exc:
            raise ClaimRefused(f"claim {ref} has an unreadable consumedCapacity.milli: {exc}") from None
    request = str(result.get("request", "")).partition("/")[0]
    return PreparedDevice(
        request=request,
        device=name,
        kind=info.kind,
        gpu=info.gpu.name,
        milli=milli,
        share_id=str(result.get("shareID") or ""),
        cdi_ids=(info.gpu.cdi_name, f"{cdi_kind(node.driver)}={ref.uid}-{name}"),
    )


def claim_spec(driver: str, claim: PreparedClaim) -> dict[str, Any]:
    """The claim's own CDI spec: one device per prepared device, adding gpushare's variables only."""
    return {
        "cdiVersion": CDI_VERSION,
        "kind": cdi_kind(driver),
        "devices": [
            {
                "name": f"{claim.ref.uid}-{d.device}",
                "containerEdits": {"env": [f"{ENV_GPU}={d.gpu}", f"{ENV_KIND}={d.kind}", f"{ENV_MILLI}={d.milli}"]},
            }
            for d in claim.devices
        ],
    }


def claim_spec_prefix(driver: str) -> str:
    return f"{CDI_VENDOR_PREFIX}{driver}-{CDI_CLASS}_"


def claim_spec_file(driver: str, uid: str) -> str:
    """The spec's file name, as CDI's transient-spec convention: ``<vendor>-<class>_<uid>.json``."""
    return f"{claim_spec_prefix(driver)}{uid}.json"
