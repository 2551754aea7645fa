"""What the device plugins decide, as plain functions over plain data (docs/architecture.md).

Nothing here touches gRPC, sockets, threads or the clock: the servers in ``server.py`` call
these and turn the result into protobuf messages. Every decision is unit-tested in
``tests/unit/deviceplugins/test_policies.py``.

- Device lists: share resources from shadow pods (design §2, §3), spot from real IDs (§6).
- ``Allocate``: the container annotation of design §4, or an error naming the bad IDs.
- ``GetPreferredAllocation``: pack share slots onto one shadow; prefer idle spot devices.
- The fake vendor plugin's ``Allocate``: device nodes plus ``FAKE_VISIBLE_DEVICES``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from deviceplugins.errors import DevicesRefused, InvalidShadow, UnknownDevices
from gpushare import codecs, keys, rules
from gpushare.ids import (
    format_spot_id,
    is_replica_id,
    is_virtual_id,
    parse_spot_id,
    parse_virtual_id,
    parse_virtual_id_or_none,
    virtual_ids_of,
)

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
# kubelet refuses longer device IDs (k8s.io/kubelet pkg/apis/deviceplugin/v1beta1, Device.ID).
MAX_DEVICE_ID_CHARS = 63
# The fake vendor plugin's environment variable; the NRI plugin's visibility list has it too.
FAKE_VISIBLE_ENV = "FAKE_VISIBLE_DEVICES"
FAKE_DEVICE_PREFIX = "fakegpu"

_DECIMAL = re.compile(r"^[0-9]{1,4}$")  # ASCII only: str.isdigit() accepts "²" and "٣"


@dataclass(frozen=True, order=True)
class AdvertisedDevice:
    """A device ID and its health as kubelet sees it: what ``ListAndWatch`` sends for it."""

    id: str
    healthy: bool = True

    @property
    def health(self) -> str:
        return HEALTHY if self.healthy else UNHEALTHY


@dataclass(frozen=True)
class ShadowSlots:
    """A running shadow pod on this node (design §3) as the range of virtual IDs it backs:
    ``<namespace>/<name>-0`` .. ``-<spec - 1>`` on its share resource."""

    namespace: str
    name: str
    spec: int
    kind: str = keys.KIND_SHARE

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def resource(self) -> str:
        return keys.share_resource(self.kind, self.spec)


@dataclass(frozen=True)
class DeviceMount:
    """A host device node mounted into the container (kubelet's ``DeviceSpec``); only the fake
    vendor plugin sends any."""

    container_path: str
    host_path: str
    permissions: str = "rw"


@dataclass(frozen=True)
class Allocation:
    """One container's ``ContainerAllocateResponse`` as plain data."""

    annotations: Mapping[str, str] = field(default_factory=dict)
    envs: Mapping[str, str] = field(default_factory=dict)
    devices: tuple[DeviceMount, ...] = ()


# --- shadows -> share devices --------------------------------------------------------------


def parse_static_shadow(text: str) -> ShadowSlots:
    """Parse the command line's ``ns/name:N[:kind]`` (``gpushare deviceplugins run --shadow``)."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or "/" not in parts[0]:
        raise InvalidShadow([f"{text!r}: expected <namespace>/<shadow-pod>:<N>[:share|share-dev]"])
    namespace, _, name = parts[0].partition("/")
    if not _DECIMAL.fullmatch(parts[1]):
        raise InvalidShadow([f"{text!r}: share spec {parts[1]!r} is not a whole number"])
    kind = parts[2] if len(parts) == 3 else keys.KIND_SHARE
    shadow = ShadowSlots(namespace=namespace, name=name, spec=int(parts[1]), kind=kind)
    check_shadows([shadow], served=None)
    return shadow


def check_shadows(shadows: Sequence[ShadowSlots], served: Iterable[str] | None) -> None:
    """Refuse the whole set if any shadow cannot be advertised; ``served`` = our resource names.

    Raises ``InvalidShadow`` listing every problem, so the caller changes nothing.
    """
    problems: list[str] = []
    served_set = set(served) if served is not None else None
    seen: set[str] = set()
    for s in shadows:
        where = f"shadow {s.key!r}"
        if s.kind not in (keys.KIND_SHARE, keys.KIND_SHARE_DEV):
            problems.append(f"{where}: kind {s.kind!r} is neither {keys.KIND_SHARE!r} nor {keys.KIND_SHARE_DEV!r}")
            continue
        if not rules.is_share_spec(s.spec):
            problems.append(f"{where}: share spec {s.spec} is outside {rules.MIN_SHARE_SPEC}..{rules.MAX_SHARE_SPEC}")
            continue
        if served_set is not None and s.resource not in served_set:
            problems.append(f"{where}: {s.resource} is not served here (check shareSpecs / devShareSpecs)")
        if s.key in seen:
            problems.append(f"{where}: listed twice")
        seen.add(s.key)
        last = virtual_ids_of(s.namespace, s.name, s.spec)[-1]
        if not is_virtual_id(last):
            problems.append(f"{where}: not a valid <namespace>/<pod> name")
            continue
        if not rules.is_dns_label(s.namespace):
            problems.append(f"{where}: namespace {s.namespace!r} is not a DNS label")
        if len(last) > MAX_DEVICE_ID_CHARS:
            problems.append(f"{where}: device ID {last!r} is longer than kubelet's {MAX_DEVICE_ID_CHARS} characters")
    if problems:
        raise InvalidShadow(problems)


def share_devices(shadows: Iterable[ShadowSlots], resource: str) -> tuple[AdvertisedDevice, ...]:
    """Every slot of every shadow backing ``resource``: count = shadows x N (design §2)."""
    out: list[AdvertisedDevice] = []
    for s in sorted(shadows, key=lambda s: s.key):
        if s.resource == resource:
            out.extend(AdvertisedDevice(vid) for vid in virtual_ids_of(s.namespace, s.name, s.spec))
    return tuple(out)


# --- spot devices ----------------------------------------------------------------------------


@dataclass(frozen=True)
class SpotDevices:
    devices: tuple[AdvertisedDevice, ...]
    real_resource_of: Mapping[str, str]  # real ID -> the vendor resource it came from
    skipped: tuple[tuple[str, str], ...]  # (real ID, why) for each one spot does not offer


def spot_devices(real: Mapping[str, Sequence[str]], health: Mapping[str, bool]) -> SpotDevices:
    """``spot-<realID>`` for each real device; Unhealthy unless ``health`` says otherwise (fail closed).

    A replica of a GPU the vendor plugin shares itself (time-slicing, MPS) is never offered: the
    other replicas' pods use the same GPU at the same time, so one replica's holder being idle
    says nothing of the GPU, and a borrower would run beside them."""
    devices: list[AdvertisedDevice] = []
    owner: dict[str, str] = {}
    skipped: list[tuple[str, str]] = []
    for resource in sorted(real):
        for rid in real[resource]:
            why = (
                "listed twice"
                if rid in owner
                else "too long for a device ID"
                if len(format_spot_id(rid)) > MAX_DEVICE_ID_CHARS
                else f"a replica of a GPU {resource}'s plugin shares itself (time-slicing or MPS)"
                if is_replica_id(rid)
                else None
            )
            if why is not None:
                skipped.append((rid, why))
                continue
            owner[rid] = resource
            devices.append(AdvertisedDevice(format_spot_id(rid), health.get(rid, False)))
    return SpotDevices(tuple(sorted(devices)), owner, tuple(skipped))


# --- Allocate ---------------------------------------------------------------------------------


def _check_request(resource: str, requested: Sequence[str], advertised: Mapping[str, AdvertisedDevice]) -> None:
    if not requested:
        raise DevicesRefused(resource, [], "the request names no device IDs")
    dups = {i for i in requested if requested.count(i) > 1}
    if dups:
        raise DevicesRefused(resource, dups, "listed more than once in one request")
    unknown = [i for i in requested if i not in advertised]
    if unknown:
        raise UnknownDevices(resource, unknown)


def allocate_share(resource: str, requested: Sequence[str], advertised: Mapping[str, AdvertisedDevice]) -> Allocation:
    """Share / share-dev: the ``container-devices-from`` annotation naming the one shadow (design §4)."""
    _check_request(resource, requested, advertised)
    closed = [i for i in requested if not advertised[i].healthy]
    if closed:
        raise DevicesRefused(resource, closed, "Unhealthy: the shadow's GPU is closed to new sharers")
    by_shadow: dict[tuple[str, str], list[str]] = {}
    for vid in requested:
        v = parse_virtual_id(vid)
        by_shadow.setdefault((v.namespace, v.shadow), []).append(vid)
    if len(by_shadow) > 1:
        names = ", ".join(f"{ns}/{name}" for ns, name in sorted(by_shadow))
        raise DevicesRefused(
            resource,
            requested,
            f"the slots belong to {len(by_shadow)} shadows ({names}), i.e. several GPUs; one container "
            "shares exactly one GPU, so request slots of one shadow (usually 1)",
        )
    ((namespace, shadow), ids) = next(iter(by_shadow.items()))
    return Allocation(annotations={keys.ANNOTATION_DEVICES_FROM: codecs.encode_devices_from(namespace, shadow, ids)})


def allocate_spot(
    resource: str,
    requested: Sequence[str],
    advertised: Mapping[str, AdvertisedDevice],
    real_resource_of: Mapping[str, str],
) -> Allocation:
    """Spot: the ``container-devices-ids`` annotation with the real IDs; Unhealthy is refused (design §6)."""
    _check_request(resource, requested, advertised)
    # Allocate names no pod, so only a Healthy device may go to a borrower here (rules.may_borrow).
    busy = [
        i
        for i in requested
        if not rules.may_borrow(device_healthy=advertised[i].healthy, lent_to_this_pod=False, reclaimed=False)
    ]
    if busy:
        raise DevicesRefused(
            resource, busy, "Unhealthy: the owner is using the GPU (or its metrics are missing), it is not lendable now"
        )
    by_resource: dict[str, list[str]] = {}
    for sid in requested:
        rid = parse_spot_id(sid)
        if rid is None:  # advertised, yet not built by format_spot_id: not a device this plugin lends
            raise UnknownDevices(resource, [sid])
        by_resource.setdefault(real_resource_of[rid], []).append(rid)
    return Allocation(annotations={keys.ANNOTATION_DEVICES_IDS: codecs.encode_devices_ids(by_resource)})


def fake_device_ids(count: int) -> list[str]:
    return [f"{FAKE_DEVICE_PREFIX}{i}" for i in range(count)]


def allocate_fake(
    resource: str, requested: Sequence[str], advertised: Mapping[str, AdvertisedDevice], dev_dir: str
) -> Allocation:
    """The fake vendor plugin answers like a real one: device nodes and a visibility variable."""
    _check_request(resource, requested, advertised)
    base = dev_dir.rstrip("/") or ""
    nodes = tuple(DeviceMount(f"/dev/{i}", f"{base}/{i}", "rw") for i in requested)
    return Allocation(envs={FAKE_VISIBLE_ENV: ",".join(requested)}, devices=nodes)


# --- GetPreferredAllocation ---------------------------------------------------------------


def _dedup(ids: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(ids))


def prefer_share(available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
    """Pack: take every slot from one shadow, the fullest one that still fits (kubelet may ignore a preference).

    Packing leaves other shadows empty so they can reach ``shadowIdleTimeout`` and be
    deleted, and keeps a container's slots on one GPU, which ``allocate_share`` requires.
    """
    chosen = _dedup(must_include)
    need = size - len(chosen)
    if need <= 0:
        return chosen
    free: dict[str, list[str]] = {}
    for vid in _dedup(available):
        if vid in chosen:
            continue
        parsed = parse_virtual_id_or_none(vid)
        if parsed is None:
            continue  # not one of ours; leave it to kubelet
        free.setdefault(parsed.shadow_key, []).append(vid)
    pinned = {v.shadow_key for v in map(parse_virtual_id_or_none, chosen) if v is not None}
    # Shadows that already hold a must-include slot first, then the fullest that fits, then by name.
    order = sorted(free, key=lambda k: (k not in pinned, len(free[k]) < need, len(free[k]), k))
    for key in order:
        take = sorted(free[key], key=lambda v: parse_virtual_id(v).index)[:need]
        chosen.extend(take)
        need -= len(take)
        if need <= 0:
            break
    return chosen


def prefer_spot(available: Sequence[str], must_include: Sequence[str], size: int, lent: Iterable[str]) -> list[str]:
    """Idle devices before ones already lent (design §6), each group in ID order."""
    chosen = _dedup(must_include)
    lent_set = set(lent)
    rest = sorted((i for i in _dedup(available) if i not in chosen), key=lambda i: (i in lent_set, i))
    return (chosen + rest)[: max(size, len(chosen))]
