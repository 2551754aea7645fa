"""Device sync decisions (design §5 and §8): instruction → source → verify → adjustment.

Pure functions over plain data (``nri_plugin.model``): no sockets, threads, clock or protobuf.
Everything outside — what kubelet allocated (PodResources) and real-ID resolution — is looked
up by the caller and passed in as data. Every refusal raises ``InstructionRefused`` whose
message starts with ``gpushare:``, names the problem and the rule; the stub returns it to
containerd, which fails only that container.

Rules:
- Instructions: the container annotations ``container-devices-from`` (shadow source, JSON) and
  ``container-devices-ids`` (real IDs, JSON), or the pod annotation
  ``container-devices-from.<this container>`` (same-pod source, Docker-in-Docker). A container
  annotation beats the pod annotation; both container annotations at once are refused.
- Cross-pod (both container annotations) is honoured only when the key is NOT also a pod
  annotation (it could have been copied from the pod by a runtime pass-through), only with an
  allocation oracle (PodResources) that confirms the container holds exactly those IDs, and for
  ``container-devices-from`` only when the source pod is known on this node and labelled
  ``gpushare.k8s.io/role=shadow``.
- A source must already have been created. When the target comes first the container is
  refused ("not created yet"); kubelet retries container creation with back-off, so the pod
  converges once the source exists.
- The bundle is the source's character devices under /dev (other types and paths are skipped;
  a source with none left is refused), its visibility variables and its ``cdi.k8s.io/``
  annotations. Nothing is ever removed from the target.
- Real IDs (spot) are injected only while the agent says each lend is active. Their bundle is
  the vendor plugin's own answer for exactly those IDs, or else the nodes of the container
  kubelet allocated them to that the vendor's rule (``device_rules``) says are those GPUs'.
"""

from __future__ import annotations

import contextlib
import posixpath
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace

from gpushare import installation, keys, rules
from gpushare.cdi import CdiRegistry
from gpushare.codecs import DevicesFrom, DevicesIds, parse_devices_from, parse_devices_ids, parse_same_pod_annotations
from gpushare.config import DEFAULT_DEVICE_LIST_DIRS
from gpushare.errors import (
    REFUSED_CONFLICT,
    REFUSED_DEVICES_UNKNOWN,
    REFUSED_FORGED,
    REFUSED_LEND_ENDED,
    REFUSED_MALFORMED,
    REFUSED_NOT_READY,
    REFUSED_NOT_SHADOW,
    REFUSED_UNCONFIRMED,
    InstructionRefused,
)
from gpushare.ids import parse_spot_id, parse_virtual_id_or_none
from nri_plugin.device_rules import gpu_nodes
from nri_plugin.model import Bundle, ContainerInfo, DeviceNode, PodInfo, RuntimeView, SourceRecord
from nri_plugin.oracle import Holder

RETRY_HINT = "kubelet retries container creation with back-off, so the pod converges once it exists"


@dataclass(frozen=True)
class SamePod:
    """Pod annotation: take the bundle of container ``source`` of the same pod."""

    source: str


@dataclass(frozen=True)
class ShadowSource:
    """Container annotation ``container-devices-from``: a shadow pod's container."""

    spec: DevicesFrom


@dataclass(frozen=True)
class RealIds:
    """Container annotation ``container-devices-ids``: real device IDs (spot)."""

    spec: DevicesIds


Instruction = SamePod | ShadowSource | RealIds


@dataclass(frozen=True)
class Decision:
    """What to add to the target, where it came from, and what was skipped (for the log)."""

    source: str
    adjustment: Bundle
    skipped: tuple[str, ...] = ()

    @property
    def is_cross_pod(self) -> bool:
        return "/" in self.source


def is_cross_pod(instruction: Instruction | None) -> bool:
    return isinstance(instruction, ShadowSource | RealIds)


