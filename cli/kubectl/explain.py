"""``kubectl gpushare why POD``: one paragraph saying why a pod is Pending, was evicted or was
refused, and what to do about it. Pure: raw API objects and agents' ``/status`` documents in,
an ``Explanation`` out.

The sources, in the order they are believed:

1. the container's own state: a ``CreateContainerError`` whose message starts with
   ``gpushare:`` is the NRI plugin's refusal (design §8), and names the rule;
2. the Events the agent writes (``ShadowGone``, ``OwnerBack``, ``OwnerLeft``,
   ``OwnerNotLendable``, ``ShadowUnschedulable``, ``UnknownPoolResource``,
   ``UnknownShareSpec``) and the agent's list of recent evictions;
3. the scheduler's ``FailedScheduling`` on the pod, read against the shadows (a sharer waits
   for a shadow) and the spot states (a borrower waits for an idle owner);
4. a controller's ``FailedCreate`` Event carrying an admission policy's refusal: a pod
   refused at admission never exists, so its ReplicaSet or Job is what can be asked about.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from controller.core.actions import (
    REASON_GPU_UNHEALTHY,
    REASON_NOT_LENDABLE,
    REASON_OWNER_BACK,
    REASON_OWNER_LEFT,
    REASON_SHADOW_GONE,
)
from controller.core.pod_facts import PodFacts, parse_pod
from controller.core.refusals import REASON_POD_UNREADABLE, REASON_REQUESTS_REFUSED
from controller.errors import InvalidObject
from controller.share.cluster_view import REASON_SHADOW_UNSCHEDULABLE, unschedulable_message
from controller.share.served import REASON_UNKNOWN_POOL, REASON_UNKNOWN_SPEC
from gpushare import keys

STATE_REFUSED = "Refused"
STATE_EVICTED = "Evicted"
STATE_PENDING = "Pending"
STATE_RUNNING = "Running"
STATE_NOT_FOUND = "NotFound"

_EVICTION_FIX = {
    REASON_SHADOW_GONE: "the shadow pod that held its GPU was deleted (by hand, a drain or its node going away), "
    "so the agent deleted the sharer rather than let it use a GPU nobody holds. Fix: create the pod again (a "
    "Deployment or Job does this itself); it gets a slot on another shadow. Do not delete pods in gpushare-system.",
    REASON_OWNER_BACK: "it borrowed an idle owner's GPU (gpushare/spot-gpu) and the owner came back, so it was "
    "killed and deleted within the kill bound. Fix: run spot work under a controller that retries (a Job with a "
    "backoffLimit) and checkpoints; use a share resource for work that must not be interrupted.",
    REASON_OWNER_LEFT: "the owner of the GPU it borrowed finished or was deleted, which ends the loan. Fix: submit "
    "it again; it borrows the next GPU whose owner is away.",
    REASON_NOT_LENDABLE: "the owner of the GPU it borrowed withdrew its consent (the gpushare.k8s.io/lendable "
    "label), which ends the loan. Fix: submit it again; it borrows the next GPU whose owner is away.",
    REASON_REQUESTS_REFUSED: "its mix of GPU requests is one gpushare refuses (docs/security.md), and the node "
    "refuses it whether or not the admission policy is on. Fix: split the work into separate pods, each asking one "
    "kind of GPU.",
    REASON_POD_UNREADABLE: "a field of it the agent cannot read, while it held a share slot or a lent GPU, so it "
    "was stopped rather than run where reclaim and the cascade cannot see it. Fix: correct the field (the "
    "message names it) and create the pod again.",
}

# NRI refusal messages (nri_plugin/decide.py, gpushare/codecs.py) -> what the tenant does about them.
_REFUSAL_FIX = (
    (
        "refused on the node",
        "split the work into separate pods, each asking one kind of GPU (a share, spot or whole GPUs); "
        "gpushare refuses the mix whether or not its admission policy is on",
    ),
    (
        "also a pod annotation",
        "remove that key from the pod's annotations: gpushare's device plugin writes it on "
        "the container, and a pod annotation of the same name makes it untrustworthy",
    ),
    (
        "not a container of this pod",
        "a pod annotation container-devices-from.<target> may name only a container "
        "of the same pod (`<source>` or `_/_/<source>`); use a share or spot resource to get another pod's GPU",
    ),
    (
        "not created yet",
        "nothing, if the source container is about to start: kubelet retries with back-off; if it "
        "persists, check that the annotation names the right source container and that it starts",
    ),
    (
        "no PodResources",
        "the node's agent cannot reach kubelet's PodResources API: run `gpushare doctor` in the agent pod of that node",
    ),
    (
        "holds no character device",
        "give the source container the vendor's GPU resource: it has no device node to share",
    ),
    (
        "already has",
        "do not request a GPU in both containers: the target must not already have the source's device paths",
    ),
    (
        "does not confirm",
        "do not set gpushare's container annotations by hand; delete the pod and let the device plugin write them",
    ),
    (
        "is not known on this node",
        "nothing, if the shadow is starting: kubelet retries; if it persists, the "
        "shadow is gone and the agent evicts this pod (ShadowGone)",
    ),
    (
        "no container on this node is known to hold",
        "delete the borrower: the owner it borrowed from is gone from "
        "this node, and a new pod borrows a GPU whose owner is away",
    ),
)
_REFUSAL_DEFAULT = (
    "read the rule named in the message in docs/nri.md (trust rules), correct the pod and create it again"
)


@dataclass(frozen=True)
class Explanation:
    pod: str  # ns/name
    state: str  # Refused, Evicted, Pending, Running, NotFound, or the pod's own phase
    reason: str  # the Event reason or container state that decided it
    explanation: str
    fix: str

    @property
    def paragraph(self) -> str:
        return f"{self.explanation} Fix: {self.fix}" if self.fix else self.explanation


def _when(ev: Mapping[str, Any]) -> str:
    meta = ev.get("metadata") or {}
    return str(ev.get("lastTimestamp") or ev.get("eventTime") or meta.get("creationTimestamp") or "")


def _latest(events: Iterable[Mapping[str, Any]], reasons: Iterable[str]) -> Mapping[str, Any] | None:
    wanted = set(reasons)
    found = [ev for ev in events if ev.get("reason") in wanted]
    return max(found, key=_when) if found else None


def _refusal(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """(container, message) of a container the NRI plugin refused, from kubelet's container status."""
    status = pod.get("status") or {}
    for field in ("initContainerStatuses", "containerStatuses"):
        for st in status.get(field) or ():
            waiting = (st.get("state") or {}).get("waiting") or {}
            message = str(waiting.get("message") or "")
            if waiting.get("reason") in ("CreateContainerError", "RunContainerError") and "gpushare:" in message:
                return str(st.get("name", "")), message
    return None


