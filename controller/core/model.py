"""The design's pod roles and the snapshot one reconcile pass decides from.

Built on ``controller.core.pod_facts`` (what every pod has):

    Pool / ShareKey                             the unit of shadow demand (``controller.core.share_key``, re-exported)
    ShadowPod / SharePod / SpotPod              the design's roles (design §3, §6)
    RefusedPod                                  a pod whose mix of GPU requests gpushare refuses (design §8)
    Owner                                       a container holding a real GPU (design §6)
    PodResourcesEntry                           one kubelet PodResources row (k8s.io/kubelet pkg/apis/podresources/v1)
    users / owner annotation codecs             the mapping records (``controller.core.records``, re-exported)
    Snapshot / build_snapshot                   everything one reconcile pass decides from

A pod that cannot be read is not an error of the whole pass: ``build_snapshot`` skips it
and lists the problem (the loop logs it), so one odd object never stops reconciling.
Pure module: stdlib and ``gpushare`` only (docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter
from typing import Any, NamedTuple

from controller.core.container_facts import CONTAINER_INIT, SMALL_NUMBERS
from controller.core.pod_facts import (
    PHASE_RUNNING,
    PodFacts,
    PodKey,
    PodProblem,
    PodRef,
    ReadCache,
    is_vendor_resource,
    parse_pod,
    problem_of,
)
from controller.core.pod_memo import PodMemo
from controller.core.records import (
    encode_owner_annotation,
    encode_users_annotation,
    parse_owner_annotation,
    parse_users_annotation,
)
from controller.core.share_key import Pool, ShareKey, ShareKeys, share_key
from controller.errors import InvalidObject
from gpushare import keys, rules
from gpushare.config import Config

_SHARE_PREFIXES = (keys.RESOURCE_SHARE_GPU_PREFIX, keys.RESOURCE_SHARE_DEV_GPU_PREFIX)


def _share_request(facts: PodFacts) -> tuple[str, int, int] | None:
    """(kind, N, quantity) of the one share resource a pod asks for, or None.

    The quantity is the sum over its containers: app containers and sidecars run side by side.
    An init container that is not a sidecar never asks for slots here: such a pod is refused
    (``rules.refused_mix``), since kubelet does not report what it holds.
    """
    found: dict[tuple[str, int], int] = {}
    for c in facts.containers:
        for resource, qty in c.resources:
            if not resource.startswith(_SHARE_PREFIXES):
                continue  # parse_share_resource's answer, without the call
            parsed = keys.parse_share_resource(resource)
            if parsed is not None and qty > 0:
                if qty > parsed[1]:
                    # Every slot of one container comes from one shadow (the share plugin refuses
                    # slots of two), so this can never be served: no shadow is made for it.
                    raise InvalidObject(
                        f"gpushare: pod {facts.ref} container {c.name} asks for {qty} slots of {resource}; one "
                        f"container's slots all come from one shadow, which has {parsed[1]}: ask for at most that",
                        field="resources",
                    )
                found[parsed] = found.get(parsed, 0) + qty
    if not found:
        return None
    if len(found) > 1:
        names = sorted(keys.share_resource(k, n) for k, n in found)
        raise InvalidObject(
            f"gpushare: pod {facts.ref} asks for several share resources {names}; a sharer uses exactly one share spec",
            field="resources",
        )
    ((kind, spec), qty) = next(iter(found.items()))
    return kind, spec, qty


_SHARE_KINDS = frozenset({keys.KIND_SHARE, keys.KIND_SHARE_DEV})

# The roles are named tuples, not frozen dataclasses, for the reason PodFacts is one: the leader
# builds one for most pods it reads, and a frozen dataclass's __init__ sets each field through
# object.__setattr__. tuple.__new__ builds one without even the generated __new__'s Python frame.
_new = tuple.__new__


class ShadowPod(NamedTuple):
    """A platform pod holding one real GPU for up to N sharers (design §3)."""

    facts: PodFacts
    key: ShareKey
    users: Mapping[str, tuple[str, ...]]  # from ANNOTATION_SHADOW_USERS: "<ns>/<pod>/<container>" -> virtual IDs

    @property
    def ref(self) -> PodRef:
        return self.facts.ref

    @property
    def node_name(self) -> str:
        return self.facts.node_name

    @property
    def is_running(self) -> bool:
        """Holds its GPU now: Running on a node and not being deleted."""
        return self.facts.phase == PHASE_RUNNING and self.facts.is_alive and bool(self.facts.node_name)

    @property
    def used_slots(self) -> int:
        used: set[str] = set()
        for ids in self.users.values():  # the leader asks this of every shadow on each pass
            used.update(ids)
        return len(used)

    @classmethod
    def from_facts(cls, facts: PodFacts, share_keys: ShareKeys | None = None) -> ShadowPod:
        """``share_keys``: the keys met so far in this snapshot, so equal keys are one object."""
        labels = facts.labels
        kind = labels.get(keys.LABEL_SHARE_KIND, "")
        spec_text = labels.get(keys.LABEL_SHARE_SPEC, "")
        spec = SMALL_NUMBERS.get(spec_text)
        if spec is None:
            # isascii and isdecimal, not isdigit: int() refuses digits such as "²" and reads "٣" as 3.
            spec = int(spec_text) if spec_text.isascii() and spec_text.isdecimal() and len(spec_text) <= 4 else 0
        if kind not in _SHARE_KINDS or spec < 1:
            raise InvalidObject(
                f"gpushare: shadow {facts.ref} has share-kind {kind!r:.40} and share-spec {spec_text!r:.40}; "
                "both labels are required (design §3)",
                field="metadata.labels",
            )
        real: set[str] = set()
        for c in facts.containers:  # a loop, not a comprehension: this runs for every shadow read
            for r, _ in c.resources:
                if is_vendor_resource(r):
                    real.add(r)
        if len(real) != 1:
            raise InvalidObject(
                f"gpushare: shadow {facts.ref} requests real resources {sorted(real)}; a shadow requests exactly one "
                "real GPU",
                field="resources",
            )
        (resource,) = real
        users = facts.annotations.get(keys.ANNOTATION_SHADOW_USERS)
        key = share_key(resource, facts.node_selector, kind, spec, share_keys)
        return _new(cls, (facts, key, parse_users_annotation(users) if users else {}))


class SharePod(NamedTuple):
    """A tenant pod asking for ``gpushare/share-*`` slots."""

    facts: PodFacts
    key: ShareKey
    quantity: int  # slots asked for, all containers together
    owner_shadows: Mapping[str, str]  # from ANNOTATION_SHADOW_OWNER: "<ns>/<shadow>" -> shadow uid

    @property
    def ref(self) -> PodRef:
        return self.facts.ref

    @property
    def node_name(self) -> str:
        return self.facts.node_name

    @property
    def is_pending(self) -> bool:
        """Waiting for a slot: unscheduled, not gated, not being deleted (docs/controller.md)."""
        facts = self.facts
        return facts.is_unscheduled and not facts.is_gated and not facts.is_terminating

    @property
    def holds_slots(self) -> bool:
        """Bound to a node and not finished: the scheduler counts its request there."""
        return bool(self.facts.node_name) and not self.facts.is_terminal

    @classmethod
    def from_facts(
        cls, facts: PodFacts, default_pool_resource: str, share_keys: ShareKeys | None = None
    ) -> SharePod | None:
        """None for a pod that asks for no share resource; ``share_keys`` as in ``ShadowPod.from_facts``."""
        request = _share_request(facts)
        if request is None:
            return None
        kind, spec, qty = request
        resource = facts.annotations.get(keys.ANNOTATION_POOL_RESOURCE, default_pool_resource)
        owner = facts.annotations.get(keys.ANNOTATION_SHADOW_OWNER)
        key = share_key(resource, facts.node_selector, kind, spec, share_keys)
        return _new(cls, (facts, key, qty, parse_owner_annotation(owner) if owner else {}))


class RefusedPod(NamedTuple):
    """A pod whose mix of GPU requests gpushare refuses (``gpushare.rules.refused_mix``).

    It is neither a sharer nor a borrower: no shadow is made for it and it is lent nothing. Its
    facts stay in the snapshot, so whatever kubelet gave it still counts as held (its slots keep
    their shadows, its spot devices are reclaimed with the rest) until the agent has stopped it.
    """

    facts: PodFacts
    why: str  # the rule's message, in the admission policy's words

    @property
    def ref(self) -> PodRef:
        return self.facts.ref

    @property
    def node_name(self) -> str:
        return self.facts.node_name


def refusal_of(facts: PodFacts, real_resources: Collection[str]) -> str | None:
    """``rules.refused_mix`` of a pod as read; None when its mix of requests may run."""
    containers = facts.containers
    if not any(c.resources for c in containers):
        return None  # most pods ask for no device at all: nothing to mix
    asks = [(c.name, [r for r, _ in c.resources]) for c in containers]
    inits = [c.name for c in containers if c.kind == CONTAINER_INIT]
    return rules.refused_mix(facts.ref.key, asks, facts.annotations, real_resources, inits)


class SpotPod(NamedTuple):
    """A pod asking for ``gpushare/spot-gpu``: a borrower once admitted (design §6)."""

    facts: PodFacts

    @property
    def ref(self) -> PodRef:
        return self.facts.ref

    @property
    def node_name(self) -> str:
        return self.facts.node_name

    @property
    def container_ids(self) -> tuple[str, ...]:
        return tuple(c.container_id for c in self.facts.containers if c.container_id)


@dataclass(frozen=True)
class Owner:
    """A container holding real GPUs (from PodResources), and whether it lends them (design §6)."""

    ref: PodRef
    container: str
    resource: str
    real_ids: tuple[str, ...]
    is_lendable: bool
    is_running: bool
    pidns: int | None  # pid-namespace inode of the container's first process; None if unknown

    @property
    def container_key(self) -> str:
        return f"{self.ref.key}/{self.container}"


@dataclass(frozen=True)
class PodResourcesEntry:
    """One container's devices of one resource, as kubelet's PodResources ``List`` reports them."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_ids: tuple[str, ...]

    @property
    def pod_key(self) -> PodKey:
        return f"{self.namespace}/{self.pod}"


