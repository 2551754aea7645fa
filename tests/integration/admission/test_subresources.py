"""The pod subresources that write a pod's metadata, its spec or its node, on the real API server.

kube-apiserver v1.34 (pkg/registry/core/pod): pods/status keeps the spec but takes the labels and
annotations it is sent; a Binding, through pods/binding or the older bindings resource, merges its
annotations into the pod it binds; pods/ephemeralcontainers adds containers to a pod's spec and
pods/resize changes their resources. Each is written here by somebody the API lets write it (a
ServiceAccount granted just that, as an operator or a compromised controller would hold it), and
the agent's records, the shadow labels, the per-node rule and a shadow's fixed spec hold for
every one of them. The agent's ClusterRole grants none of them; the tests grant its token each one,
as a later grant by hand would, to show the policy does not lean on that.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gpushare import keys
from localcluster.pods import pod_manifest
from tests.harness.worlds.agent_pod import NAMESPACE
from tests.integration.admission.conftest import OTHER_NODE, TENANT_NS, TEST_LABEL, Admission, Identity
from tests.integration.admission.test_tenant_pods import OWNER_RECORD

PODS = "ValidatingAdmissionPolicy 'gpushare-pods' with binding 'gpushare-pods' denied request: gpushare: pod "
NODE = (
    "ValidatingAdmissionPolicy 'gpushare-agent-node' with binding 'gpushare-agent-node' denied request: "
    "gpushare: the agent of node "
)
OWNER = keys.ANNOTATION_SHADOW_OWNER
RECORD_RULE = f"the annotation {OWNER} is a record only the gpushare agent"
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"


def _rule(resource: str, *verbs: str) -> dict[str, Any]:
    return {"apiGroups": [""], "resources": [resource], "verbs": list(verbs)}


AGENT_GRANT = [
    _rule("pods/status", "patch", "update"),
    _rule("pods/binding", "create"),
    _rule("bindings", "create"),
    _rule("pods/eviction", "create"),
    _rule("pods/ephemeralcontainers", "patch", "update"),
    _rule("pods/resize", "patch", "update"),
    _rule("pods/exec", "create", "get"),
]


@pytest.fixture(scope="module")
def status_writer(admission: Admission) -> Iterator[Identity]:
    yield admission.grant("status-writer", [_rule("pods/status", "patch", "update")])
    admission.revoke("status-writer")


@pytest.fixture(scope="module")
def binder(admission: Admission) -> Iterator[Identity]:
    yield admission.grant("binder", [_rule("pods/binding", "create"), _rule("bindings", "create")])
    admission.revoke("binder")


@pytest.fixture(scope="module")
def agent(admission: Admission) -> Iterator[Identity]:
    """The agent's own token, its ServiceAccount granted every subresource above on top of its role."""
    yield admission.grant("agent-extra", AGENT_GRANT, to_agent=True)
    admission.revoke("agent-extra")


def _path(name: str, namespace: str = TENANT_NS, sub: str = "") -> str:
    return f"/api/v1/namespaces/{namespace}/pods/{name}" + (f"/{sub}" if sub else "")


def _tenant_pod(a: Admission, name: str, node: str = "") -> str:
    """A tenant's pod, made by the admin: bound to ``node``, or pending and left so."""
    manifest = pod_manifest(name, namespace=TENANT_NS, labels={TEST_LABEL: "1"})
    manifest["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "100m"}, "limits": {"cpu": "100m"}}
    if node:
        manifest["spec"]["nodeName"] = node
    else:
        # No scheduler answers to this name: the pod stays pending, to be bound by hand.
        manifest["spec"]["schedulerName"] = "gs-adm-nobody"
    assert a.create(None, manifest, dry_run=False) == ""
    return name


def _status(a: Admission, who: Identity, name: str, metadata: dict[str, Any], namespace: str = TENANT_NS) -> str:
    return a.call(who, "PATCH", _path(name, namespace, "status"), {"metadata": metadata}, content_type=MERGE)


def _binding(name: str, node: str, **meta: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name, "namespace": TENANT_NS, **meta},
        "target": {"kind": "Node", "name": node},
    }


