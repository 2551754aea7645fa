"""Who uses which virtual device of which shadow, who holds (owns) and who borrows which real GPU.

The mapping is never stored as truth (design §9): ``MappingCache.rebuild`` derives it,
every pass and after any restart, from kubelet's PodResources rows and the pods alone,
so the same inputs always give the same mapping. The annotations it asks the loop to
write (users on the shadow, the owner on the sharer, design §3 via ``gpushare.keys``)
are records for people, ``gpushare status`` and the leader's slot count — not inputs
to this rebuild.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from controller.core.actions import AnnotatePod
from controller.core.model import (
    Owner,
    PodResourcesEntry,
    ShadowPod,
    SharePod,
    Snapshot,
    encode_owner_annotation,
    encode_users_annotation,
    is_shadow,
)
from controller.core.pod_facts import PHASE_RUNNING, PodFacts, PodKey, PodRef
from gpushare import keys
from gpushare.ids import parse_spot_id, parse_virtual_id_or_none


@dataclass(frozen=True, order=True)
class Holding:
    """One sharer container's virtual IDs of one shadow."""

    shadow_key: str  # "<ns>/<shadow name>"
    sharer: PodRef
    container: str
    resource: str
    virtual_ids: tuple[str, ...]

    @property
    def user(self) -> str:
        return f"{self.sharer.key}/{self.container}"


@dataclass(frozen=True, order=True)
class Borrowing:
    """One spot container holding ``spot-<real_id>`` (design §6, stolen)."""

    real_id: str
    borrower: PodRef
    container: str


@dataclass(frozen=True, order=True)
class RealHolding:
    """One container holding real GPUs of a vendor resource (an owner or a shadow)."""

    pod: PodRef
    container: str
    resource: str
    real_ids: tuple[str, ...]