def find_instruction(pod: PodInfo, container: ContainerInfo) -> Instruction | None:
    """The instruction for this container, or None. Malformed → InstructionRefused."""
    from_value = container.annotations.get(keys.ANNOTATION_DEVICES_FROM)
    ids_value = container.annotations.get(keys.ANNOTATION_DEVICES_IDS)
    if from_value is not None and ids_value is not None:
        raise InstructionRefused(
            f"gpushare: container {container.name!r} carries both {keys.ANNOTATION_DEVICES_FROM} and "
            f"{keys.ANNOTATION_DEVICES_IDS}; a container takes devices from one source only",
            reason=REFUSED_CONFLICT,
        )
    for key, value in ((keys.ANNOTATION_DEVICES_FROM, from_value), (keys.ANNOTATION_DEVICES_IDS, ids_value)):
        if value is not None and key in pod.annotations:
            raise InstructionRefused(
                f"gpushare: {key} is also a pod annotation of {pod.ref}; a cross-pod instruction is honoured only "
                "from a container annotation written by gpushare's device plugin, never one that may have been "
                "copied from the pod (design §8)",
                reason=REFUSED_FORGED,
            )
    if from_value is not None:
        with _naming(keys.ANNOTATION_DEVICES_FROM, container):
            return ShadowSource(parse_devices_from(from_value))
    if ids_value is not None:
        with _naming(keys.ANNOTATION_DEVICES_IDS, container):
            return RealIds(parse_devices_ids(ids_value))
    key = keys.POD_ANNOTATION_DEVICES_FROM_PREFIX + container.name
    if key in pod.annotations:
        with _naming(key, container):
            found = parse_same_pod_annotations({key: pod.annotations[key]})
        return SamePod(found[container.name].source)
    return None


@contextlib.contextmanager
def _naming(key: str, container: ContainerInfo) -> Iterator[None]:
    """Make sure a parser's refusal names the annotation (some codec messages only quote the value)."""
    try:
        yield
    except InstructionRefused as exc:
        text = str(exc)
        if key in text:
            raise
        detail = text.removeprefix("gpushare: ")
        raise InstructionRefused(
            f"gpushare: annotation {key} of container {container.name!r}: {detail}", reason=REFUSED_MALFORMED
        ) from exc


def usable_devices(devices: tuple[DeviceNode, ...]) -> tuple[tuple[DeviceNode, ...], tuple[str, ...]]:
    """Split a source's devices into injectable ones (character devices under /dev, clean
    paths) and a description of each skipped one."""
    keep: list[DeviceNode] = []
    skipped: list[str] = []
    for d in devices:
        if d.type != "c":
            kind = {"b": "block device", "u": "unbuffered char device", "p": "FIFO"}.get(d.type, f"type {d.type!r}")
            skipped.append(f"{d.path} ({kind})")
        elif not d.path.startswith("/dev/") or posixpath.normpath(d.path) != d.path or "/../" in d.path + "/":
            skipped.append(f"{d.path} (not under /dev)")
        elif d.major < 0 or d.minor < 0:
            skipped.append(f"{d.path} (negative device number)")
        else:
            keep.append(d)
    return tuple(keep), tuple(skipped)


def _source_bundle(source: SourceRecord, what: str) -> tuple[Bundle, tuple[str, ...]]:
    """The source's GPU part: its usable device nodes, and what its vendor stack gave it besides.

    A source without device nodes still holds a GPU when the runtime adds the nodes later from
    what it was given (NVIDIA's runtime reads the visibility variable or the device-list mounts at
    start) or containerd does (CDI names): the target gets the same request, and the same runtime
    gives it the same GPU."""
    part = source.bundle
    devices, skipped = usable_devices(part.devices)
    if not (devices or part.env or part.mounts or part.cdi_names()):
        detail = f" (skipped: {', '.join(skipped)})" if skipped else ""
        raise InstructionRefused(
            f"gpushare: {what} holds no GPU: no character device under /dev{detail}, no visibility variable, "
            "no device-list mount and no CDI device; only what the source really holds is injected (design §8)",
            reason=REFUSED_DEVICES_UNKNOWN,
        )
    return replace(part, devices=devices), skipped


