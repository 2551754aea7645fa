"""gpushare-pods, as a tenant meets it: every mix of GPU requests has one outcome, and the agent's
records and the shadow labels are not the tenant's to write (docs/security.md has the same table)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from gpushare import keys, rules
from localcluster.agent import FAKE_RESOURCE
from localcluster.pods import pod_manifest
from tests.harness.worlds.agent_pod import NAMESPACE
from tests.integration.admission.conftest import OTHER_NODE, TENANT_NS, TEST_LABEL, Admission

SPOT = keys.RESOURCE_SPOT_GPU
SHARE2 = keys.share_resource(keys.KIND_SHARE, 2)
SHARE4 = keys.share_resource(keys.KIND_SHARE, 4)
DEV4 = keys.share_resource(keys.KIND_SHARE_DEV, 4)
REAL = FAKE_RESOURCE  # the chart's config.realResources on this cluster
DIND = keys.POD_ANNOTATION_DEVICES_FROM_PREFIX
DENIED = "ValidatingAdmissionPolicy 'gpushare-pods' with binding 'gpushare-pods' denied request: gpushare: pod "

Containers = list[tuple[str, dict[str, str]]]


def pod(
    name: str,
    containers: Containers,
    *,
    init: Containers | None = None,
    sidecars: Containers | None = None,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    namespace: str = TENANT_NS,
    node: str = "",
) -> dict[str, Any]:
    def spec(c: str, resources: dict[str, str]) -> dict[str, Any]:
        return {"name": c, "image": "busybox", **({"resources": {"limits": resources}} if resources else {})}

    body: dict[str, Any] = {"containers": [spec(c, r) for c, r in containers]}
    # Sidecars first: a plain init container after one is still refused, naming itself.
    inits = [{**spec(c, r), "restartPolicy": "Always"} for c, r in sidecars or ()] + [spec(c, r) for c, r in init or ()]
    if inits:
        body["initContainers"] = inits
    if node:
        body["nodeName"] = node
    meta = {"name": name, "namespace": namespace, "labels": {TEST_LABEL: "1", **(labels or {})}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {**meta, "annotations": annotations or {}}, "spec": body}


# (id, pod, the fragments the refusal must carry; () when the pod is admitted)
MIXES: list[tuple[str, dict[str, Any], tuple[str, ...]]] = [
    (
        "spot and share in one container",
        pod("mix", [("app", {SPOT: "1", SHARE4: "1"})]),
        ("asks for gpushare/spot-gpu and gpushare/share-gpu-4", "separate pods"),
    ),
    (
        "spot and share in two containers",
        pod("mix", [("train", {SPOT: "1"}), ("serve", {SHARE4: "1"})]),
        ("asks for gpushare/spot-gpu and gpushare/share-gpu-4",),
    ),
    (
        "spot in an init container, share in the app",
        pod("mix", [("app", {SHARE4: "1"})], init=[("warmup", {SPOT: "1"})]),
        ("asks for gpushare/spot-gpu and gpushare/share-gpu-4",),
    ),
    (
        "two share specs",
        pod("mix", [("a", {SHARE2: "1"}), ("b", {SHARE4: "1"})]),
        (SHARE2, SHARE4, "one kind and spec"),
    ),
    (
        "share-gpu and share-dev-gpu",
        pod("mix", [("app", {SHARE4: "1", DEV4: "1"})]),
        (SHARE4, DEV4, "one kind and spec"),
    ),
    (
        "a share and the vendor resource in two containers",
        pod("mix", [("serve", {SHARE4: "1"}), ("train", {REAL: "1"})]),
        (f"asks for {SHARE4} and {REAL}", "evicted whole when its shadow goes"),
    ),
    (
        "a share and the vendor resource in one container",
        pod("mix", [("app", {SHARE4: "1", REAL: "1"})]),
        (f"asks for {SHARE4} and {REAL}",),
    ),
    (
        "spot and the vendor resource",
        pod("mix", [("app", {SPOT: "1"}), ("keep", {REAL: "1"})]),
        (f"asks for gpushare/spot-gpu and {REAL}", "its own GPU would go with it"),
    ),
    (
        "a Docker-in-Docker target that asks for a share itself",
        pod("mix", [("main", {SHARE4: "1"}), ("dind", {SHARE4: "1"})], annotations={DIND + "dind": "main"}),
        ('container "dind" is named by the annotation gpushare.k8s.io/container-devices-from.dind',),
    ),
    (
        "a Docker-in-Docker target that asks for the vendor resource itself",
        pod("mix", [("main", {REAL: "1"}), ("dind", {REAL: "1"})], annotations={DIND + "dind": "main"}),
        ('container "dind" is named by the annotation', "remove the resource"),
    ),
    (
        "a share in an init container that is not a sidecar",
        pod("mix", [("app", {})], init=[("warmup", {SHARE4: "1"})]),
        (f'init container "warmup" asks for {SHARE4}', 'make "warmup" a sidecar (restartPolicy: Always)'),
    ),
    (
        "spot in an init container that is not a sidecar",
        pod("mix", [("app", {})], init=[("warmup", {SPOT: "1"})]),
        (f'init container "warmup" asks for {SPOT}', "kubelet does not report the devices"),
    ),
    (
        "a plain init container after a sidecar, both asking for the share the app asks",
        pod("mix", [("app", {SHARE4: "1"})], sidecars=[("proxy", {SHARE4: "1"})], init=[("warmup", {SHARE4: "1"})]),
        (f'init container "warmup" asks for {SHARE4}',),
    ),
    # The mixes come first, on the node as in the policy.
    (
        "a share in a plain init container and the vendor resource in the app",
        pod("mix", [("app", {REAL: "1"})], init=[("warmup", {SHARE4: "1"})]),
        (f"asks for {SHARE4} and {REAL}",),
    ),
    ("one share spec in two containers", pod("ok", [("a", {SHARE4: "1"}), ("b", {SHARE4: "1"})]), ()),
    ("a share in a sidecar", pod("ok", [("app", {})], sidecars=[("proxy", {SHARE4: "1"})]), ()),
    ("the vendor resource in a plain init container", pod("ok", [("app", {})], init=[("warmup", {REAL: "1"})]), ()),
    ("spot in two containers", pod("ok", [("a", {SPOT: "1"}), ("b", {SPOT: "1"})]), ()),
    (
        "a sharer with a Docker-in-Docker target",
        pod("ok", [("main", {SHARE4: "1"}), ("dind", {})], annotations={DIND + "dind": "main"}),
        (),
    ),
    (
        "a borrower with a Docker-in-Docker target",
        pod("ok", [("main", {SPOT: "1"}), ("dind", {})], annotations={DIND + "dind": "_/_/main"}),
        (),
    ),
    (
        "a whole GPU with a Docker-in-Docker target",
        pod("ok", [("main", {REAL: "1"}), ("dind", {})], annotations={DIND + "dind": "main"}),
        (),
    ),
]


@pytest.mark.parametrize("manifest, fragments", [pytest.param(m, f, id=i) for i, m, f in MIXES])
def test_each_mix_of_requests_has_one_outcome(
    admission: Admission, manifest: dict[str, Any], fragments: tuple[str, ...]
) -> None:
    error = admission.create(admission.tenant, manifest)
    node = node_refusal(manifest)
    if not fragments:
        assert error == "", error
        assert node is None, node  # the node runs what the policy admits
        return
    assert f"is invalid: : {DENIED}{TENANT_NS}/mix" in error, error
    for fragment in fragments:
        assert fragment in error, (fragment, error)
    # The node refuses it too, when the policy is off or only warns, and in the policy's words.
    assert node is not None, manifest
    head, words = node.split("; ", 1)
    assert words in error, (words, error)
    assert all(r in error for r in re.findall(r"\S+/\S+", head.split(" asks for ", 1)[-1])), (head, error)


def node_refusal(manifest: dict[str, Any]) -> str | None:
    """What the node's rule says of this pod, as the agent reads it (every container, init ones too)."""
    spec = manifest["spec"]
    inits = spec.get("initContainers", ())
    containers = [
        (c["name"], list((c.get("resources") or {}).get("limits") or {})) for c in (*spec["containers"], *inits)
    ]
    plain = [c["name"] for c in inits if c.get("restartPolicy") != "Always"]
    pod = f"{manifest['metadata']['namespace']}/{manifest['metadata']['name']}"
    return rules.refused_mix(pod, containers, manifest["metadata"].get("annotations") or {}, [REAL], plain)


