"""The agent's RBAC is exactly what it calls: the apiserver's audit log of the agent's
ServiceAccount (localcluster audits that user only), compared both ways with the ClusterRole
and Role of manifests/20-rbac.yaml, which are also what the chart installed here.

The test drives every path that makes a distinct API call (the Lease written anew, shadows
created, recorded and deleted, sharers recorded and evicted with an Event, `gpushare doctor` in
the agent's pod, /metrics read from off the node with a reviewed token), then reads the log:
every call the agent made since this tier installed it, in the tests before this one as well.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import pytest

from controller.core import actions
from gpushare import keys
from localcluster.component_config import AGENT_USER
from localcluster.pods import sharer
from tests.harness.off_node import get, off_node_addresses
from tests.harness.rbac import Use, compare, grants_from, manifest_grants, uses_from_audit
from tests.harness.worlds.agent_pod import CONTAINER, DAEMONSET, NAMESPACE, AgentPod
from tests.integration.e2e.conftest import IDLE_TIMEOUT_S, Env

TENANT = "rbac-tenant"
# Calls the run cannot make, counted as seen. Each names the code that makes it and why this run
# cannot: an entry here is a grant kept on trust, so the list stays as short as it can be.
# (Empty: every grant is exercised below or by the agent's own start.)
RARE_PATHS: tuple[Use, ...] = ()


def _pod_agent(e: Env) -> AgentPod:
    if not isinstance(e.agent, AgentPod):
        pytest.skip("the agent runs as a host process (GPUSHARE_AGENT_MODE=process): it uses the admin's credentials")
    return e.agent


def _kubectl_json(e: Env, *args: str) -> Any:
    return json.loads(e.cluster.kubectl(*args, "-o", "json").stdout)


def _lease_holder(e: Env) -> str:
    res = e.cluster.kubectl("get", "lease", "-n", NAMESPACE, keys.LEASE_NAME, "-o", "json", check=False)
    return str((json.loads(res.stdout).get("spec") or {}).get("holderIdentity") or "") if res.returncode == 0 else ""


def _lease_written_anew(e: Env) -> None:
    """The Lease deleted under the leader: its next renewal finds none and creates it."""
    e.wait("a leader", lambda: bool(_lease_holder(e)), 60)
    e.cluster.kubectl("delete", "lease", "-n", NAMESPACE, keys.LEASE_NAME)
    e.wait("the Lease created again", lambda: bool(_lease_holder(e)), 60)


def _recorded(e: Env, names: list[str]) -> bool:
    pods = {p["metadata"]["name"]: p for p in e.pods(TENANT)}
    annotations = [(pods.get(n) or {}).get("metadata", {}).get("annotations") or {} for n in names]
    owners = all(keys.ANNOTATION_SHADOW_OWNER in a for a in annotations)
    users = any(keys.ANNOTATION_SHADOW_USERS in (s["metadata"].get("annotations") or {}) for s in e.shadows())
    return owners and users


def _sharers_recorded_then_evicted(e: Env) -> None:
    """Shadow created (create in gpushare-system), both sides recorded (patch, both scopes), then
    the shadow deleted by hand: its sharers are evicted (delete elsewhere) with an Event."""
    names = ["rbac-a", "rbac-b"]
    e.start_pods([sharer(n, namespace=TENANT) for n in names])
    e.wait("owner and users records", lambda: _recorded(e, names), 30)
    for shadow in e.shadows():
        e.cluster.kubectl("delete", "pod", "-n", NAMESPACE, shadow["metadata"]["name"], "--wait=false")

    def evicted() -> bool:
        return all(any(ev["reason"] == actions.REASON_SHADOW_GONE for ev in e.events(n, TENANT)) for n in names)

    e.wait("ShadowGone evictions with their Events", evicted, 60)


def _idle_shadow_deleted(e: Env) -> None:
    """A shadow left without sharers is deleted by the leader, after LISTs that confirm it."""
    e.start_pods([sharer("rbac-c", namespace=TENANT)])
    e.cluster.kubectl("delete", "pod", "-n", TENANT, "rbac-c", "--wait=true")
    e.wait("the idle shadow deleted", lambda: not e.shadows(), IDLE_TIMEOUT_S + 60)


def _doctor_in_the_agents_pod(e: Env) -> None:
    """docs/doctor.md runs `gpushare doctor` in the agent's pod: it reads the node's allocatable."""
    res = e.cluster.kubectl(
        "exec", "-n", NAMESPACE, f"ds/{DAEMONSET}", "-c", CONTAINER, "--",
        "gpushare", "doctor", "--config", "/etc/gpushare/config.yaml", "-o", "json",
        check=False,
    )  # fmt: skip
    # It exits 1 for any fault of this test node; what matters is that it asked the API.
    assert res.stdout.strip().startswith("{"), (res.returncode, res.stdout[-2000:], res.stderr[-2000:])
    assert "cannot list resource" not in res.stdout, res.stdout[-2000:]


def _metrics_read_with_a_token(e: Env) -> None:
    """A scraper off the node with a token bound to gpushare-metrics-reader: the agent has the token
    reviewed (TokenReview) and the scraper authorized for /metrics (SubjectAccessReview)."""
    e.cluster.kubectl("create", "serviceaccount", "-n", TENANT, "scraper")
    e.cluster.kubectl(
        "create", "clusterrolebinding", f"{TENANT}-scraper",
        "--clusterrole", "gpushare-metrics-reader", "--serviceaccount", f"{TENANT}:scraper",
    )  # fmt: skip
    token = e.cluster.kubectl("create", "token", "-n", TENANT, "scraper", "--duration", "10m").stdout.strip()
    with off_node_addresses(1) as (source,):
        code, _, body = get(e.agent.port, "/metrics", source=source, token=token)
    assert code == 200, (code, body[:500])


def test_the_agent_calls_exactly_what_its_rbac_grants(e2e: Env) -> None:
    _pod_agent(e2e)
    log = e2e.cluster.layout.audit_log
    assert log.is_file(), f"{log} is missing: the cluster's apiserver was started without auditing; restart it"
    e2e.cluster.kubectl("create", "namespace", TENANT)
    try:
        _lease_written_anew(e2e)
        _sharers_recorded_then_evicted(e2e)
        _idle_shadow_deleted(e2e)
        _doctor_in_the_agents_pod(e2e)
        _metrics_read_with_a_token(e2e)
    finally:
        e2e.cluster.kubectl("delete", "clusterrolebinding", f"{TENANT}-scraper", "--ignore-not-found", check=False)
        e2e.cluster.kubectl("delete", "namespace", TENANT, "--wait=true", "--timeout=90s", check=False)

    # Since this install: the release's namespace, made anew by each install (the harness deletes it
    # and waits after each uninstall), and before it other tiers call with the agent's token themselves.
    installed_at = _kubectl_json(e2e, "get", "namespace", NAMESPACE)["metadata"]["creationTimestamp"]
    since = datetime.fromisoformat(installed_at)
    uses, odd = uses_from_audit(log.read_text().splitlines(), AGENT_USER, since)
    assert not odd, "calls the RBAC does not cover:\n" + "\n".join(sorted(set(odd)))
    seen = "\n".join(str(u) for u in sorted(uses))
    # The paths driven above, each seen where it reaches (a vacuous log would pass everything else).
    assert {
        Use("create", "", "pods", "gpushare-system"),
        Use("delete", "", "pods", "gpushare-system"),
        Use("delete", "", "pods", "any-namespace"),
        Use("patch", "", "pods", "any-namespace"),
        Use("create", "", "events", "any-namespace"),
        Use("create", "coordination.k8s.io", "leases", "gpushare-system"),
        Use("list", "", "nodes", "cluster-wide"),
        Use("create", "authentication.k8s.io", "tokenreviews", "cluster-wide"),
        Use("create", "authorization.k8s.io", "subjectaccessreviews", "cluster-wide"),
    } <= uses, seen

    installed = [
        _kubectl_json(e2e, "get", "clusterrole", DAEMONSET),
        _kubectl_json(e2e, "get", "clusterrolebinding", DAEMONSET),
        _kubectl_json(e2e, "get", "role", "-n", NAMESPACE, DAEMONSET),
        _kubectl_json(e2e, "get", "rolebinding", "-n", NAMESPACE, DAEMONSET),
    ]
    grants = manifest_grants()
    assert grants_from(installed) == grants, "the chart installed other RBAC than manifests/20-rbac.yaml"
    verdict = compare(grants, uses, RARE_PATHS)
    assert verdict.exact, f"{verdict.explain()}\n\nthe agent's calls:\n{seen}"