def _added(bundle: Bundle, target: ContainerInfo) -> Bundle:
    """What the target does not already have. Never removes; refuses to replace a device or a mount."""
    have = {d.path: d for d in target.devices}
    devices = []
    for d in bundle.devices:
        old = have.get(d.path)
        if old is None:
            devices.append(d)
        elif (old.type, old.major, old.minor) != (d.type, d.major, d.minor):
            raise InstructionRefused(
                f"gpushare: container {target.name!r} already has {d.path} as {old.type} {old.major}:{old.minor}, "
                f"the source's is {d.type} {d.major}:{d.minor}; gpushare adds devices but never replaces one",
                reason=REFUSED_CONFLICT,
            )
    mounted = {m.destination: m for m in target.mounts}
    mounts = []
    for m in bundle.mounts:
        old_mount = mounted.get(m.destination)
        if old_mount is None:
            mounts.append(m)
        elif old_mount.source != m.source:
            raise InstructionRefused(
                f"gpushare: container {target.name!r} already mounts {old_mount.source} at {m.destination}, the "
                f"source's GPU mounts {m.source} there; gpushare adds mounts but never replaces one",
                reason=REFUSED_CONFLICT,
            )
    env_have = dict(target.env)
    env = tuple((k, v) for k, v in bundle.env if env_have.get(k) != v)
    annotations = tuple((k, v) for k, v in bundle.annotations if target.annotations.get(k) != v)
    hooks_have = {h.key for h in target.hooks}
    hooks = tuple(h for h in bundle.hooks if h.key not in hooks_have)
    cdi_devices = tuple(n for n in bundle.cdi_devices if n not in target.cdi_devices)
    return Bundle(tuple(devices), env, annotations, tuple(mounts), hooks, cdi_devices)


def for_runtime(added: Bundle, registry: CdiRegistry, *, takes_cdi_devices: bool) -> Bundle:
    """The adjustment as the runtime can apply it, so the target gets what the source got, once.

    - The runtime resolves CDI names in an adjustment (containerd 2.x) and the node's specs know
      every name: the names go, and nothing their edits make (nodes, mounts, hooks, variables),
      so containerd applies exactly the source's edits, device-cgroup ``rwm`` rules included.
    - Otherwise (containerd 1.7, or a name this node's specs lack) the names are dropped and the
      source's copied edits go as they are, with ``rw`` rules: NRI v0.6.1 cannot grant ``m``.
    - A ``cdi.k8s.io/`` annotation goes only when nothing else carries its devices (containerd
      did not resolve it for the source either), so a runtime in CDI mode cannot apply the same
      edits a second time.
    """
    names = added.cdi_names()
    covered = registry.edits_of(names) if names else None
    if takes_cdi_devices and covered is not None:
        nodes = {n.path for n in covered.device_nodes}
        mounts = {m.destination for m in covered.mounts}
        hooks = {h.key for h in covered.hooks}
        return Bundle(
            devices=tuple(d for d in added.devices if d.path not in nodes),
            env=tuple((k, v) for k, v in added.env if k not in covered.env_names),
            annotations=(),
            mounts=tuple(m for m in added.mounts if m.destination not in mounts),
            hooks=tuple(h for h in added.hooks if h.key not in hooks),
            cdi_devices=names,
        )
    resolved = covered is not None and {n.path for n in covered.device_nodes} <= {d.path for d in added.devices}
    return replace(added, cdi_devices=(), annotations=() if resolved else added.annotations)