OWNER_RECORD = '{"gpushare-system/shadow-x":"0b4c1d0e-0000-4000-8000-000000000000"}'

# (id, who, pod, the fragment of the refusal; "" when admitted). "admin" is the cluster's admin.
RESERVED_ON_CREATE: list[tuple[str, str, dict[str, Any], str]] = [
    (
        "tenant sets the agent's owner record",
        "tenant",
        pod("forged", [("app", {SHARE4: "1"})], annotations={keys.ANNOTATION_SHADOW_OWNER: OWNER_RECORD}),
        f"the annotation {keys.ANNOTATION_SHADOW_OWNER} is a record only the gpushare agent",
    ),
    (
        "tenant sets the agent's users record",
        "tenant",
        pod("forged", [("app", {})], annotations={keys.ANNOTATION_SHADOW_USERS: "{}"}),
        f"the annotation {keys.ANNOTATION_SHADOW_USERS} is a record only the gpushare agent",
    ),
    (
        "tenant labels its pod a shadow",
        "tenant",
        pod("forged", [("app", {REAL: "1"})], labels={keys.LABEL_ROLE: keys.ROLE_SHADOW}),
        f"sets the label {keys.LABEL_ROLE}, which marks the shadow pods of gpushare",
    ),
    (
        "tenant sets a shadow's spec label",
        "tenant",
        pod("forged", [("app", {})], labels={keys.LABEL_SHARE_SPEC: "4"}),
        f"sets the label {keys.LABEL_SHARE_SPEC}",
    ),
    (
        "admin makes a shadow by hand",
        "admin",
        pod("forged", [("main", {REAL: "1"})], namespace=NAMESPACE, labels={keys.LABEL_ROLE: keys.ROLE_SHADOW}),
        f"the label {keys.LABEL_ROLE} marks a shadow pod, which only the gpushare agent",
    ),
    # The agent's shadow is build_shadow_manifest's own (test_shadow_shape.py), made in the test.
    ("the agent makes a shadow", "agent", {}, ""),
]