def refusal_fix(message: str) -> str:
    for needle, fix in _REFUSAL_FIX:
        if needle in message:
            return fix
    return _REFUSAL_DEFAULT


def explain(
    pod_key: str,
    pod: Mapping[str, Any] | None,
    events: Sequence[Mapping[str, Any]],
    shadows: Sequence[Mapping[str, Any]],
    docs: Mapping[str, Mapping[str, Any]],
) -> Explanation:
    """Why ``pod_key`` is where it is. ``events``: Events naming it (also a deleted namesake's);
    ``shadows``: the shadow pods; ``docs``: node -> the agent's ``/status`` document."""
    if pod is None:
        return _missing(pod_key, events, docs)
    try:
        facts = parse_pod(pod)
    except InvalidObject as exc:
        return Explanation(pod_key, "Unreadable", "InvalidObject", str(exc), "correct the pod's spec")
    if (refused := _refusal(pod)) is not None:
        container, message = refused
        text = (
            f"Pod {pod_key} cannot start: containerd did not create its container {container!r} because "
            f"gpushare's NRI plugin refused it ({message.strip()})."
        )
        return Explanation(pod_key, STATE_REFUSED, "CreateContainerError", text, refusal_fix(message) + ".")
    evicted = _latest(events, _EVICTION_FIX)
    if evicted is not None and facts.is_terminating:
        return _evicted(pod_key, evicted)
    if facts.phase == "Pending":
        return _pending(pod_key, pod=pod, facts=facts, events=events, shadows=shadows, docs=docs)
    if facts.phase == "Failed":
        status = pod.get("status") or {}
        why = f"{status.get('reason') or 'Failed'}: {status.get('message') or 'no message'}"
        return Explanation(
            pod_key,
            "Failed",
            str(status.get("reason") or "Failed"),
            f"Pod {pod_key} failed ({why}).",
            "create it again; a pod that failed admission on a node (UnexpectedAdmissionError) was bound while the "
            "node's capacity was changing, and a controller replaces it by itself.",
        )
    text = f"Pod {pod_key} is {facts.phase} on node {facts.node_name or '-'}; gpushare finds nothing wrong with it."
    return Explanation(pod_key, facts.phase, "", text + _nri_note(facts.node_name, docs), "")