def is_shadow(facts: PodFacts) -> bool:
    return rules.is_shadow(facts.ref.namespace, facts.labels)


@dataclass(frozen=True)
class Snapshot:
    """Everything one reconcile pass decides from. Built by the loop from its caches.

    ``shadow_list_fresh`` and ``deleted_shadows`` say how far the shadow list can be
    trusted for *absence*: a shadow missing from the cache counts as gone only when the
    cache was filled by a full LIST since the last pass, or a watch reported its deletion.
    """

    node_name: str
    pods: Mapping[PodKey, PodFacts]
    shadows: tuple[ShadowPod, ...]
    sharers: tuple[SharePod, ...]
    spot_pods: tuple[SpotPod, ...]
    refused: tuple[RefusedPod, ...] = ()
    pod_resources: tuple[PodResourcesEntry, ...] = ()
    # Real resource -> real IDs this node's kubelet can allocate (GetAllocatableResources).
    allocatable: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    lendable_namespaces: frozenset[str] = frozenset()
    # Runtime container ID -> pid-namespace inode of its first process (read from /proc).
    pidns_by_container: Mapping[str, int] = field(default_factory=dict)
    shadow_list_fresh: bool = False
    # Shadows a watch reported DELETED; the loop keeps them until its next full LIST.
    deleted_shadows: frozenset[PodRef] = frozenset()
    problems: tuple[str, ...] = ()  # the messages of ``pod_problems``
    pod_problems: tuple[PodProblem, ...] = ()
    # Real ID -> why it is Unhealthy (kubelet lists it no more as allocatable).
    vendor_unhealthy: Mapping[str, str] = field(default_factory=dict)
    # Shadow ("ns/name") -> the character devices its running main container has (docs/nvidia.md);
    # a shadow not in it has not been seen running by this agent.
    shadow_device_nodes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # Shadows whose main container the NRI plugin holds (created) before kubelet reports it
    # (PLEG's relist lags the start by up to a second): a sharer can take its GPU from it now.
    shadows_created: frozenset[str] = frozenset()

    def shadows_on(self, node: str) -> list[ShadowPod]:
        return [s for s in self.shadows if s.node_name == node]

    def sharers_on(self, node: str) -> list[SharePod]:
        return [s for s in self.sharers if s.node_name == node]

    def refused_on(self, node: str) -> list[RefusedPod]:
        return [p for p in self.refused if p.node_name == node]


