"""Who holds or sees which GPU on this node, and in which role, as rows ``/metrics`` exports.

Operators join these rows with the vendor exporter's own device series, which cannot tell
the sharers of one GPU apart: dcgm-exporter, for one, copies a shared device's numbers to the
one pod kubelet gave it (here the shadow). So every row carries the real ID and, in the
vendor's own label names, the labels the exporter uses for that device (``JOIN_LABELS``).

Roles (``GpuUser.role``):

    owner      a container kubelet gave real GPUs to (not a shadow)
    shadow     a shadow pod's ``main``, holding the GPU its sharers use
    sharer     a container holding slots of a shadow; ``source`` is the shadow
    dind       a container given another container's GPUs by the same-pod annotation; ``source`` is that container
    borrower   a spot container on a lent GPU; ``source`` is the owner holding it

Rows are derived each pass from the same inputs as the mapping (PodResources rows and this
node's pods), so they are as fresh as the last pass and never stored.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from controller.core.mapping import MappingCache
from controller.core.model import Snapshot, is_shadow
from controller.core.roles import ROLE_BORROWER, ROLE_DIND, ROLE_OWNER, ROLE_SHADOW, ROLE_SHARER, ROLES
from gpumetrics.model import DeviceMetrics
from gpushare import keys
from gpushare.codecs import parse_same_pod_annotations
from gpushare.errors import GpushareError

# Vendor -> (label naming the device's identity, label naming its index) in that vendor's exporter.
# None where our own ``device_id`` label already is the identity (Hygon names its serial
# ``device_id``) or the exporter has no identity label (Kunlunxin: the card index only).
JOIN_LABELS: Mapping[str, tuple[str | None, str | None]] = {
    "nvidia": ("UUID", "gpu"),
    "amd": ("gpu_uuid", "gpu_id"),
    "hygon": (None, "minor_number"),
    "ascend": ("vdie_id", "id"),
    "enflame": ("uuid", "minor_number"),
    "cambricon": ("uuid", "mlu"),
    "iluvatar": ("uuid", "gpu"),
    "metax": ("uuid", "deviceId"),
    "mthreads": ("uuid", "index"),
    "kunlunxin": (None, "card"),
    "biren": (None, None),
}


@dataclass(frozen=True, order=True)
class GpuUser:
    """One container and one real GPU it holds or sees."""

    device_id: str  # the real ID (what the vendor device plugin advertises); "" while a shadow's GPU is unknown
    role: str
    namespace: str
    pod: str
    container: str
    resource: str  # the resource that gave it access: the vendor's, gpushare/share-*, gpushare/spot-gpu
    source: str = ""  # sharer: the shadow "ns/name"; dind, borrower: the source or owner "ns/pod/container"


@dataclass(frozen=True, order=True)
class ShadowSlots:
    """One shadow on this node: its GPU, its N slots, and how many of them its sharers hold."""

    shadow: str  # "ns/name"
    device_id: str
    resource: str  # the share resource it backs
    slots: int
    used: int
    sharers: int  # sharer containers holding at least one slot


@dataclass(frozen=True)
class Attribution:
    users: tuple[GpuUser, ...] = ()
    shadows: tuple[ShadowSlots, ...] = ()


def attribute(snapshot: Snapshot, mapping: MappingCache) -> Attribution:
    """Every container on this node that holds or sees a real GPU; ``snapshot`` is the node's."""
    users: list[GpuUser] = []
    shadow_gpus: dict[str, tuple[str, ...]] = {}
    for h in mapping.real:
        facts = snapshot.pods.get(h.pod.key)
        shadow = facts is not None and is_shadow(facts)
        if shadow:
            shadow_gpus[h.pod.key] = h.real_ids
        role = ROLE_SHADOW if shadow else ROLE_OWNER
        users += [GpuUser(rid, role, h.pod.namespace, h.pod.name, h.container, h.resource) for rid in h.real_ids]
    for s in mapping.holdings:
        for rid in shadow_gpus.get(s.shadow_key, ("",)):
            users.append(
                GpuUser(rid, ROLE_SHARER, s.sharer.namespace, s.sharer.name, s.container, s.resource, s.shadow_key)
            )
    for b in mapping.borrowings:
        owner = mapping.holder_of(b.real_id)
        source = f"{owner.pod.key}/{owner.container}" if owner is not None else ""
        ns, pod = b.borrower.namespace, b.borrower.name
        users.append(GpuUser(b.real_id, ROLE_BORROWER, ns, pod, b.container, keys.RESOURCE_SPOT_GPU, source))
    users += _dind_recipients(snapshot, users)
    return Attribution(tuple(sorted(set(users))), _shadow_slots(snapshot, mapping, shadow_gpus))


