"""How an apiserver audit line becomes a ``Use``, and how uses are judged against the RBAC
(tests/harness/rbac.py, which tests/integration/e2e/test_rbac_exact.py runs on the real log)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from tests.harness.rbac import Grants, Use, compare, uses_from_audit

AGENT = "system:serviceaccount:gpushare-system:gpushare-agent"
SINCE = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def line(verb: str, ref: dict[str, str] | None, *, user: str = AGENT, at: str = "12:00:01", **more: Any) -> str:
    entry = {
        "verb": verb,
        "user": {"username": user},
        "requestURI": "/x",
        "requestReceivedTimestamp": f"2026-01-01T{at}.000000Z",
        "responseStatus": {"code": 200},
        **({"objectRef": ref} if ref else {}),
        **more,
    }
    return json.dumps(entry)


def test_each_request_reduces_to_verb_group_resource_and_scope() -> None:
    lines = [
        line("watch", {"resource": "pods"}),
        line("create", {"resource": "pods", "namespace": "gpushare-system", "name": "s"}),
        line("delete", {"resource": "pods", "namespace": "team-a", "name": "p"}),
        line("patch", {"resource": "nodes", "subresource": "status", "name": "n"}),
        line("update", {"resource": "leases", "apiGroup": "coordination.k8s.io", "namespace": "gpushare-system"}),
        line("list", {"resource": "namespaces"}),
        "",
    ]
    uses, odd = uses_from_audit(lines, AGENT, SINCE)
    assert odd == []
    assert uses == {
        Use("watch", "", "pods", "cluster-wide"),
        Use("create", "", "pods", "gpushare-system"),
        Use("delete", "", "pods", "any-namespace"),
        Use("patch", "", "nodes/status", "cluster-wide"),
        Use("update", "coordination.k8s.io", "leases", "gpushare-system"),
        Use("list", "", "namespaces", "cluster-wide"),
    }


def test_other_users_and_earlier_requests_are_left_out() -> None:
    lines = [
        line("delete", {"resource": "pods", "namespace": "team-a"}, user="system:admin"),
        line("create", {"resource": "pods", "namespace": "team-a"}, at="11:59:59"),
    ]
    assert uses_from_audit(lines, AGENT, SINCE) == (set(), [])


def test_rbac_refusals_and_non_resource_requests_are_named() -> None:
    forbid = {"authorization.k8s.io/decision": "forbid"}
    lines = [
        line("get", {"resource": "secrets", "namespace": "x"}, annotations=forbid, requestURI="/api/v1/secrets"),
        line("get", None, requestURI="/version"),
        # Refused by an admission policy, not by RBAC: the call is judged like any other.
        line("delete", {"resource": "pods", "namespace": "x"}, responseStatus={"code": 403}),
    ]
    uses, odd = uses_from_audit(lines, AGENT, SINCE)
    assert odd == ["get /api/v1/secrets was refused by RBAC", "get /version (not a resource)"]
    assert Use("delete", "", "pods", "any-namespace") in uses


def test_compare_fails_both_ways_and_wants_each_clusterrole_verb_outside_its_namespace() -> None:
    grants = Grants(
        cluster=frozenset({("delete", "", "pods"), ("list", "", "nodes"), ("get", "", "pods")}),
        namespaced=frozenset({("create", "", "pods"), ("delete", "", "pods"), ("get", "", "leases")}),
    )
    uses = {
        Use("delete", "", "pods", "any-namespace"),
        Use("create", "", "pods", "gpushare-system"),
        Use("create", "", "pods", "any-namespace"),  # not granted: the Role covers gpushare-system only
        Use("get", "", "pods", "gpushare-system"),  # the ClusterRole's get is used only where the Role would do
    }
    verdict = compare(grants, uses, rare=[Use("list", "", "nodes", "cluster-wide")])
    assert verdict.not_granted == [Use("create", "", "pods", "any-namespace")]
    assert verdict.cluster_unused == [("get", "", "pods")]
    # delete is in the ClusterRole already; get leases is never used.
    assert verdict.role_unused == [("delete", "", "pods"), ("get", "", "leases")]
    assert not verdict.exact and "used, not granted: create core/pods (any-namespace)" in verdict.explain()