# What one pod reads as: its facts and role (None for a pod in no role), or the problem.
_Read = tuple[PodFacts, ShadowPod | SharePod | SpotPod | RefusedPod | None] | tuple[PodProblem, None]


# A build_snapshot caller's reads from its previous snapshot, for ``build_snapshot(memo=...)``.
SnapshotMemo = PodMemo[_Read]


def _read_pod(
    raw: Mapping[str, Any], real_resources: tuple[str, ...], share_keys: ShareKeys, cache: ReadCache
) -> _Read:
    try:
        facts = parse_pod(raw, cache)
        if is_shadow(facts):
            return facts, ShadowPod.from_facts(facts, share_keys)
        why = refusal_of(facts, real_resources)
        if why is not None:
            return facts, RefusedPod(facts, why)
        sharer = SharePod.from_facts(facts, real_resources[0], share_keys)
        if sharer is not None:
            return facts, sharer
        return facts, SpotPod(facts) if facts.quantity(keys.RESOURCE_SPOT_GPU) > 0 else None
    except InvalidObject as exc:
        return problem_of(raw, exc), None
    except Exception as exc:
        # One pod is the unit of isolation here, as a thread loop is elsewhere: every field is the
        # tenant's (docs/security.md), and whatever a value does to a reader costs that pod only.
        return problem_of(raw, exc), None