@pytest.mark.parametrize("who, manifest, fragment", [pytest.param(w, m, f, id=i) for i, w, m, f in RESERVED_ON_CREATE])
def test_reserved_keys_on_create(admission: Admission, who: str, manifest: dict[str, Any], fragment: str) -> None:
    if who == "agent":
        shadow = admission.shadow()
        shadow["metadata"]["annotations"] = {keys.ANNOTATION_SHADOW_USERS: "{}"}
        error = admission.create_by_agent(admission.agent, shadow)
    else:
        error = admission.create(admission.tenant if who == "tenant" else None, manifest)
    if not fragment:
        assert error == "", error
        return
    assert "is forbidden: ValidatingAdmissionPolicy 'gpushare-pods'" in error and fragment in error, error


def _annotations(a: Admission, name: str) -> dict[str, str]:
    found: dict[str, str] = a.pod(name)["metadata"].get("annotations") or {}
    return found


def test_reserved_keys_on_update(admission: Admission) -> None:
    """The agent writes its record on a pod of its node; the tenant can neither forge, change nor
    remove it, nor make its pod a shadow, but the rest of its pod stays its own to edit."""
    a = admission
    own = pod_manifest("own", namespace=TENANT_NS, labels={TEST_LABEL: "1"})
    own["spec"]["nodeName"] = a.cluster.node_name
    assert a.create(a.tenant, own, dry_run=False) == ""
    annotate = ["annotate", "pod", "-n", TENANT_NS, "own"]
    record = f"{keys.ANNOTATION_SHADOW_OWNER}={OWNER_RECORD}"

    forged = a.run(a.tenant, *annotate, record)
    assert f"is forbidden: {DENIED}{TENANT_NS}/own: the annotation {keys.ANNOTATION_SHADOW_OWNER}" in forged, forged
    assert "may neither set, change nor remove it" in forged, forged
    ref, written = a.ref("own"), {keys.ANNOTATION_SHADOW_OWNER: OWNER_RECORD}
    assert a.by_agent(a.agent, lambda c: c.patch_pod_annotations(ref, written)) == ""
    assert _annotations(a, "own")[keys.ANNOTATION_SHADOW_OWNER] == OWNER_RECORD

    changed = a.run(a.tenant, *annotate, "--overwrite", f"{keys.ANNOTATION_SHADOW_OWNER}={{}}")
    removed = a.run(a.tenant, *annotate, f"{keys.ANNOTATION_SHADOW_OWNER}-")
    for error in (changed, removed):
        assert f"the annotation {keys.ANNOTATION_SHADOW_OWNER} is a record only the gpushare agent" in error, error
    assert _annotations(a, "own")[keys.ANNOTATION_SHADOW_OWNER] == OWNER_RECORD

    assert a.run(a.tenant, *annotate, "team=blue") == ""  # the record rides along unchanged
    assert _annotations(a, "own")["team"] == "blue"

    labelled = a.run(a.tenant, "label", "pod", "-n", TENANT_NS, "own", f"{keys.LABEL_ROLE}={keys.ROLE_SHADOW}")
    assert f"own sets the label {keys.LABEL_ROLE}, which marks the shadow pods" in labelled, labelled


def test_a_docker_in_docker_annotation_added_later(admission: Admission) -> None:
    """Annotations change after creation: a DinD target named later is checked like one named at creation."""
    a = admission
    gpu = pod("dind-later", [("main", {REAL: "1"}), ("dind", {})], node=OTHER_NODE)
    assert a.create(a.tenant, gpu, dry_run=False) == ""
    annotate = ["annotate", "pod", "-n", TENANT_NS, "dind-later"]
    refused = a.run(a.tenant, *annotate, f"{DIND}main=dind")
    assert 'container "main" is named by the annotation gpushare.k8s.io/container-devices-from.main' in refused, refused
    assert a.run(a.tenant, *annotate, f"{DIND}dind=main") == ""


def test_the_control_planes_namespace_is_outside_the_pods_policy(admission: Admission) -> None:
    """kube-system is excluded (admission.excludedNamespaces): a pod the policy refuses anywhere
    else is admitted there, so a policy that cannot be evaluated never holds up the control plane."""
    labels = {keys.LABEL_ROLE: keys.ROLE_SHADOW}
    elsewhere = admission.create(None, pod("forged", [("app", {})], labels=labels))
    assert "ValidatingAdmissionPolicy 'gpushare-pods'" in elsewhere, elsewhere
    assert admission.create(None, pod("forged", [("app", {})], labels=labels, namespace="kube-system")) == ""