def test_pods_status_writes_no_record_but_the_agents(admission: Admission, status_writer: Identity) -> None:
    """A holder of pods/status can neither forge, change nor remove the agent's record on a tenant's
    pod, nor touch the records on a shadow; the rest of the metadata stays writable to it."""
    a = admission
    name = _tenant_pod(a, "st-record", a.cluster.node_name)
    ref = a.ref(name)
    set_it = _status(a, status_writer, name, {"annotations": {OWNER: OWNER_RECORD}})
    assert f"{PODS}{TENANT_NS}/{name} (through pods/status): {RECORD_RULE}" in set_it, set_it
    assert "system:serviceaccount:gs-adm-tenant:status-writer may neither set, change nor remove it" in set_it

    assert a.by_agent(a.agent, lambda c: c.patch_pod_annotations(ref, {OWNER: OWNER_RECORD})) == ""
    changed = _status(a, status_writer, name, {"annotations": {OWNER: "{}"}})
    removed = _status(a, status_writer, name, {"annotations": {OWNER: None}})
    for error in (changed, removed):
        assert f"(through pods/status): {RECORD_RULE}" in error, error
    assert (a.pod(name)["metadata"].get("annotations") or {}).get(OWNER) == OWNER_RECORD

    assert _status(a, status_writer, name, {"annotations": {"team": "blue"}}) == ""


def test_pods_status_writes_no_shadow_label(admission: Admission, status_writer: Identity, far_shadow: str) -> None:
    a = admission
    name = _tenant_pod(a, "st-label", OTHER_NODE)
    labelled = _status(a, status_writer, name, {"labels": {keys.LABEL_ROLE: keys.ROLE_SHADOW}})
    assert f"{PODS}{TENANT_NS}/{name} (through pods/status) sets the label {keys.LABEL_ROLE}" in labelled, labelled

    where = f"{PODS}{NAMESPACE}/{far_shadow} (through pods/status): "
    respec = _status(a, status_writer, far_shadow, {"labels": {keys.LABEL_SHARE_SPEC: "2"}}, NAMESPACE)
    unrole = _status(a, status_writer, far_shadow, {"labels": {keys.LABEL_ROLE: None}}, NAMESPACE)
    assert f"{where}the label {keys.LABEL_SHARE_SPEC} marks a shadow pod" in respec, respec
    assert f"{where}the label {keys.LABEL_ROLE} marks a shadow pod" in unrole, unrole
    users = _status(a, status_writer, far_shadow, {"annotations": {keys.ANNOTATION_SHADOW_USERS: "{}"}}, NAMESPACE)
    assert f"{where}the annotation {keys.ANNOTATION_SHADOW_USERS} is a record only" in users, users


def test_pods_status_by_the_agent_keeps_to_the_per_node_rule(
    admission: Admission, agent: Identity, far_shadow: str
) -> None:
    """Through pods/status as through the pod itself: its records on its own node's pods and on
    shadows are the agent's to write; a pod of another node, and anything on a shadow but its
    records, are not."""
    a = admission
    here = _tenant_pod(a, "st-here", a.cluster.node_name)
    away = _tenant_pod(a, "st-away", OTHER_NODE)
    assert _status(a, agent, here, {"annotations": {OWNER: OWNER_RECORD}}) == ""
    refused = _status(a, agent, away, {"annotations": {OWNER: OWNER_RECORD}})
    assert (
        f"{NODE}{a.cluster.node_name} may not update pod {TENANT_NS}/{away} (through pods/status), "
        f"which is bound to node {OTHER_NODE}"
    ) in refused, refused

    users = {keys.ANNOTATION_SHADOW_USERS: "{}"}
    assert _status(a, agent, far_shadow, {"annotations": users}, NAMESPACE) == ""
    relabel = _status(a, agent, far_shadow, {"labels": {keys.LABEL_SHARE_SPEC: "2"}}, NAMESPACE)
    assert f"may not change the labels of shadow {NAMESPACE}/{far_shadow} (through pods/status)" in relabel, relabel
    # The other node's agent would see its shadow fail and evict every sharer on it.
    failed = a.call(
        agent, "PATCH", _path(far_shadow, NAMESPACE, "status"), {"status": {"phase": "Failed"}}, content_type=MERGE
    )
    assert f"may not change the status of shadow {NAMESPACE}/{far_shadow} (through pods/status)" in failed, failed


