"""What ``kubectl gpushare status`` and ``who`` show: plain values built from raw API objects and
the agents' own ``/status`` documents, with no I/O and no clock (``now`` is passed in).

    GpuUse     one container that holds or sees a GPU, and in which role
    NodeRow    one node as the cluster-wide status table shows it

A role is read from the pod itself (the API is enough for that); which real GPU a container
sees is known only to the node's agent (kubelet's PodResources), so without an agent's document
the GPU reads as unknown, never as a guess.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from controller.core.model import is_shadow
from controller.core.pod_facts import PodFacts, parse_pod
from controller.core.roles import ROLE_BORROWER, ROLE_DIND, ROLE_OWNER, ROLE_SHADOW, ROLE_SHARER, ROLES
from controller.errors import InvalidObject
from gpushare import keys
from gpushare.rules import is_gpushare_resource, is_vendor_resource

# The DaemonSet's pods carry this label (manifests/chart/templates/40-daemonset.yaml).
AGENT_LABEL = "app.kubernetes.io/name=gpushare"


@dataclass(frozen=True)
class GpuUse:
    node: str
    pod: str  # ns/name
    container: str
    role: str  # one of ROLES
    gpu: tuple[str, ...]  # real IDs; () while unknown
    via: str  # the shadow of a sharer, the source container of a DinD target, the owner a borrower borrows from
    phase: str
    resource: str  # what the container asked for (the source's resource for a DinD target)


@dataclass(frozen=True)
class NodeRow:
    node: str
    agent_pod: str  # "" when no agent pod runs on the node
    agent_ready: bool | None
    restarts: int
    leader: bool
    nri: bool | None  # None: unknown (no agent document)
    gpus: int  # the vendor's GPUs the Node offers
    shadows: int
    sharers: int
    borrowers: int
    advertised: Mapping[str, int] = field(default_factory=dict)  # gpushare resources the Node offers
    spot: Mapping[str, int] = field(default_factory=dict)  # spot state -> GPUs, from the agent
    last_pass_age_s: float | None = None
    source: str = "api"  # "agent" when the agent's /status was read
    problems: tuple[str, ...] = ()


def _parse_all(pods: Iterable[Mapping[str, Any]]) -> list[PodFacts]:
    out: list[PodFacts] = []
    for raw in pods:
        try:
            out.append(parse_pod(raw))
        except InvalidObject:
            continue  # a pod we cannot read holds nothing we could show; the agent reports it
    return out


def _phase(f: PodFacts) -> str:
    return "Terminating" if f.is_terminating else f.phase


def real_resources(pods: Sequence[PodFacts], docs: Mapping[str, Mapping[str, Any]]) -> frozenset[str]:
    """The vendor resources in use: what shadows ask for and what agents count as allocated; any
    vendor resource when neither says."""
    found = {r for f in pods if is_shadow(f) for r in f.resources() if is_vendor_resource(r)}
    for doc in docs.values():
        found |= {r for r in (doc.get("allocated") or {}) if not is_gpushare_resource(r)}
    if found:
        return frozenset(found)
    return frozenset(r for f in pods for r in f.resources() if is_vendor_resource(r))


@dataclass(frozen=True)
class _AgentFacts:
    """What the agents' documents say about GPUs: shadow -> GPU, sharer -> shadows, spot holders."""

    shadow_gpu: Mapping[str, tuple[str, ...]]
    sharer_shadows: Mapping[str, tuple[str, ...]]
    owner_gpu: Mapping[str, tuple[str, ...]]  # ns/pod/container -> real IDs it lends
    borrowed: Mapping[str, tuple[tuple[str, str], ...]]  # ns/pod -> ((real ID, owner container), ...)


def _agent_facts(docs: Mapping[str, Mapping[str, Any]]) -> _AgentFacts:
    shadow_gpu: dict[str, tuple[str, ...]] = {}
    sharer_shadows: dict[str, tuple[str, ...]] = {}
    owner_gpu: dict[str, list[str]] = {}
    borrowed: dict[str, list[tuple[str, str]]] = {}
    for doc in docs.values():
        for s in doc.get("shadows") or ():
            if s.get("gpu"):
                shadow_gpu[str(s["pod"])] = tuple(str(g) for g in s["gpu"])
        for p in doc.get("sharers") or ():
            if p.get("shadows"):
                sharer_shadows[str(p["pod"])] = tuple(str(s) for s in p["shadows"])
        for g in doc.get("spot") or ():
            rid, owner = str(g.get("real_id") or ""), str(g.get("owner") or "")
            if owner:
                owner_gpu.setdefault(owner, []).append(rid)
            for b in g.get("borrowers") or ():
                borrowed.setdefault(str(b), []).append((rid, owner))
    return _AgentFacts(
        shadow_gpu,
        sharer_shadows,
        {k: tuple(sorted(v)) for k, v in owner_gpu.items()},
        {k: tuple(sorted(v)) for k, v in borrowed.items()},
    )