def _evicted(pod_key: str, ev: Mapping[str, Any]) -> Explanation:
    reason = str(ev.get("reason"))
    text = f"Pod {pod_key} was evicted by gpushare ({reason}: {ev.get('message', '')}): " + _EVICTION_FIX[reason]
    explanation, _, fix = text.partition(" Fix: ")
    return Explanation(pod_key, STATE_EVICTED, reason, explanation, fix)


def _missing(pod_key: str, events: Sequence[Mapping[str, Any]], docs: Mapping[str, Mapping[str, Any]]) -> Explanation:
    evicted = _latest(events, _EVICTION_FIX)
    if evicted is not None:
        return _evicted(pod_key, evicted)
    for doc in docs.values():
        for e in doc.get("evictions") or ():
            if e.get("pod") == pod_key and e.get("reason") in _EVICTION_FIX:
                return _evicted(pod_key, {"reason": e["reason"], "message": e.get("message", "")})
    refused = [ev for ev in events if ev.get("reason") == "FailedCreate" and "denied" in str(ev.get("message", ""))]
    if refused:
        ev = max(refused, key=_when)
        kind = (ev.get("involvedObject") or {}).get("kind", "controller")
        text = f"The {kind} {pod_key} cannot create its pods: admission refused them ({ev.get('message', '')})."
        return Explanation(pod_key, STATE_REFUSED, "FailedCreate", text, "change the pod template as the message says.")
    text = (
        f"There is no pod {pod_key}, and no Event says it was evicted. A pod refused at admission is never "
        "created: `kubectl create`/`apply` printed the admission policy's message when it was refused."
    )
    return Explanation(
        pod_key,
        STATE_NOT_FOUND,
        "",
        text,
        "check the name and namespace (-n); for a refusal, read the message kubectl printed and correct the pod.",
    )


def _pending(
    pod_key: str,
    *,
    pod: Mapping[str, Any],
    facts: PodFacts,
    events: Sequence[Mapping[str, Any]],
    shadows: Sequence[Mapping[str, Any]],
    docs: Mapping[str, Mapping[str, Any]],
) -> Explanation:
    ours = _latest(
        events, (REASON_SHADOW_UNSCHEDULABLE, REASON_UNKNOWN_POOL, REASON_UNKNOWN_SPEC, REASON_REQUESTS_REFUSED)
    )
    if ours is not None:
        return _pending_agent_event(pod_key, ours)
    if facts.is_gated:
        text = f"Pod {pod_key} is Pending: it has schedulingGates, so the scheduler does not try it yet."
        return Explanation(pod_key, STATE_PENDING, "SchedulingGated", text, "remove the gate (whoever set it does).")
    message = unschedulable_message(pod)
    if facts.node_name:
        text = f"Pod {pod_key} is Pending on node {facts.node_name}: its containers are being created."
        return Explanation(
            pod_key,
            STATE_PENDING,
            "",
            text + _nri_note(facts.node_name, docs),
            "wait, or read `kubectl describe pod` for image pulls.",
        )
    resources = facts.resources()
    share = next((r for r in sorted(resources) if keys.parse_share_resource(r) is not None), "")
    if share:
        return _pending_sharer(pod_key, share, message, shadows, docs)
    if keys.RESOURCE_SPOT_GPU in resources:
        return _pending_borrower(pod_key, message, docs)
    text = f"Pod {pod_key} is Pending: the scheduler cannot place it ({message or 'no message yet'})."
    return Explanation(
        pod_key,
        STATE_PENDING,
        "FailedScheduling",
        text,
        "free or add what the message says is missing; the pod is placed by itself afterwards.",
    )


def _pending_agent_event(pod_key: str, ev: Mapping[str, Any]) -> Explanation:
    reason, message = str(ev.get("reason")), str(ev.get("message", ""))
    text = f"Pod {pod_key} is Pending: {message}"
    fix = {
        REASON_SHADOW_UNSCHEDULABLE: "free a GPU of that resource (an idle GPU pod, or a warm shadow if warmShadows "
        "is set) or add a GPU node; the shadow is then placed and the pod starts by itself.",
        REASON_UNKNOWN_POOL: "set the annotation gpushare.k8s.io/pool-resource to one of the agents' realResources, "
        "or remove it to use the first.",
        REASON_UNKNOWN_SPEC: "ask for a share spec the agents are configured with (shareSpecs, devShareSpecs; "
        "`kubectl gpushare status -o wide` lists what the nodes offer).",
        REASON_REQUESTS_REFUSED: "delete it and run the work as separate pods, each asking one kind of GPU: a share, "
        "spot, or whole GPUs.",
    }[reason]
    return Explanation(pod_key, STATE_PENDING, reason, text, fix)