def test_a_binding_carries_no_record_and_no_shadow_label(admission: Admission, binder: Identity) -> None:
    """A Binding's annotations (and, with the PodTopologyLabelsAdmission gate, its labels) are merged
    into the pod it binds; the scheduler's own, which carry none, still go through."""
    a = admission
    name = _tenant_pod(a, "pending")
    node = a.cluster.node_name
    sub = _path(name, sub="binding")
    legacy = f"/api/v1/namespaces/{TENANT_NS}/bindings"

    record = _binding(name, node, annotations={OWNER: OWNER_RECORD})
    for path, via in ((sub, "through pods/binding"), (legacy, "through a Binding")):
        error = a.call(binder, "POST", path, record)
        assert f"{PODS}{TENANT_NS}/{name} ({via}): {RECORD_RULE}" in error, error

    labelled = a.call(binder, "POST", sub, _binding(name, node, labels={keys.LABEL_ROLE: keys.ROLE_SHADOW}))
    assert f"{PODS}{TENANT_NS}/{name} (through pods/binding) sets the label {keys.LABEL_ROLE}" in labelled, labelled
    dind_key = keys.POD_ANNOTATION_DEVICES_FROM_PREFIX + "app"
    dind = a.call(binder, "POST", sub, _binding(name, node, annotations={dind_key: "other"}))
    assert f"the Docker-in-Docker annotation {dind_key} is checked against the containers of the pod" in dind, dind

    assert a.call(binder, "POST", sub, _binding(name, node)) == ""
    assert a.call(binder, "POST", legacy, _binding(name, node, annotations={"team": "blue"})) == ""


def test_the_agent_neither_binds_nor_evicts_nor_execs(admission: Admission, agent: Identity, far_shadow: str) -> None:
    """None of these shows the pod to the policy, and the agent needs none: a Binding to its own node
    would bring another tenant's pending pod, and the Secrets it mounts, to the taken node."""
    a = admission
    me = a.cluster.node_name
    pending = _tenant_pod(a, "pending-agent")
    for path in (_path(pending, sub="binding"), f"/api/v1/namespaces/{TENANT_NS}/bindings"):
        error = a.call(agent, "POST", path, _binding(pending, me))
        assert f"{NODE}{me} may not bind pod {TENANT_NS}/{pending}; the agent never binds" in error, error

    here = _tenant_pod(a, "evict-here", me)
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": here, "namespace": TENANT_NS},
        "deleteOptions": {"dryRun": ["All"]},
    }
    evicted = a.call(agent, "POST", _path(here, sub="eviction"), eviction)
    assert f"{NODE}{me} may not evict pod {TENANT_NS}/{here}" in evicted, evicted

    exec_query = {"command": "true", "stdout": "true"}
    execed = a.call(agent, "POST", _path(far_shadow, NAMESPACE, "exec"), query=exec_query, dry_run=False)
    assert f"{NODE}{me} may not open pods/exec of pod {NAMESPACE}/{far_shadow}" in execed, execed


def test_ephemeral_containers_and_resize_keep_to_the_rules(
    admission: Admission, agent: Identity, far_shadow: str
) -> None:
    """An ephemeral container in a shadow would run the agent's choice of code on the shadow's node;
    a resize is a write like any other, and stays on the agent's own node."""
    a = admission
    debug = {"spec": {"ephemeralContainers": [{"name": "debug", "image": "busybox", "command": ["sh"]}]}}
    path = _path(far_shadow, NAMESPACE, "ephemeralcontainers")
    added = a.call(agent, "PATCH", path, debug, content_type=STRATEGIC)
    assert (
        f"{NODE}{a.cluster.node_name} may not change spec.ephemeralContainers of shadow "
        f"{NAMESPACE}/{far_shadow} (through pods/ephemeralcontainers)"
    ) in added, added

    away = _tenant_pod(a, "resize-away", OTHER_NODE)
    cpu = {"requests": {"cpu": "200m"}, "limits": {"cpu": "200m"}}
    resize = {"spec": {"containers": [{"name": "app", "resources": cpu}]}}
    resized = a.call(agent, "PATCH", _path(away, sub="resize"), resize, content_type=STRATEGIC)
    assert (
        f"may not update pod {TENANT_NS}/{away} (through pods/resize), which is bound to node {OTHER_NODE}"
    ) in resized, resized