def _owner_shadows(f: PodFacts) -> tuple[str, ...]:
    """The sharer's own record of its shadow (written by the agent): readable without the agent."""
    raw = f.annotations.get(keys.ANNOTATION_SHADOW_OWNER, "")
    if not raw:
        return ()
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):  # the tenant's annotation: deep nesting is theirs to send
        return ()
    return tuple(sorted(str(k) for k in doc)) if isinstance(doc, dict) else ()


def _uses_of(f: PodFacts, real: frozenset[str], agents: _AgentFacts) -> list[GpuUse]:
    """Every container of one pod that holds or sees a GPU, DinD targets last (they need their source)."""
    out: list[GpuUse] = []
    node, phase = f.node_name, _phase(f)
    for c in f.containers:
        for resource, _ in c.resources:
            container_key = f"{f.ref.key}/{c.name}"
            if is_shadow(f) and resource in real:
                out.append(
                    GpuUse(
                        node, f.ref.key, c.name, ROLE_SHADOW, agents.shadow_gpu.get(f.ref.key, ()), "", phase, resource
                    )
                )
            elif keys.parse_share_resource(resource) is not None:
                shadows = agents.sharer_shadows.get(f.ref.key) or _owner_shadows(f)
                gpu = tuple(sorted({g for s in shadows for g in agents.shadow_gpu.get(s, ())}))
                out.append(GpuUse(node, f.ref.key, c.name, ROLE_SHARER, gpu, ",".join(shadows), phase, resource))
            elif resource == keys.RESOURCE_SPOT_GPU:
                lent = agents.borrowed.get(f.ref.key, ())
                owners = ",".join(sorted({o for _, o in lent if o}))
                out.append(
                    GpuUse(node, f.ref.key, c.name, ROLE_BORROWER, tuple(r for r, _ in lent), owners, phase, resource)
                )
            elif resource in real and not is_shadow(f):
                gpu = agents.owner_gpu.get(container_key, ())
                out.append(GpuUse(node, f.ref.key, c.name, ROLE_OWNER, gpu, "", phase, resource))
    by_container = {u.container: u for u in out}
    for target, source in sorted(_dind_targets(f).items()):
        src = by_container.get(source)
        gpu, resource = (src.gpu, src.resource) if src else ((), "")
        out.append(GpuUse(node, f.ref.key, target, ROLE_DIND, gpu, f"{f.ref.key}/{source}", phase, resource))
    return out


def _dind_targets(f: PodFacts) -> dict[str, str]:
    """Target container -> source container, from the tenant's same-pod annotations (design §4.2)."""
    out: dict[str, str] = {}
    for key, value in f.annotations.items():
        if key.startswith(keys.POD_ANNOTATION_DEVICES_FROM_PREFIX):
            target = key[len(keys.POD_ANNOTATION_DEVICES_FROM_PREFIX) :]
            out[target] = value.rsplit("/", 1)[-1]  # "_/_/<source>" and "<source>" name the same container
    return out


def gpu_uses(pods: Iterable[Mapping[str, Any]], docs: Mapping[str, Mapping[str, Any]]) -> list[GpuUse]:
    """Every container that holds or sees a GPU, from the pods and the agents' ``/status`` documents
    (node -> document; a node missing there leaves its GPUs unknown)."""
    facts = _parse_all(pods)
    real = real_resources(facts, docs)
    agents = _agent_facts(docs)
    uses = [u for f in facts if not f.is_terminal for u in _uses_of(f, real, agents)]
    return sorted(uses, key=lambda u: (u.node, ",".join(u.gpu), ROLES.index(u.role), u.pod, u.container))


def uses_of_gpu(uses: Iterable[GpuUse], gpu: str) -> list[GpuUse]:
    """The uses of a GPU named by its real ID, or by a unique prefix of one (a UUID is long)."""
    uses = list(uses)
    ids = {g for u in uses for g in u.gpu}
    if gpu not in ids:
        matches = sorted(g for g in ids if g.lower().startswith(gpu.lower()))
        gpu = matches[0] if len(matches) == 1 else gpu
    return [u for u in uses if gpu in u.gpu]


def uses_of_pod(uses: Iterable[GpuUse], pod: str) -> list[GpuUse]:
    return [u for u in uses if u.pod == pod]


def _agent_problems(doc: Mapping[str, Any]) -> list[str]:
    problems = [str(p) for p in doc.get("problems") or ()]
    if doc.get("error"):
        problems.append(f"PodResources: {doc['error']}")
    blocked = (doc.get("spot_runtime") or {}).get("lending_blocked")
    if blocked:
        problems.append(f"spot lending blocked: {blocked}")
    return problems


