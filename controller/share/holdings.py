"""Which shadow, by uid, each sharer on this node holds slots of, and who loses its GPU when it goes.

A virtual ID names its shadow by ``ns/name`` only (design §3), and a later shadow may take the
same name. So the node agent *binds* each holding — a sharer's uid and the shadow's
``ns/name``, both from kubelet's PodResources — to the uid of the shadow alive under that name
when it first saw the holding, and keeps the bindings in its state file (``StateStore``
timers of kind ``sharer-shadow``), where no tenant can write. Cascade eviction
(``plan_cascade``) asks whether *that* shadow is gone.

The sharer's ``shadow-owner`` annotation records the same thing for people, but it sits on
the tenant's pod: it may add a reason to evict that pod, never take one away
(docs/security.md, "Records the agent writes on tenant pods").
Pure module (docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Mapping

from controller.core.actions import REASON_SHADOW_GONE, Evict
from controller.core.mapping import MappingCache
from controller.core.model import ShadowPod, SharePod, Snapshot
from controller.core.pod_facts import PodRef

BindingKey = tuple[str, str]  # (sharer uid, shadow "ns/name")


class ShadowsByKey:
    """The snapshot's shadows and watch-reported deletions by ``ns/name``, indexed once per pass."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.fresh = snapshot.shadow_list_fresh
        self.namesakes: dict[str, list[ShadowPod]] = {}
        for s in snapshot.shadows:
            self.namesakes.setdefault(s.ref.key, []).append(s)
        self.deleted: dict[str, list[PodRef]] = {}
        for d in snapshot.deleted_shadows:
            self.deleted.setdefault(d.key, []).append(d)

    def is_gone(self, shadow_key: str, uid: str | None) -> bool:
        namesakes = self.namesakes.get(shadow_key, [])
        ours = [s for s in namesakes if uid is None or s.ref.uid == uid]
        if ours:
            return not ours[0].facts.is_alive
        if any(uid is None or d.uid == uid for d in self.deleted.get(shadow_key, ())):
            return True
        if namesakes:  # uid known, and the name now belongs to a different pod
            return True
        return self.fresh

    def alive_uid(self, shadow_key: str) -> str | None:
        """The uid of the one shadow alive under this name, if there is exactly one."""
        alive = [s.ref.uid for s in self.namesakes.get(shadow_key, ()) if s.facts.is_alive]
        return alive[0] if len(alive) == 1 else None


def shadow_is_gone(snapshot: Snapshot, shadow_key: str, uid: str | None) -> bool:
    """True only when the API says so: never from mere absence in a cache that may be stale.

    Gone means: the shadow (by uid when known) is being deleted or has finished; or a
    watch reported it deleted; or the name now belongs to another uid; or it is absent
    from a full LIST taken since the last pass (``snapshot.shadow_list_fresh``).
    """
    return ShadowsByKey(snapshot).is_gone(shadow_key, uid)


def bind_holdings(snapshot: Snapshot, mapping: MappingCache, known: Mapping[BindingKey, str]) -> dict[BindingKey, str]:
    """The binding of every holding in ``mapping``: the stored one, else the shadow alive under its name now.

    A holding first seen while no single shadow of its name is alive stays unbound: the
    cascade then asks about the name alone. Bindings of holdings that ended are dropped.
    """
    by_key = ShadowsByKey(snapshot)
    out: dict[BindingKey, str] = {}
    for h in mapping.holdings:
        key = (h.sharer.uid, h.shadow_key)
        uid = known.get(key) or by_key.alive_uid(h.shadow_key)
        if uid:
            out[key] = uid
    return out


def encode_bindings(bindings: Mapping[BindingKey, str], stored: Mapping[str, float], now: float) -> dict[str, float]:
    """Bindings as state-file timers: key ``"<sharer uid> <shadow ns/name> <shadow uid>"``, value when first bound."""
    out: dict[str, float] = {}
    for (sharer_uid, shadow_key), shadow_uid in bindings.items():
        key = f"{sharer_uid} {shadow_key} {shadow_uid}"
        out[key] = stored.get(key, now)
    return out


def decode_bindings(stored: Mapping[str, float]) -> dict[BindingKey, str]:
    """The inverse of ``encode_bindings``; a key of another shape is dropped (uids and names hold no spaces)."""
    out: dict[BindingKey, str] = {}
    for key in stored:
        parts = key.split(" ")
        if len(parts) == 3 and all(parts):
            out[(parts[0], parts[1])] = parts[2]
    return out


def _has_lost(sharer: SharePod, shadow_key: str, bound: str | None, by_key: ShadowsByKey) -> bool:
    """The agent's binding decides; the tenant-writable record may only add a reason."""
    if by_key.is_gone(shadow_key, bound):
        return True
    recorded = sharer.owner_shadows.get(shadow_key)
    return bool(recorded) and recorded != bound and by_key.is_gone(shadow_key, recorded)


def plan_cascade(
    snapshot: Snapshot, mapping: MappingCache, sharers_here: Mapping[str, SharePod], bindings: Mapping[BindingKey, str]
) -> list[Evict]:
    """Evict every sharer on this node holding slots (PodResources) of a shadow that is gone."""
    by_key = ShadowsByKey(snapshot)
    gone_by_sharer: dict[PodRef, list[str]] = {}
    for h in mapping.holdings:
        sharer = sharers_here.get(h.sharer.key)
        if sharer is None or sharer.facts.is_terminating:
            continue
        if _has_lost(sharer, h.shadow_key, bindings.get((sharer.ref.uid, h.shadow_key)), by_key):
            gone_by_sharer.setdefault(sharer.ref, []).append(h.shadow_key)
    out: list[Evict] = []
    for ref, gone in sorted(gone_by_sharer.items()):
        names = ", ".join(sorted(set(gone)))
        message = (
            f"gpushare: shadow pod {names} that held this pod's GPU is gone; evicting so the pod is "
            "recreated on a live shadow (design §3)"
        )
        out.append(Evict(ref, REASON_SHADOW_GONE, message))
    return out


__all__ = [
    "BindingKey",
    "ShadowsByKey",
    "bind_holdings",
    "decode_bindings",
    "encode_bindings",
    "plan_cascade",
    "shadow_is_gone",
]
