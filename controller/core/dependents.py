"""Which pods still depend on gpushare: what an uninstall must not strand.

A sharer's GPU is held by its shadow, and a borrower runs on an owner's GPU only while the agent
can take it back. Remove gpushare under them and a sharer keeps its device nodes while nothing
holds the GPU (kubelet may give it to the next pod), and a borrower stays when the owner
returns. A pod holding a claim of gpushare's DRA driver keeps a device whose claim can no
longer be unprepared. So an uninstall first lists these pods (``gpushare uninstall prepare``),
and refuses or evicts them before the agents and shadows go (docs/install.md, "Uninstall").

Owners and Docker-in-Docker targets are not here: kubelet gave the GPU to the owner's own pod
(or to the source container of a DinD pod), and it stays theirs.

Pure module: plain API objects in, plain rows out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from controller.core.pod_facts import PodFacts, PodRef, parse_pod
from controller.errors import InvalidObject
from gpushare import keys, rules

__all__ = ["DRA_DRIVER", "Dependent", "dependents"]

# gpushare's DRA driver name (draplugin publishes under it).
DRA_DRIVER = keys.DOMAIN

WHY_SHARER = "shares a GPU through a shadow pod"
WHY_BORROWER = "borrows an idle owner's GPU (spot)"
WHY_CLAIM = "holds a GPU claim of gpushare's DRA driver"
WHY_UNREADABLE = "cannot be read, so it may hold a gpushare device"


class Dependent(NamedTuple):
    ref: PodRef
    node: str
    why: str

    def __str__(self) -> str:
        where = f" on {self.node}" if self.node else ""
        return f"{self.ref.namespace}/{self.ref.name}{where}: {self.why}"


def _why(facts: PodFacts) -> str | None:
    resources = facts.resources()
    if keys.RESOURCE_SPOT_GPU in resources:
        return WHY_BORROWER
    if any(rules.is_gpushare_resource(r) for r in resources):
        return WHY_SHARER
    return None


def _claim_pods(claims: Iterable[Mapping[str, Any]]) -> set[tuple[str, str]]:
    """(namespace, pod uid) of every pod a claim allocated by gpushare's driver is reserved for."""
    held: set[tuple[str, str]] = set()
    for claim in claims:
        status = claim.get("status") or {}
        results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
        if not any(isinstance(r, Mapping) and r.get("driver") == DRA_DRIVER for r in results):
            continue
        namespace = str((claim.get("metadata") or {}).get("namespace") or "")
        for consumer in status.get("reservedFor") or []:
            if isinstance(consumer, Mapping) and consumer.get("resource") == "pods" and consumer.get("uid"):
                held.add((namespace, str(consumer["uid"])))
    return held


def dependents(pods: Iterable[Mapping[str, Any]], claims: Iterable[Mapping[str, Any]] = ()) -> list[Dependent]:
    """The live pods an uninstall would strand, sorted by namespace and name.

    A pod that cannot be parsed is listed too: an uninstall that cannot tell must not go on.
    Shadows are not dependents; they are what the uninstall removes last.
    """
    by_claim = _claim_pods(claims)
    found: list[Dependent] = []
    for pod in pods:
        try:
            facts = parse_pod(pod)
        except InvalidObject:
            meta = pod.get("metadata") or {}
            ref = PodRef(str(meta.get("namespace") or ""), str(meta.get("name") or "?"), str(meta.get("uid") or ""))
            found.append(Dependent(ref, str((pod.get("spec") or {}).get("nodeName") or ""), WHY_UNREADABLE))
            continue
        if not facts.is_alive or rules.is_shadow(facts.ref.namespace, facts.labels):
            continue
        why = _why(facts)
        if why is None and (facts.ref.namespace, facts.ref.uid) in by_claim:
            why = WHY_CLAIM
        if why is not None:
            found.append(Dependent(facts.ref, facts.node_name, why))
    return sorted(found, key=lambda d: (d.ref.namespace, d.ref.name))