def decide(
    instruction: Instruction,
    pod: PodInfo,
    container: ContainerInfo,
    view: RuntimeView,
    *,
    allocated: Mapping[str, frozenset[str]] | None = None,
    resolved: Mapping[str, Bundle] | None = None,
    holders: Mapping[str, Holder] | None = None,
    lends: Mapping[str, str | None] | None = None,
    device_list_dirs: tuple[str, ...] = DEFAULT_DEVICE_LIST_DIRS,
) -> Decision:
    """Decide the adjustment for ``container`` of ``pod``.

    ``allocated`` is the oracle's answer for this container (None: no oracle configured, so
    cross-pod instructions are refused). For real IDs (spot): ``resolved`` maps a real resource
    to the vendor's own bundle for exactly the requested IDs (``DeviceResolver``); ``holders``
    maps a real ID to the container kubelet allocated it to (``HolderOracle``), used for a
    resource the vendor did not resolve; ``lends`` maps each real ID to None while its lend to
    this pod is active, else to why not (``LendState``; None: no lend state, so refused).
    """
    if isinstance(instruction, SamePod):
        return _decide_same_pod(instruction, pod, container, view)
    if allocated is None:
        raise InstructionRefused(
            f"gpushare: cross-pod instruction for container {container.name!r} of {pod.ref} refused: no PodResources "
            "API is configured to confirm the allocation (start the plugin with --pod-resources-socket; design §8)",
            reason=REFUSED_UNCONFIRMED,
        )
    if isinstance(instruction, ShadowSource):
        return _decide_shadow(instruction.spec, pod, container, view, allocated)
    return decide_real_ids(
        instruction.spec,
        pod,
        container,
        view,
        allocated=allocated,
        resolved=resolved or {},
        holders=holders or {},
        lends=lends,
        device_list_dirs=device_list_dirs,
    )


def _decide_same_pod(instr: SamePod, pod: PodInfo, container: ContainerInfo, view: RuntimeView) -> Decision:
    source = view.container_named(pod.id, instr.source)
    if source is None or source.container_id == container.id:
        raise InstructionRefused(
            f'gpushare: the pod annotation for "{container.name}" names "{instr.source}", which is not a created '
            f"container of pod {pod.ref}: it is not created yet or does not exist; {RETRY_HINT}",
            reason=REFUSED_NOT_READY,
        )
    bundle, skipped = _source_bundle(source, f'source container "{instr.source}" of pod {pod.ref}')
    return Decision(f"{pod.ref}/{instr.source}", _added(bundle, container), skipped)


def _decide_shadow(
    spec: DevicesFrom,
    pod: PodInfo,
    container: ContainerInfo,
    view: RuntimeView,
    allocated: Mapping[str, frozenset[str]],
) -> Decision:
    ref = spec.source
    source_pod = view.pod_by_ref(ref.namespace, ref.pod)
    if source_pod is None:
        raise InstructionRefused(
            f"gpushare: source pod {ref.namespace}/{ref.pod} named by {keys.ANNOTATION_DEVICES_FROM} is not known on "
            f"this node: it does not run here or none of its containers is created yet; {RETRY_HINT}",
            reason=REFUSED_NOT_READY,
        )
    if not rules.is_shadow(source_pod.namespace, source_pod.labels):
        raise InstructionRefused(
            f"gpushare: source pod {source_pod.ref} is not a shadow (labelled {rules.SHADOW_SELECTOR} in "
            f"{installation.namespace()}); "
            "a cross-pod source must be a gpushare shadow pod on this node (design §8)",
            reason=REFUSED_NOT_SHADOW,
        )
    wanted = frozenset(spec.virtual_ids)
    shared = frozenset(vid for resource, ids in allocated.items() if keys.parse_share_resource(resource) for vid in ids)
    of_source = frozenset(vid for vid in shared if _belongs_to(vid, ref.namespace, ref.pod))
    if of_source != wanted:
        raise InstructionRefused(
            f"gpushare: PodResources does not confirm that container {container.name!r} of {pod.ref} holds exactly "
            f"{sorted(wanted)} (kubelet lists {sorted(of_source) or 'none'} of {source_pod.ref}); "
            "refused (design §8)",
            reason=REFUSED_UNCONFIRMED,
        )
    source = view.container_named(source_pod.id, ref.container)
    if source is None:
        raise InstructionRefused(
            f'gpushare: container "{ref.container}" of source pod {source_pod.ref} is not created yet; {RETRY_HINT}',
            reason=REFUSED_NOT_READY,
        )
    bundle, skipped = _source_bundle(source, f"source container {ref}")
    return Decision(str(ref), _added(bundle, container), skipped)


def _belongs_to(vid: str, namespace: str, shadow: str) -> bool:
    parsed = parse_virtual_id_or_none(vid)
    return parsed is not None and (parsed.namespace, parsed.shadow) == (namespace, shadow)


