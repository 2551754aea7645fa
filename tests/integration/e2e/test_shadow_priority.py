"""Shadows cannot be aimed: a tenant's sharer on a node full of another tenant's GPU pods waits,
with the agent's Event saying why, and nobody is preempted (docs/install.md, "Shadow priority").

The shadow the sharer causes outranks the other tenant's pods (value 1000000), so only its
preemptionPolicy keeps the scheduler from evicting one of them to place it.
"""

from __future__ import annotations

import json
import time
from typing import Any

from controller.share.cluster_view import REASON_SHADOW_UNSCHEDULABLE
from localcluster.agent import FAKE_RESOURCE
from localcluster.pods import pod_manifest, sharer
from tests.integration.e2e.conftest import Env

OWNER_NS = "prio-owner"
SHARER_NS = "prio-sharer"
# How long the shadow stays unschedulable after the agent's Event before the verdict: the
# scheduler retries an unschedulable pod after its backoff (1 s, then 2 s, ...), and preemption
# is decided on the first failed attempt.
SETTLE_S = 8.0


def _live(e: Env, namespace: str) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in e.pods(namespace)}


def _owners(e: Env) -> dict[str, str]:
    """The other tenant's live pods: name -> uid (a preempted pod leaves, or comes back anew)."""
    live = _live(e, OWNER_NS).items()
    return {n: p["metadata"]["uid"] for n, p in live if not p["metadata"].get("deletionTimestamp")}


def _waiting_event(e: Env) -> list[dict[str, Any]]:
    return [ev for ev in e.events("greedy", SHARER_NS) if ev["reason"] == REASON_SHADOW_UNSCHEDULABLE]


def test_a_sharer_on_a_full_node_waits_and_preempts_nobody(e2e: Env) -> None:
    for ns in (OWNER_NS, SHARER_NS):
        e2e.cluster.kubectl("create", "namespace", ns)
    try:
        owners = [pod_manifest(f"owner-{i}", namespace=OWNER_NS, resources={FAKE_RESOURCE: "1"}) for i in range(2)]
        e2e.start_pods(owners)  # both fake GPUs held: the node is full
        before = _owners(e2e)

        e2e.apply(sharer("greedy", namespace=SHARER_NS))

        def decided() -> bool:  # waiting, or (the defect) an owner made room
            return bool(_waiting_event(e2e)) or _owners(e2e) != before

        e2e.wait("the agent's Event on the waiting sharer", decided, 60)
        time.sleep(SETTLE_S)

        after = _live(e2e, OWNER_NS)
        assert _owners(e2e) == before, "the sharer's shadow preempted another tenant's pod"
        for name, pod in after.items():
            assert pod["status"]["phase"] == "Running" and not pod["metadata"].get("deletionTimestamp"), pod
            reasons = {ev["reason"] for ev in e2e.events(name, OWNER_NS)}
            assert not reasons & {"Preempted", "Killing", "Evicted"}, (name, reasons)

        (shadow,) = e2e.shadows()
        assert shadow["spec"]["preemptionPolicy"] == "Never", shadow["spec"]
        assert shadow["spec"]["priority"] == 1000000, shadow["spec"]
        assert not shadow["status"].get("nominatedNodeName"), shadow["status"]
        assert shadow["status"].get("phase") == "Pending", shadow["status"]

        (event,) = _waiting_event(e2e)
        assert event["type"] == "Warning" and event["source"]["component"] == "gpushare", event
        message = event["message"]
        assert "cannot be scheduled" in message and FAKE_RESOURCE in message, message
        assert f"Insufficient {FAKE_RESOURCE}" in message, message

        waiting = _live(e2e, SHARER_NS)["greedy"]
        assert waiting["status"]["phase"] == "Pending", waiting["status"]
        # The sharer keeps the priority its tenant gave it (none): the agent lifts nothing.
        assert waiting["spec"].get("priority", 0) == 0 and "priorityClassName" not in waiting["spec"], waiting["spec"]
    finally:
        for ns in (SHARER_NS, OWNER_NS):  # the sharer first: its shadow then goes when idle
            e2e.cluster.kubectl("delete", "namespace", ns, "--wait=true", "--timeout=90s", check=False)


def test_a_shadow_cannot_state_a_policy_its_class_does_not_have(e2e: Env) -> None:
    """Why the agent states the policy: an old or hand-made class that preempts while the config
    says it must not gets the shadow refused (fails closed), and the class cannot be flipped."""
    shadow = pod_manifest("drifted", namespace="gpushare-system", resources={FAKE_RESOURCE: "1"})
    shadow["spec"] |= {"priorityClassName": "gpushare-shadow", "preemptionPolicy": "PreemptLowerPriority"}
    res = e2e.cluster.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(shadow), check=False)
    assert res.returncode != 0 and "PreemptionPolicy" in res.stderr, (res.returncode, res.stderr)

    flip = json.dumps({"preemptionPolicy": "PreemptLowerPriority"})
    res = e2e.cluster.kubectl("patch", "priorityclass", "gpushare-shadow", "--dry-run=server", "-p", flip, check=False)
    assert res.returncode != 0 and "preemptionPolicy" in res.stderr, (res.returncode, res.stderr)
