"""gpushare-agent-node on shadows, with the real token of the DaemonSet's pod: the very manifest
build_shadow_manifest makes from the agent's config is admitted, every way a "shadow" could hold
more than one GPU on a node of the scheduler's choosing is refused, and a shadow once made changes
only by the agent's records. A node's agent may make shadows for any node (the Lease holder's
work), so a shadow with more in it would be a taken node's way onto the others."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest

from controller.core.share_key import Pool
from gpushare import keys
from localcluster.agent import FAKE_RESOURCE
from tests.harness.worlds.agent_pod import NAMESPACE
from tests.integration.admission.conftest import AGENT_SA, FAR_SHADOW_ORDINAL, NOWHERE, OTHER_NODE, Admission

POLICY = "'gpushare-agent-node'"
DENIED = f"ValidatingAdmissionPolicy {POLICY} with binding {POLICY} denied request: gpushare: the agent of node "
SHAPE = "A shadow is what the agent makes of one (design §3)"
FIXED = "a shadow is fixed when it is created (a new image would run other code on its node)"

Change = Callable[[dict[str, Any], str], None]  # (the manifest, this node's name)


def _main(m: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = m["spec"]["containers"][0]
    return container


def _set(path: str, value: Any) -> Change:
    """Set spec.<path> (dots into maps, a number into a list) to ``value``."""

    def change(m: dict[str, Any], _node: str) -> None:
        *head, last = path.split(".")
        at: Any = m["spec"]
        for part in head:
            at = at[int(part)] if part.isdigit() else at[part]
        at[last] = copy.deepcopy(value)

    return change


def _host_volume(m: dict[str, Any], _node: str) -> None:
    m["spec"]["volumes"] = [{"name": "host", "hostPath": {"path": "/"}}]
    _main(m)["volumeMounts"] = [{"name": "host", "mountPath": "/host"}]


def _extra_container(m: dict[str, Any], _node: str) -> None:
    m["spec"]["containers"].append({**copy.deepcopy(_main(m)), "name": "side"})


def _label(key: str, value: str) -> Change:
    def change(m: dict[str, Any], _node: str) -> None:
        m["metadata"]["labels"][key] = value

    return change


def _annotation(key: str, value: str) -> Change:
    def change(m: dict[str, Any], _node: str) -> None:
        m["metadata"].setdefault("annotations", {})[key] = value

    return change


def _own_node(m: dict[str, Any], node: str) -> None:
    m["spec"]["nodeName"] = node


# (id, the change to build_shadow_manifest's shadow, the fault the refusal must name)
FORBIDDEN: list[tuple[str, Change, str]] = [
    # privileged with allowPrivilegeEscalation false is invalid before admission is asked.
    ("privileged", _set("containers.0.securityContext", {"privileged": True}), "its container is privileged"),
    ("runs as root", _set("containers.0.securityContext.runAsUser", 0), "the securityContext of its container is not"),
    ("hostPID", _set("hostPID", True), "it shares a namespace of its node (spec.hostPID)"),
    ("hostNetwork", _set("hostNetwork", True), "it shares a namespace of its node (spec.hostNetwork)"),
    ("hostIPC", _set("hostIPC", True), "it shares a namespace of its node (spec.hostIPC)"),
    ("a hostPath volume", _host_volume, "it mounts volumes (spec.volumes)"),
    (
        "the agent's ServiceAccount",
        _set("serviceAccountName", AGENT_SA),
        f"it runs as the ServiceAccount {AGENT_SA} (spec.serviceAccountName), not default",
    ),
    ("a ServiceAccount token", _set("automountServiceAccountToken", True), "it mounts a ServiceAccount token"),
    ("an extra container", _extra_container, "it has 2 containers (spec.containers)"),
    (
        "an init container",
        _set("initContainers", [{"name": "init", "image": "busybox", "command": ["true"]}]),
        "it has more containers (spec.initContainers)",
    ),
    ("bound to another node", _set("nodeName", OTHER_NODE), f"it is bound to node {OTHER_NODE} (spec.nodeName)"),
    ("bound to its own node", _own_node, "(spec.nodeName), where the scheduler places a shadow"),
    ("another image", _set("containers.0.image", "busybox"), "its image is busybox, not the shadowImage"),
    ("a command", _set("containers.0.command", ["sh", "-c", "sleep 1d"]), "its container sets command"),
    ("two GPUs", _set("containers.0.resources", {"limits": {FAKE_RESOURCE: "2"}}), "it asks for other than one GPU"),
    ("a pod securityContext", _set("securityContext", {"runAsUser": 0}), "it sets a pod securityContext"),
    ("a toleration of every taint", _set("tolerations", [{"operator": "Exists"}]), "it tolerates every taint"),
    ("another PriorityClass", _set("priorityClassName", "gpushare-spot"), "its PriorityClass is not gpushare-shadow"),
    ("another label", _label("app", "x"), "it carries the label app"),
    ("a share the config does not serve", _label(keys.LABEL_SHARE_SPEC, "7"), "name no share the config serves"),
    (
        "an annotation that is not a record",
        _annotation("container.apparmor.security.beta.kubernetes.io/main", "unconfined"),
        "it carries the annotation container.apparmor.security.beta.kubernetes.io/main",
    ),
]


def test_the_shadows_the_agent_makes_are_admitted(admission: Admission) -> None:
    """Every kind and spec the config serves, in the default pool and a narrowed one: the shape the
    policy allows and the one build_shadow_manifest makes are the same."""
    a = admission
    cfg = a.config()
    made = [a.shadow(kind=keys.KIND_SHARE, spec=n, pool=Pool(FAKE_RESOURCE)) for n in cfg.share_specs]
    made += [a.shadow(kind=keys.KIND_SHARE_DEV, spec=n, pool=Pool(FAKE_RESOURCE)) for n in cfg.dev_share_specs]
    made.append(a.shadow(pool=NOWHERE))
    assert made[-1]["spec"]["nodeSelector"] == dict(NOWHERE.node_selector)
    with_record = copy.deepcopy(made[0])
    with_record["metadata"]["annotations"] = {keys.ANNOTATION_SHADOW_USERS: "{}"}
    for manifest in (*made, with_record):
        assert a.create_by_agent(a.agent, manifest) == "", manifest["metadata"]


@pytest.mark.parametrize("change, fault", [pytest.param(c, f, id=i) for i, c, f in FORBIDDEN])
def test_a_shadow_of_another_shape_is_refused(admission: Admission, change: Change, fault: str) -> None:
    a = admission
    manifest = a.shadow(ordinal=1)
    change(manifest, a.cluster.node_name)
    error = a.create_by_agent(a.agent, manifest)
    name = manifest["metadata"]["name"]
    assert f"{DENIED}{a.cluster.node_name} may not create shadow {NAMESPACE}/{name}: " in error, error
    assert fault in error and SHAPE in error, (fault, error)


def _json_patch(*ops: dict[str, Any]) -> tuple[Any, str]:
    return list(ops), "application/json-patch+json"


def _merge(doc: dict[str, Any]) -> tuple[Any, str]:
    return doc, "application/merge-patch+json"


# (id, the patch the agent sends, the change the refusal must name)
CHANGES: list[tuple[str, tuple[Any, str], str]] = [
    (
        "an image",
        _json_patch({"op": "replace", "path": "/spec/containers/0/image", "value": "busybox"}),
        "the image of a container (spec.containers)",
    ),
    ("a spec field", _merge({"spec": {"activeDeadlineSeconds": 1}}), "spec.activeDeadlineSeconds"),
    (
        "a toleration",
        _json_patch({"op": "add", "path": "/spec/tolerations/-", "value": {"operator": "Exists"}}),
        "spec.tolerations",
    ),
    ("a shadow label", _merge({"metadata": {"labels": {keys.LABEL_SHARE_SPEC: "2"}}}), "the labels"),
    ("the role label, removed", _merge({"metadata": {"labels": {keys.LABEL_ROLE: None}}}), "the labels"),
    ("another label", _merge({"metadata": {"labels": {"app": "x"}}}), "the labels"),
    ("an annotation", _merge({"metadata": {"annotations": {"example.com/x": "1"}}}), "the annotation example.com/x"),
]


@pytest.mark.parametrize("patch, fault", [pytest.param(p, f, id=i) for i, p, f in CHANGES])
def test_a_shadow_changes_only_by_the_records(
    admission: Admission, far_shadow: str, patch: tuple[Any, str], fault: str
) -> None:
    a = admission
    body, content_type = patch
    path = f"/api/v1/namespaces/{NAMESPACE}/pods/{far_shadow}"
    error = a.call(a.agent, "PATCH", path, body, content_type=content_type)
    assert f"{DENIED}{a.cluster.node_name} may not change " in error, error
    assert f"{fault} of shadow {NAMESPACE}/{far_shadow}; {FIXED}" in error, (fault, error)


def test_the_records_on_a_shadow_are_the_agents_to_write(admission: Admission, far_shadow: str) -> None:
    """What the Lease holder and the shadow's node write on a shadow wherever it is: its users, the
    drain's mark and its answer. The shadow itself stays as it was made."""
    a = admission
    path = f"/api/v1/namespaces/{NAMESPACE}/pods/{far_shadow}"
    records = {
        keys.ANNOTATION_SHADOW_USERS: "{}",
        keys.ANNOTATION_SHADOW_DRAINING: "t1",
        keys.ANNOTATION_SHADOW_DRAINED: "t1",
    }
    for key, value in records.items():
        body, content_type = _merge({"metadata": {"annotations": {key: value}}})
        assert a.call(a.agent, "PATCH", path, body, content_type=content_type) == "", key
    stored = a.pod(far_shadow, NAMESPACE)
    made = a.shadow(ordinal=FAR_SHADOW_ORDINAL)
    assert stored["metadata"]["labels"] == made["metadata"]["labels"]
    assert _main(stored)["image"] == _main(made)["image"]
    assert json.dumps(_main(stored)["securityContext"], sort_keys=True) == json.dumps(
        _main(made)["securityContext"], sort_keys=True
    )


def test_the_agent_makes_no_other_pod_a_shadow(admission: Admission) -> None:
    """Shadow labels are written once, on a shadow being made: the agent's own pod, on its own node
    and in gpushare-system, stays what it is (as a "shadow" any node's agent could rewrite it)."""
    a = admission
    name = a.agent_pod["metadata"]["name"]
    body, content_type = _merge({"metadata": {"labels": {keys.LABEL_ROLE: keys.ROLE_SHADOW}}})
    error = a.call(a.agent, "PATCH", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}", body, content_type=content_type)
    assert (
        f"{DENIED}{a.cluster.node_name} may not change the label {keys.LABEL_ROLE} of pod {NAMESPACE}/{name}" in error
    )
    assert "the agent writes shadow labels only on the shadows it creates" in error, error
