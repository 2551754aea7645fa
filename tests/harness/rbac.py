"""The agent's RBAC as data, and the API calls it makes, reduced to the same terms.

A call and a grant are both a ``Use``: (verb, API group, resource[/subresource], scope). The
scope is where the call reaches, which is what decides between the ClusterRole and the Role:

    gpushare-system   a namespaced object in the agent's own namespace (the Role suffices)
    any-namespace     a namespaced object in some other namespace (needs the ClusterRole)
    cluster-wide      a collection across all namespaces, or a cluster-scoped object

``compare`` checks both ways: every call is granted, and every grant is needed at its scope (a
ClusterRole verb used only in gpushare-system belongs in the Role).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import yaml

from localcluster.paths import REPO

NAMESPACE = "gpushare-system"
AGENT = "gpushare-agent"
RBAC_MANIFEST = REPO / "manifests" / "20-rbac.yaml"
Scope = Literal["gpushare-system", "any-namespace", "cluster-wide"]
# The cluster-scoped resources the agent could name; every other resource is namespaced.
CLUSTER_SCOPED = {("", "namespaces"), ("", "nodes")}


@dataclass(frozen=True, order=True)
class Use:
    verb: str
    group: str
    resource: str  # "pods", or "pods/status" for a subresource
    scope: Scope

    def __str__(self) -> str:
        group = self.group or "core"
        return f"{self.verb} {group}/{self.resource} ({self.scope})"


def scope_of(group: str, resource: str, namespace: str) -> Scope:
    if (group, resource.split("/", maxsplit=1)[0]) in CLUSTER_SCOPED or not namespace:
        return "cluster-wide"
    return "gpushare-system" if namespace == NAMESPACE else "any-namespace"


@dataclass(frozen=True)
class Grants:
    """What the ClusterRole grants everywhere, and what the Role grants in gpushare-system."""

    cluster: frozenset[tuple[str, str, str]]  # (verb, group, resource)
    namespaced: frozenset[tuple[str, str, str]]

    def allows(self, use: Use) -> bool:
        key = (use.verb, use.group, use.resource)
        return key in self.cluster or (use.scope == "gpushare-system" and key in self.namespaced)


def _expand(rules: Sequence[Mapping[str, Any]], where: str, names: bool = False) -> frozenset[tuple[str, str, str]]:
    """``names``: a rule narrowed to resourceNames counts as its verbs on that resource (the caller
    checks the names themselves)."""
    out: set[tuple[str, str, str]] = set()
    for rule in rules:
        # A rule narrowed to names, or a wildcard, would need more than this reduction can say.
        if (rule.get("resourceNames") and not names) or rule.get("nonResourceURLs"):
            raise AssertionError(f"{where}: a rule with resourceNames/nonResourceURLs is not modelled: {rule}")
        for field in ("apiGroups", "resources", "verbs"):
            if "*" in rule.get(field, []):
                raise AssertionError(f"{where}: a wildcard in {field} grants more than any call can show: {rule}")
        out |= {(v, g, r) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    return frozenset(out)


def grants_from(docs: Iterable[Mapping[str, Any]], account: str = AGENT, *, names: bool = False) -> Grants:
    """``account``'s ClusterRole and Role (each named as the account), checked to be bound to it."""
    by_kind = {(d["kind"], d["metadata"]["name"]): d for d in docs if d}
    subject = {"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}
    for binding, role in (("ClusterRoleBinding", "ClusterRole"), ("RoleBinding", "Role")):
        bound = by_kind[(binding, account)]
        assert bound["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": role, "name": account}, bound
        assert bound["subjects"] == [subject], bound
    role_doc = by_kind[("Role", account)]
    assert role_doc["metadata"]["namespace"] == NAMESPACE, role_doc["metadata"]
    return Grants(
        _expand(by_kind[("ClusterRole", account)]["rules"], "ClusterRole", names),
        _expand(role_doc["rules"], "Role", names),
    )


def manifest_grants(path: Path = RBAC_MANIFEST) -> Grants:
    return grants_from(yaml.safe_load_all(path.read_text()))


def uses_from_audit(lines: Iterable[str], user: str, since: datetime) -> tuple[set[Use], list[str]]:
    """The uses of ``user``'s requests received at ``since`` or later, and what could not be
    reduced to one: requests without a resource (discovery, /version) and requests the RBAC
    authorizer refused (an admission policy's refusal is the policy's business, not RBAC's).

    ``since`` keeps out what came before this install of the agent: other tiers on the same
    cluster install and uninstall it too, and some send requests with its token themselves.
    """
    uses: set[Use] = set()
    odd: list[str] = []
    for line in lines:
        if not line.strip():
            continue
        entry = json.loads(line)
        if (entry.get("user") or {}).get("username") != user:
            continue
        if datetime.fromisoformat(entry["requestReceivedTimestamp"]) < since:
            continue
        ref = entry.get("objectRef")
        if not ref or not ref.get("resource"):
            odd.append(f"{entry.get('verb')} {entry.get('requestURI')} (not a resource)")
            continue
        resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        group = ref.get("apiGroup", "")
        uses.add(Use(entry["verb"], group, resource, scope_of(group, resource, ref.get("namespace", ""))))
        if (entry.get("annotations") or {}).get("authorization.k8s.io/decision") == "forbid":
            odd.append(f"{entry['verb']} {entry.get('requestURI')} was refused by RBAC")
    return uses, odd


@dataclass(frozen=True)
class Verdict:
    not_granted: list[Use]
    cluster_unused: list[tuple[str, str, str]]  # ClusterRole verbs never used outside gpushare-system
    role_unused: list[tuple[str, str, str]]  # Role verbs never used, or already in the ClusterRole

    @property
    def exact(self) -> bool:
        return not (self.not_granted or self.cluster_unused or self.role_unused)

    def explain(self) -> str:
        lines = [f"used, not granted: {u}" for u in self.not_granted]
        for v, g, r in self.cluster_unused:
            lines.append(f"ClusterRole grants {v} {g or 'core'}/{r}: never used outside {NAMESPACE}")
        for v, g, r in self.role_unused:
            lines.append(f"Role grants {v} {g or 'core'}/{r}: never used (or the ClusterRole has it)")
        return "\n".join(lines)


def compare(grants: Grants, uses: Iterable[Use], rare: Iterable[Use] = ()) -> Verdict:
    """``rare``: uses the run cannot show, counted as seen (each must be granted, too)."""
    seen = set(uses) | set(rare)
    outside = {(u.verb, u.group, u.resource) for u in seen if u.scope != "gpushare-system"}
    inside = {(u.verb, u.group, u.resource) for u in seen if u.scope == "gpushare-system"}
    return Verdict(
        not_granted=sorted(u for u in seen if not grants.allows(u)),
        cluster_unused=sorted(grants.cluster - outside),
        role_unused=sorted(g for g in grants.namespaced if g not in inside or g in grants.cluster),
    )


__all__ = [
    "CLUSTER_SCOPED",
    "NAMESPACE",
    "RBAC_MANIFEST",
    "Grants",
    "Use",
    "Verdict",
    "compare",
    "grants_from",
    "manifest_grants",
    "scope_of",
    "uses_from_audit",
]