def confirmed_real_ids(spec: DevicesIds, allocated: Mapping[str, frozenset[str]]) -> bool:
    """Whether kubelet lists for the container ``spot-<id>`` for exactly the instructed real IDs."""
    wanted = frozenset(rid for _, ids in spec.by_resource for rid in ids)
    return _spot_held(allocated) == wanted


def _spot_held(allocated: Mapping[str, frozenset[str]]) -> frozenset[str]:
    spot_ids = allocated.get(keys.RESOURCE_SPOT_GPU, frozenset())
    return frozenset(rid for rid in map(parse_spot_id, spot_ids) if rid is not None)


def decide_real_ids(
    spec: DevicesIds,
    pod: PodInfo,
    container: ContainerInfo,
    view: RuntimeView,
    *,
    allocated: Mapping[str, frozenset[str]],
    resolved: Mapping[str, Bundle],
    holders: Mapping[str, Holder],
    lends: Mapping[str, str | None] | None,
    device_list_dirs: tuple[str, ...] = DEFAULT_DEVICE_LIST_DIRS,
) -> Decision:
    wanted = frozenset(rid for _, ids in spec.by_resource for rid in ids)
    held = _spot_held(allocated)
    if held != wanted:
        raise InstructionRefused(
            f"gpushare: PodResources does not confirm that container {container.name!r} of {pod.ref} holds "
            f"{keys.RESOURCE_SPOT_GPU} devices for exactly {sorted(wanted)} (kubelet lists "
            f"{sorted(held) or 'none'}); refused (design §8)",
            reason=REFUSED_UNCONFIRMED,
        )
    _check_lends(sorted(wanted), pod, lends)
    bundle = Bundle()
    skipped: list[str] = []
    sources: list[str] = []
    for resource, ids in spec.by_resource:
        if resource in resolved:
            part, skip = _vendor_bundle(resolved[resource], resource, ids)
            sources.append(f"vendor:{resource}")
        else:
            part, skip, names = _holder_bundle(
                resource, ids, container, view, holders, device_list_dirs=device_list_dirs
            )
            sources.extend(names)
        bundle = bundle.merged(part)
        skipped.extend(skip)
    return Decision(",".join(sources), _added(bundle, container), tuple(skipped))


def _check_lends(wanted: list[str], pod: PodInfo, lends: Mapping[str, str | None] | None) -> None:
    if lends is None:
        raise InstructionRefused(
            f"gpushare: no lend state is available to confirm that {wanted} are lent to pod {pod.ref} now; "
            "spot GPUs are injected only by the gpushare agent, which knows the node's lends (docs/nri.md)",
            reason=REFUSED_LEND_ENDED,
        )
    for rid in wanted:
        why = lends.get(rid, "the agent has no record of it")
        if why is not None:
            raise InstructionRefused(
                f"gpushare: lend of GPU {rid} to pod {pod.ref} ended: {why}; a spot GPU is injected only while "
                "its lend is active, so this container is not created (the agent deletes a reclaimed borrower; "
                "create a new spot pod to borrow again)",
                reason=REFUSED_LEND_ENDED,
            )


def _vendor_bundle(vendor: Bundle, resource: str, ids: tuple[str, ...]) -> tuple[Bundle, tuple[str, ...]]:
    """The vendor's own answer: its usable nodes, and its variables, mounts, hooks, CDI names and
    annotations as it gave them (``controller.io.vendor_allocate`` keeps only the GPU's).

    A vendor whose runtime adds the nodes (NVIDIA's envvar and volume-mounts strategies) or whose
    CDI names do answers without nodes, so such an answer is fine while it names something."""
    devices, skipped = usable_devices(vendor.devices)
    if not (devices or vendor.env or vendor.mounts or vendor.cdi_names()):
        detail = f" (skipped: {', '.join(skipped)})" if skipped else ""
        raise InstructionRefused(
            f"gpushare: the vendor device plugin's Allocate answer for {resource} {list(ids)} gives no usable "
            f"device node, visibility variable, device-list mount or CDI device{detail}; refused (docs/nri.md)",
            reason=REFUSED_DEVICES_UNKNOWN,
        )
    return replace(vendor, devices=devices), skipped