def _agent_pod_state(pod: Mapping[str, Any] | None) -> tuple[str, bool | None, int]:
    if pod is None:
        return "", None, 0
    status = pod.get("status") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ())
    restarts = sum(int(c.get("restartCount") or 0) for c in status.get("containerStatuses") or ())
    return str((pod.get("metadata") or {}).get("name", "")), ready, restarts


def node_rows(
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    *,
    agent_pods: Mapping[str, Mapping[str, Any]],
    docs: Mapping[str, Mapping[str, Any]],
    errors: Mapping[str, str],
    leader: str,
    now: float,
) -> list[NodeRow]:
    """One row per node that runs an agent or offers a GPU. ``agent_pods``/``docs``/``errors``: by node
    name, the agent's pod, its ``/status`` document, and why the document could not be read."""
    facts = _parse_all(pods)
    nodes = list(nodes)
    # No shadow and no agent say which resource is the GPU: any vendor resource a node offers is one.
    real = real_resources(facts, docs) or frozenset(
        r for n in nodes for r in ((n.get("status") or {}).get("allocatable") or {}) if is_vendor_resource(r)
    )
    counts: Counter[tuple[str, str]] = Counter()
    for f in facts:
        if f.is_terminal or not f.node_name:
            continue
        rs = f.resources()
        if is_shadow(f):
            counts[(f.node_name, ROLE_SHADOW)] += 1
        elif any(keys.parse_share_resource(r) is not None for r in rs):
            counts[(f.node_name, ROLE_SHARER)] += 1
        elif keys.RESOURCE_SPOT_GPU in rs:
            counts[(f.node_name, ROLE_BORROWER)] += 1
    rows = []
    for node in nodes:
        name = str((node.get("metadata") or {}).get("name", ""))
        alloc = (node.get("status") or {}).get("allocatable") or {}
        gpus = sum(_int(q) for r, q in alloc.items() if r in real)
        ours = {r: _int(q) for r, q in alloc.items() if is_gpushare_resource(r)}
        if name not in agent_pods and not gpus and not any(ours.values()):
            continue
        rows.append(
            _row(
                name,
                gpus=gpus,
                ours=ours,
                counts=counts,
                agent_pod=agent_pods.get(name),
                doc=docs.get(name),
                error=errors.get(name),
                leader=leader,
                now=now,
            )
        )
    return sorted(rows, key=lambda r: r.node)


def _row(
    name: str,
    *,
    gpus: int,
    ours: Mapping[str, int],
    counts: Counter[tuple[str, str]],
    agent_pod: Mapping[str, Any] | None,
    doc: Mapping[str, Any] | None,
    error: str | None,
    leader: str,
    now: float,
) -> NodeRow:
    pod_name, ready, restarts = _agent_pod_state(agent_pod)
    problems = [] if agent_pod is not None else ["no gpushare agent pod on this node"]
    if error:
        problems.append(f"agent status unavailable: {error}")
    nri: bool | None = None
    spot: Counter[str] = Counter()
    age: float | None = None
    if doc is not None:
        connected = (doc.get("nri") or {}).get("connected")
        nri = None if connected is None else bool(connected)
        spot.update(str(g.get("state")) for g in doc.get("spot") or ())
        at = float(doc.get("at") or 0.0)
        age = max(0.0, now - at) if at else None
        problems += _agent_problems(doc)
    return NodeRow(
        node=name,
        agent_pod=pod_name,
        agent_ready=ready,
        restarts=restarts,
        leader=bool(leader) and leader == name,
        nri=nri,
        gpus=gpus,
        shadows=counts[(name, ROLE_SHADOW)],
        sharers=counts[(name, ROLE_SHARER)],
        borrowers=counts[(name, ROLE_BORROWER)],
        advertised={r: q for r, q in sorted(ours.items()) if q},
        spot=dict(sorted(spot.items())),
        last_pass_age_s=age,
        source="agent" if doc is not None else "api",
        problems=tuple(problems),
    )


def _int(quantity: object) -> int:
    try:
        return int(str(quantity))
    except ValueError:
        return 0  # device resources are whole numbers; anything else is not a GPU count


__all__ = [
    "AGENT_LABEL",
    "ROLES",
    "ROLE_BORROWER",
    "ROLE_DIND",
    "ROLE_OWNER",
    "ROLE_SHADOW",
    "ROLE_SHARER",
    "GpuUse",
    "NodeRow",
    "gpu_uses",
    "node_rows",
    "real_resources",
    "uses_of_gpu",
    "uses_of_pod",
]