# A role's ``PodRef``, read in C: a PodRef is a tuple, so sorting compares refs in C.
_by_ref = attrgetter("facts.ref")


def build_snapshot(
    pods: Iterable[Mapping[str, Any]],
    cfg: Config,
    *,
    pod_resources: Iterable[PodResourcesEntry] = (),
    allocatable: Mapping[str, Iterable[str]] | None = None,
    lendable_namespaces: Iterable[str] = (),
    pidns_by_container: Mapping[str, int] | None = None,
    shadow_list_fresh: bool = False,
    deleted_shadows: Iterable[PodRef] = (),
    memo: SnapshotMemo | None = None,
) -> Snapshot:
    """Classify every pod once; a pod that cannot be read is skipped and listed in ``problems``.

    ``memo``: the caller's reads from its previous snapshot; pods whose uid and
    resourceVersion it has seen are not read again (``controller.core.pod_memo``).
    """
    real_resources = tuple(cfg.real_resources)
    share_keys: ShareKeys = {}
    cache = ReadCache()

    reads: Iterable[_Read]
    if memo is not None:
        reads = memo.read_all(pods, lambda raw: _read_pod(raw, real_resources, share_keys, cache), real_resources)
    else:
        # map, not a list: each read is taken apart as it comes, so the pass never holds them all
        # (fewer objects for the collector to walk while it reads) and no Python loop calls it.
        reads = map(_read_pod, pods, repeat(real_resources), repeat(share_keys), repeat(cache))
    by_key: dict[PodKey, PodFacts] = {}
    shadows: list[ShadowPod] = []
    sharers: list[SharePod] = []
    spot: list[SpotPod] = []
    refused: list[RefusedPod] = []
    problems: list[PodProblem] = []
    for facts, role in reads:
        if isinstance(facts, PodProblem):
            problems.append(facts)
            continue
        if type(role) is ShadowPod:  # type(), not isinstance: the roles are never subclassed
            shadows.append(role)
        elif type(role) is SharePod:
            sharers.append(role)
        elif type(role) is SpotPod:
            spot.append(role)
        elif type(role) is RefusedPod:
            refused.append(role)
        ref = facts.ref
        by_key[f"{ref.namespace}/{ref.name}"] = facts  # ref.key, without a call per pod
    return Snapshot(
        node_name=cfg.node_name,
        pods=by_key,
        shadows=tuple(sorted(shadows, key=_by_ref)),
        sharers=tuple(sorted(sharers, key=_by_ref)),
        spot_pods=tuple(sorted(spot, key=_by_ref)),
        refused=tuple(sorted(refused, key=_by_ref)),
        pod_resources=tuple(pod_resources),
        allocatable={r: tuple(ids) for r, ids in (allocatable or {}).items()},
        lendable_namespaces=frozenset(lendable_namespaces),
        pidns_by_container=dict(pidns_by_container or {}),
        shadow_list_fresh=shadow_list_fresh,
        deleted_shadows=frozenset(deleted_shadows),
        problems=tuple(p.message for p in problems),
        pod_problems=tuple(problems),
    )


__all__ = [
    "Owner",
    "PodResourcesEntry",
    "Pool",
    "RefusedPod",
    "ShadowPod",
    "ShareKey",
    "SharePod",
    "Snapshot",
    "SnapshotMemo",
    "SpotPod",
    "build_snapshot",
    "encode_owner_annotation",
    "encode_users_annotation",
    "is_shadow",
    "parse_owner_annotation",
    "parse_users_annotation",
    "refusal_of",
]