def _holder_bundle(
    resource: str,
    ids: tuple[str, ...],
    target: ContainerInfo,
    view: RuntimeView,
    holders: Mapping[str, Holder],
    *,
    device_list_dirs: tuple[str, ...],
) -> tuple[Bundle, tuple[str, ...], list[str]]:
    """The lent GPUs' part of the bundles of the containers kubelet allocated them to."""
    groups: dict[Holder, list[str]] = {}
    for rid in ids:
        holder = holders.get(rid)
        if holder is None:
            raise InstructionRefused(
                f"gpushare: kubelet lists no container on this node holding {resource} {rid}, and the vendor device "
                "plugin did not resolve it, so its device nodes are unknown; the owner's container must be "
                "running on this node (design §5)",
                reason=REFUSED_DEVICES_UNKNOWN,
            )
        groups.setdefault(holder, []).append(rid)
    bundle = Bundle()
    skipped: list[str] = []
    env: dict[str, list[str]] = {}  # variable -> the lent IDs it names, over every holder
    for holder, lent in groups.items():
        record = view.container_of(holder.namespace, holder.pod, holder.container)
        if record is None or record.container_id == target.id or record.is_recipient:
            raise InstructionRefused(
                f"gpushare: container {holder.ref}, which kubelet allocated {resource} {lent} to, is not a created "
                f"container on this node holding them yet; {RETRY_HINT}",
                reason=REFUSED_NOT_READY,
            )
        devices, skip = usable_devices(record.bundle.devices)
        nodes = gpu_nodes(resource, lent, holder.ids, devices, holder.ref)
        bundle = bundle.merged(_lent_part(record, holder, lent, nodes, device_list_dirs))
        for name in _naming_allocation(record.bundle.env, holder.ids):
            env.setdefault(name, []).extend(lent)
        skipped.extend(skip)
    lent_env = tuple((name, ",".join(sorted(rids, key=ids.index))) for name, rids in env.items())
    return bundle.merged(Bundle((), lent_env)), tuple(skipped), [h.ref for h in groups]


def _naming_allocation(env: tuple[tuple[str, str], ...], allocated: frozenset[str]) -> list[str]:
    """The holder's visibility variables that name exactly what kubelet allocated it. The borrower
    gets them naming only the lent IDs; any other value (the tenant's own, another ID set) is not
    carried."""
    return [name for name, value in env if frozenset(p.strip() for p in value.split(",")) == allocated]


def _lent_part(
    record: SourceRecord,
    holder: Holder,
    lent: list[str],
    nodes: tuple[DeviceNode, ...],
    device_list_dirs: tuple[str, ...],
) -> Bundle:
    """The lent GPUs' share of the holder's part besides the variables.

    Its device-list mounts (under ``device_list_dirs``) name one GPU each by the file name: only
    those naming a lent GPU travel. Any other entry there (``all``, another GPU, a name the owner's
    tenant chose) never does: the holder is another tenant's container, and the runtime would give
    the borrower whatever such an entry names. Its CDI names and annotations name the holder's
    whole allocation, so they travel only when all of it is lent. Its other mounts and hooks come
    from CDI specs and are the driver's (libraries, ld cache, symlinks), the same for every GPU of
    the node: they travel whole."""
    whole = frozenset(lent) == holder.ids
    lent_names = frozenset(lent)
    part = record.bundle
    mounts = tuple(
        m
        for m in part.mounts
        if posixpath.basename(m.destination) in lent_names
        if _under(m.destination, device_list_dirs)
    ) + tuple(m for m in part.mounts if not _under(m.destination, device_list_dirs))
    return Bundle(
        devices=nodes,
        annotations=part.annotations if whole else (),
        mounts=mounts,
        hooks=part.hooks,
        cdi_devices=part.cdi_devices if whole else (),
    )


def _under(path: str, dirs: tuple[str, ...]) -> bool:
    return any(path.startswith(d.rstrip("/") + "/") for d in dirs)