def _dind_recipients(snapshot: Snapshot, users: Sequence[GpuUser]) -> list[GpuUser]:
    """Targets of the same-pod annotation see what their source container holds or sees."""
    by_container: dict[tuple[str, str, str], list[GpuUser]] = {}
    for u in users:
        by_container.setdefault((u.namespace, u.pod, u.container), []).append(u)
    out: list[GpuUser] = []
    for facts in snapshot.pods.values():
        if facts.is_terminal:
            continue
        try:
            targets = parse_same_pod_annotations(dict(facts.annotations))
        except GpushareError:
            continue  # the NRI plugin refuses such a pod's containers: nobody sees a GPU through it
        ns, pod = facts.ref.namespace, facts.ref.name
        for target, spec in sorted(targets.items()):
            for u in by_container.get((ns, pod, spec.source), ()):
                out.append(GpuUser(u.device_id, ROLE_DIND, ns, pod, target, u.resource, f"{ns}/{pod}/{spec.source}"))
    return out


def _shadow_slots(
    snapshot: Snapshot, mapping: MappingCache, shadow_gpus: Mapping[str, tuple[str, ...]]
) -> tuple[ShadowSlots, ...]:
    out: list[ShadowSlots] = []
    for s in snapshot.shadows:
        if s.ref.key not in shadow_gpus:
            continue  # not holding a GPU on this node: the agent of its node reports it
        held = [h for h in mapping.holdings if h.shadow_key == s.ref.key]
        used = len({vid for h in held for vid in h.virtual_ids})
        for rid in shadow_gpus[s.ref.key]:
            out.append(ShadowSlots(s.ref.key, rid, s.key.resource, s.key.spec, used, len(held)))
    return tuple(sorted(out))


def vendor_of(configured: str, devices: Iterable[DeviceMetrics]) -> str:
    """The vendor whose label names the rows carry: the configured one, else the scraped one ("" if none)."""
    if configured and configured != "auto":
        return configured
    return next((d.vendor for d in devices), "")


def join_label_names(vendor: str) -> tuple[str, ...]:
    return tuple(name for name in JOIN_LABELS.get(vendor, (None, None)) if name is not None)


def join_values(vendor: str, device_id: str, devices: Iterable[DeviceMetrics]) -> tuple[str, ...]:
    """The exporter's label values for one real ID, in ``join_label_names`` order.

    The identity is the scraped device's UUID when the agent's last scrape has a device whose
    ``device_id`` or UUID is the real ID, else the real ID itself (what the vendor plugin and the
    exporter both call the device, which spot relies on too); the index only comes from a scrape.
    """
    identity, index = JOIN_LABELS.get(vendor, (None, None))
    match = next((d for d in devices if device_id and device_id in (d.device_id, d.uuid)), None)
    values: list[str] = []
    if identity is not None:
        values.append(match.uuid if match is not None and match.uuid else device_id)
    if index is not None:
        values.append(str(match.index) if match is not None and match.index is not None else "")
    return tuple(values)


__all__ = [
    "JOIN_LABELS",
    "ROLES",
    "Attribution",
    "GpuUser",
    "ShadowSlots",
    "attribute",
    "join_label_names",
    "join_values",
    "vendor_of",
]