@dataclass(frozen=True)
class MappingCache:
    holdings: tuple[Holding, ...] = ()
    borrowings: tuple[Borrowing, ...] = ()
    real: tuple[RealHolding, ...] = ()
    # Real IDs kubelet reports held by a pod missing from the pod cache: unknown, not free.
    unresolved_real: frozenset[str] = frozenset()
    # PodResources rows naming IDs we cannot read; listed so the loop can log them once.
    problems: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def rebuild(
        cls,
        entries: Iterable[PodResourcesEntry],
        pods: Mapping[PodKey, PodFacts],
        real_resources: Iterable[str],
    ) -> MappingCache:
        """Derive the mapping from PodResources rows, keeping only pods that exist and are not finished.

        A row whose pod is missing from ``pods`` is ignored rather than guessed at: kubelet
        frees devices lazily, and a pod we cannot name by uid is one we must not act on.
        """
        real_set = frozenset(real_resources)
        holdings: list[Holding] = []
        borrowings: list[Borrowing] = []
        real: list[RealHolding] = []
        problems: list[str] = []
        unresolved: set[str] = set()
        for e in entries:
            facts = pods.get(e.pod_key)
            if facts is None and e.resource in real_set:
                unresolved.update(e.device_ids)
            if facts is None or facts.is_terminal or not e.device_ids:
                continue
            if keys.parse_share_resource(e.resource) is not None:
                by_shadow: dict[str, list[str]] = {}
                for vid in e.device_ids:
                    parsed = parse_virtual_id_or_none(vid)
                    if parsed is None:
                        problems.append(f"{e.pod_key}/{e.container}: {e.resource} device {vid!r} is not a virtual ID")
                        continue
                    by_shadow.setdefault(parsed.shadow_key, []).append(vid)
                for shadow_key, vids in by_shadow.items():
                    holdings.append(Holding(shadow_key, facts.ref, e.container, e.resource, tuple(sorted(vids))))
            elif e.resource == keys.RESOURCE_SPOT_GPU:
                for dev in e.device_ids:
                    real_id = parse_spot_id(dev)
                    if real_id is not None:
                        borrowings.append(Borrowing(real_id, facts.ref, e.container))
            elif e.resource in real_set:
                real.append(RealHolding(facts.ref, e.container, e.resource, tuple(sorted(e.device_ids))))
        return cls(
            tuple(sorted(holdings)),
            tuple(sorted(borrowings)),
            tuple(sorted(real)),
            frozenset(unresolved),
            tuple(problems),
        )

    def users_of(self, shadow_key: str) -> dict[str, tuple[str, ...]]:
        """``{"<ns>/<pod>/<container>": virtual IDs}`` of one shadow."""
        return {h.user: h.virtual_ids for h in self.holdings if h.shadow_key == shadow_key}

    def shadows_of(self, sharer_key: PodKey) -> frozenset[str]:
        return frozenset(h.shadow_key for h in self.holdings if h.sharer.key == sharer_key)

    def borrowers_of(self, real_id: str) -> tuple[Borrowing, ...]:
        return tuple(b for b in self.borrowings if b.real_id == real_id)

    def holder_of(self, real_id: str) -> RealHolding | None:
        for h in self.real:
            if real_id in h.real_ids:
                return h
        return None

    def owners(self, snapshot: Snapshot, real_resources: Iterable[str]) -> tuple[Owner, ...]:
        """Every non-shadow container holding real GPUs, with its lendable flag and pid namespace (design §6)."""
        wanted = frozenset(real_resources)
        out: list[Owner] = []
        for h in self.real:
            facts = snapshot.pods.get(h.pod.key)
            if facts is None or h.resource not in wanted or is_shadow(facts):
                continue
            container = next((c for c in facts.containers if c.name == h.container), None)
            cid = container.container_id if container else ""
            lendable = (
                facts.labels.get(keys.LABEL_LENDABLE) == "true" or facts.ref.namespace in snapshot.lendable_namespaces
            )
            out.append(
                Owner(
                    ref=facts.ref,
                    container=h.container,
                    resource=h.resource,
                    real_ids=h.real_ids,
                    is_lendable=lendable,
                    is_running=facts.phase == PHASE_RUNNING and facts.is_alive,
                    pidns=snapshot.pidns_by_container.get(cid) if cid else None,
                )
            )
        return tuple(out)

    def record_updates(
        self,
        shadows: Iterable[ShadowPod],
        sharers: Iterable[SharePod],
        bindings: Mapping[tuple[str, str], str] | None = None,
    ) -> list[AnnotatePod]:
        """Annotations to write so the records match the mapping; only those that differ.

        Pass this node's shadows and sharers: each agent writes the records it can vouch for.
        ``bindings``: (sharer uid, shadow ns/name) -> shadow uid, the agent's own
        (controller/share/holdings.py).
        """
        uid_by_key = {s.ref.key: s.ref.uid for s in shadows}
        out: list[AnnotatePod] = []
        for s in shadows:
            if not s.facts.is_alive:
                continue
            users = self.users_of(s.ref.key)
            out += _annotation_update(s.facts, keys.ANNOTATION_SHADOW_USERS, encode_users_annotation(users), users)
        for sharer in sharers:
            if not sharer.facts.is_alive:
                continue
            # The uid comes from the agent's binding, never from the record it replaces: the
            # record sits on the tenant's pod, so what is there now may be the tenant's.
            bound = bindings or {}
            uid = sharer.ref.uid
            owner = {k: bound.get((uid, k)) or uid_by_key.get(k, "") for k in self.shadows_of(sharer.ref.key)}
            out += _annotation_update(sharer.facts, keys.ANNOTATION_SHADOW_OWNER, encode_owner_annotation(owner), owner)
        return out


def _annotation_update(facts: PodFacts, key: str, encoded: str, content: Mapping[str, object]) -> list[AnnotatePod]:
    current = facts.annotations.get(key)
    wanted = encoded if content else None
    if current == wanted:
        return []
    return [AnnotatePod(facts.ref, key, wanted)]


__all__ = ["Borrowing", "Holding", "MappingCache", "RealHolding"]