def _pending_sharer(
    pod_key: str,
    resource: str,
    message: str,
    shadows: Sequence[Mapping[str, Any]],
    docs: Mapping[str, Mapping[str, Any]],
) -> Explanation:
    sick = sorted(
        f"{s.get('pod')} on {node} ({s.get('unhealthy')})"
        for node, doc in docs.items()
        for s in doc.get("shadows") or ()
        if s.get("unhealthy") and s.get("resource") == resource
    )
    stuck = []
    for s in shadows:
        labels = (s.get("metadata") or {}).get("labels") or {}
        kind, spec = labels.get(keys.LABEL_SHARE_KIND, ""), labels.get(keys.LABEL_SHARE_SPEC, "")
        known = spec.isdigit() and kind in (keys.KIND_SHARE, keys.KIND_SHARE_DEV)
        if known and keys.share_resource(kind, int(spec)) == resource and (why := unschedulable_message(s)):
            stuck.append(f"{(s.get('metadata') or {}).get('name')} ({why})")
    if stuck:
        text = (
            f"Pod {pod_key} is Pending: no shadow has a free slot of {resource}, and the shadow that would hold a GPU "
            f"for it cannot be scheduled: {'; '.join(sorted(stuck))}."
        )
        return Explanation(
            pod_key,
            STATE_PENDING,
            REASON_SHADOW_UNSCHEDULABLE,
            text,
            "free a GPU (an idle GPU pod, "
            "a warm shadow) or add a GPU node; the shadow is then placed and the pod starts by itself.",
        )
    if sick:
        text = (
            f"Pod {pod_key} is Pending: no healthy shadow has a free slot of {resource}; the slots of "
            f"{'; '.join(sick)} are listed Unhealthy, so kubelet admits no sharer on them."
            + (f" (scheduler: {message})" if message else "")
        )
        return Explanation(
            pod_key,
            STATE_PENDING,
            REASON_GPU_UNHEALTHY,
            text,
            "repair or replace the GPU (its vendor plugin lists it Healthy again by itself); the agent's leader "
            "creates a shadow on a healthy GPU when one is free.",
        )
    text = (
        f"Pod {pod_key} is Pending: no shadow has a free slot of {resource} yet"
        + (f" (scheduler: {message})" if message else "")
        + "; the agent holding the gpushare-controller Lease creates one within a pass."
    )
    return Explanation(
        pod_key,
        STATE_PENDING,
        "FailedScheduling",
        text,
        "wait a few seconds; if it persists, check "
        "`kubectl gpushare status` for a leader and for problems, and that the spec is one the agents "
        "offer.",
    )


def _pending_borrower(pod_key: str, message: str, docs: Mapping[str, Mapping[str, Any]]) -> Explanation:
    states = sorted(f"{g.get('real_id')}={g.get('state')}" for d in docs.values() for g in d.get("spot") or ())
    text = (
        f"Pod {pod_key} is Pending: it asks for {keys.RESOURCE_SPOT_GPU}, which is offered only while a lendable "
        "owner has been idle for idleWindow"
        + (f" (scheduler: {message})" if message else "")
        + (f"; the GPUs are {', '.join(states)}." if states else "; no agent reports a lendable GPU.")
    )
    return Explanation(
        pod_key,
        STATE_PENDING,
        "FailedScheduling",
        text,
        "wait for an owner to go idle, or label idle owners (or their namespace) gpushare.k8s.io/lendable=true.",
    )


def _nri_note(node: str, docs: Mapping[str, Mapping[str, Any]]) -> str:
    doc = docs.get(node)
    if doc is not None and (doc.get("nri") or {}).get("connected") is False:
        return (
            f" Note: the agent on {node} is not connected to containerd's NRI socket, so new containers that need "
            "a GPU from gpushare are not given one; see `gpushare doctor` there."
        )
    return ""


__all__ = [
    "STATE_EVICTED",
    "STATE_NOT_FOUND",
    "STATE_PENDING",
    "STATE_REFUSED",
    "STATE_RUNNING",
    "Explanation",
    "explain",
    "refusal_fix",
]
