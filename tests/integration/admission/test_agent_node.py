"""gpushare-agent-node: with the real token of the DaemonSet's pod, a node's agent writes only pods
bound to its own node, and shadows anywhere (the Lease holder's work); a token of the agent's
ServiceAccount that names no node writes nothing. The calls are the agent's own client's."""

from __future__ import annotations

import json
from typing import Any

from controller.io.kube_client import KubeClient
from gpushare import keys
from localcluster.pods import pod_manifest
from tests.harness.worlds.agent_pod import NAMESPACE
from tests.integration.admission.conftest import (
    AGENT_SA,
    OTHER_NODE,
    OTHER_NODE_SHARE,
    TENANT_NS,
    TEST_LABEL,
    Admission,
)
from tests.integration.admission.test_tenant_pods import REAL, pod

POLICY = "'gpushare-agent-node'"
DENIED = f"ValidatingAdmissionPolicy {POLICY} with binding {POLICY} denied request"
RECORD = {keys.ANNOTATION_SHADOW_OWNER: json.dumps({f"{NAMESPACE}/s": "u"})}


def _alive(a: Admission, name: str, namespace: str) -> bool:
    found = a.cluster.pod(name, namespace)
    return found is not None and not found["metadata"].get("deletionTimestamp")


def _on_this_node(a: Admission, name: str) -> dict[str, Any]:
    manifest = pod_manifest(name, namespace=TENANT_NS, labels={TEST_LABEL: "1"})
    manifest["spec"]["nodeName"] = a.cluster.node_name
    return manifest


def test_the_agent_token_is_the_pods_and_names_its_node(admission: Admission) -> None:
    a = admission
    spec = a.agent_pod["spec"]
    assert spec["serviceAccountName"] == AGENT_SA and spec.get("automountServiceAccountToken", True)
    projected = [v for v in spec["volumes"] if v["name"].startswith("kube-api-access-")]
    assert projected and "serviceAccountToken" in projected[0]["projected"]["sources"][0], projected
    res = a.kubectl(a.agent, "auth", "whoami", "-o", "json")
    assert res.returncode == 0, res.stderr
    user = json.loads(res.stdout)["status"]["userInfo"]
    assert user["username"] == f"system:serviceaccount:{NAMESPACE}:{AGENT_SA}"
    assert user["extra"]["authentication.kubernetes.io/node-name"] == [a.cluster.node_name]
    assert user["extra"]["authentication.kubernetes.io/pod-name"] == [a.agent_pod["metadata"]["name"]]


def test_a_tenant_pod_on_another_node_is_out_of_reach(admission: Admission) -> None:
    a = admission
    assert a.create(None, pod("away", [("app", {REAL: "1"})], node=OTHER_NODE), dry_run=False) == ""
    ref = a.ref("away")
    patched = a.by_agent(a.agent, lambda c: c.patch_pod_annotations(ref, RECORD))
    deleted = a.by_agent(a.agent, lambda c: c.delete_pod(ref))
    where = f"pod {TENANT_NS}/away, which is bound to node {OTHER_NODE}"
    assert DENIED in patched and f"the agent of node {a.cluster.node_name} may not update {where}" in patched, patched
    assert DENIED in deleted and f"may not delete {where}" in deleted, deleted
    assert _alive(a, "away", TENANT_NS)
    assert keys.ANNOTATION_SHADOW_OWNER not in (a.pod("away")["metadata"].get("annotations") or {})


def test_a_tenant_pod_on_its_own_node_is_in_reach(admission: Admission) -> None:
    a = admission
    assert a.create(None, _on_this_node(a, "here"), dry_run=False) == ""
    ref = a.ref("here")
    assert a.by_agent(a.agent, lambda c: c.patch_pod_annotations(ref, RECORD)) == ""
    assert a.pod("here")["metadata"]["annotations"] == RECORD
    assert a.by_agent(a.agent, lambda c: c.delete_pod(ref)) == ""
    assert not _alive(a, "here", TENANT_NS)


def test_shadows_anywhere_but_nothing_else_in_the_namespace(admission: Admission) -> None:
    """The Lease holder creates, records and deletes shadows on any node; another pod of
    gpushare-system on another node (say, that node's agent) is out of reach."""
    a = admission
    far = a.shadow_on(OTHER_NODE, ordinal=3)
    ref = a.ref(far, NAMESPACE)
    users = {keys.ANNOTATION_SHADOW_USERS: "{}"}
    assert a.by_agent(a.agent, lambda c: c.patch_pod_annotations(ref, users)) == ""
    assert a.by_agent(a.agent, lambda c: c.delete_pod(ref)) == ""
    assert not _alive(a, far, NAMESPACE)

    assert a.create(None, pod("plain-far", [("main", {})], namespace=NAMESPACE, node=OTHER_NODE), dry_run=False) == ""
    plain = a.ref("plain-far", NAMESPACE)
    patched = a.by_agent(a.agent, lambda c: c.patch_pod_annotations(plain, {"gpushare-test/touched": "1"}))
    deleted = a.by_agent(a.agent, lambda c: c.delete_pod(plain))
    where = f"pod {NAMESPACE}/plain-far, which is bound to node {OTHER_NODE}"
    assert DENIED in patched and f"may not update {where}" in patched, patched
    assert DENIED in deleted and f"may not delete {where}" in deleted, deleted
    assert _alive(a, "plain-far", NAMESPACE)

    made = a.create_by_agent(a.agent, pod("not-a-shadow", [("main", {})], namespace=NAMESPACE))
    assert DENIED in made and f"may not create pod {NAMESPACE}/not-a-shadow, which is bound to no node" in made, made


def test_a_token_that_names_no_node_writes_nothing(admission: Admission) -> None:
    a = admission
    assert a.create(None, _on_this_node(a, "near"), dry_run=False) == ""
    ref = a.ref("near")
    for call in (lambda c: c.patch_pod_annotations(ref, RECORD), lambda c: c.delete_pod(ref)):
        error = a.by_agent(a.agent_unbound, call)
        assert DENIED in error and "the agent's credentials name no node" in error, error
    assert _alive(a, "near", TENANT_NS)


def test_only_its_own_node_status(admission: Admission) -> None:
    """The agent lowers its own node's share counts ahead of kubelet, and no other node's."""
    a = admission

    def lower_other(c: KubeClient) -> bool:
        c.patch_node_status(OTHER_NODE, {"capacity": {OTHER_NODE_SHARE: "0"}, "allocatable": {OTHER_NODE_SHARE: "0"}})
        return True

    refused = a.by_agent(a.agent, lower_other)
    assert DENIED in refused, refused
    assert f"the agent of node {a.cluster.node_name} may not write the status of node {OTHER_NODE}" in refused
    other = a.cluster.request("GET", f"/api/v1/nodes/{OTHER_NODE}")["status"]
    assert other["allocatable"][OTHER_NODE_SHARE] == other["capacity"][OTHER_NODE_SHARE] == "4"

    def lower_own(c: KubeClient) -> bool:
        body = {"status": {"capacity": {OTHER_NODE_SHARE: "0"}}}
        path = f"/api/v1/nodes/{a.cluster.node_name}/status"
        c._call("PATCH", path, query={"dryRun": "All"}, body=body, content_type="application/merge-patch+json")
        return True

    assert a.by_agent(a.agent, lower_own) == ""
