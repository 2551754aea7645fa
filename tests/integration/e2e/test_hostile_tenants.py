"""Hostile tenants on the live cluster: whatever a tenant writes into its own pods, the outcome is
a refusal with a clear message or an effect on the tenant's own pods only (docs/security.md,
"Tested hostile scenarios").

Every scenario checks the safe outcome where it shows: the refusal's message, the pod's phase,
the devices each container sees (``ls /dev`` and the visibility variable, inside the container),
the Events, and that the agent is still healthy and still reconciling (its pass counter
advances). One victim sharer of another tenant runs for the whole module and must come through
untouched: same uid, still Running, still seeing exactly its one GPU, never evicted.

The module keeps its own pods (and so the victim's shadow) between its tests instead of the
``e2e`` fixture's clean slate, which would delete the victim's shadow after each test.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gpushare import keys
from localcluster.agent import FAKE_RESOURCE
from localcluster.pods import pod_manifest, sharer
from tests.integration.e2e.conftest import Env, _clean
from tests.integration.e2e.test_sharing import DEV_SCRIPT, _owner

VICTIM_NS = "gs-hostile-victim"
TENANT_NS = "gs-hostile"
VICTIM = "victim"


class Victim:
    """The other tenant's sharer, and what must stay as it is."""

    def __init__(self, e: Env) -> None:
        self.e = e
        e.start_pods([sharer(VICTIM, namespace=VICTIM_NS)])
        pod = e.cluster.pod(VICTIM, VICTIM_NS) or {}
        self.uid = pod["metadata"]["uid"]
        recorded(e, VICTIM, VICTIM_NS)
        self.devices = self.sees()
        assert len(self.devices[0].split()) == 1, self.devices

    def sees(self) -> tuple[str, str]:
        devs, visible = e_exec(self.e, VICTIM, "app", VICTIM_NS).split("\n")[:2]
        return devs.strip(), visible

    def unchanged(self) -> None:
        pod = self.e.cluster.pod(VICTIM, VICTIM_NS)
        assert pod is not None and pod["metadata"]["uid"] == self.uid, "the victim was deleted"
        assert not pod["metadata"].get("deletionTimestamp"), "the victim is being evicted"
        assert pod["status"]["phase"] == "Running", pod["status"]
        assert self.sees() == self.devices, "the victim's devices changed"
        evictions = [ev for ev in self.e.agent.status()["evictions"] if ev["pod"].startswith(VICTIM_NS + "/")]
        assert not evictions, evictions


def recorded(e: Env, name: str, namespace: str) -> str:
    """The shadow the agent recorded as holding the sharer's slot, once it has written the record."""

    def has_record() -> bool:
        pod = e.cluster.pod(name, namespace) or {}
        return keys.ANNOTATION_SHADOW_OWNER in (pod["metadata"].get("annotations") or {})

    e.wait(f"{namespace}/{name}'s owner record", has_record, 30)
    return _owner(e.cluster.pod(name, namespace) or {})


def e_exec(e: Env, pod: str, container: str, namespace: str) -> str:
    return e.exec(pod, container, DEV_SCRIPT, namespace=namespace)


@pytest.fixture(scope="module")
def victim(env: Env) -> Iterator[Victim]:
    if not env.agent.alive():
        env.agent.start()
    env.agent.wait_healthy()
    for ns in (VICTIM_NS, TENANT_NS):
        env.cluster.kubectl("create", "namespace", ns, check=False)
    try:
        yield Victim(env)
    finally:
        _force_clean(env, TENANT_NS)
        _clean(env.cluster)


@pytest.fixture
def hostile(env: Env, victim: Victim) -> Iterator[Env]:
    """The environment for one scenario; the tenant's pods go afterwards, the victim stays."""
    yield env
    _force_clean(env, TENANT_NS)


def _force_clean(e: Env, ns: str) -> None:
    # A pod that ignores TERM with an hour of grace would hold the teardown for an hour.
    e.cluster.kubectl("delete", "pods", "--all", "-n", ns, "--grace-period=0", "--force", "--wait=true", check=False)


def reconciling(e: Env) -> None:
    """The agent answers /healthz and its pass counter moves on."""
    assert e.agent.healthy(), e.agent.log_text()[-3000:]
    before = e.agent.status()["passes"]
    e.wait("the agent's next pass", lambda: e.agent.status()["passes"] > before, 30)


def refused(e: Env, manifest: dict[str, Any]) -> str:
    """Create the pod as a tenant would; return the API server's refusal (the test fails if it was admitted)."""
    res = e.cluster.kubectl("create", "-f", "-", input=json.dumps(manifest), check=False)
    assert res.returncode != 0, f"admitted: {manifest['metadata']['name']}"
    name = manifest["metadata"]["name"]
    assert e.cluster.pod(name, manifest["metadata"]["namespace"]) is None
    return str(res.stderr)


def refused_patch(e: Env, name: str, patch: dict[str, Any]) -> str:
    res = e.cluster.kubectl("patch", "pod", name, "-n", TENANT_NS, "--type=merge", "-p", json.dumps(patch), check=False)
    assert res.returncode != 0, f"patch admitted: {patch}"
    return str(res.stderr)


def tenant_pod(name: str, resources: dict[str, str] | None = None, **kw: Any) -> dict[str, Any]:
    return pod_manifest(name, namespace=TENANT_NS, resources=resources, **kw)


def events(e: Env, pod: str) -> dict[str, str]:
    return {ev["reason"]: ev["message"] for ev in e.events(pod, TENANT_NS)}


# --- refused at admission: nothing is created, nobody else notices -------------------------------------------


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (keys.ANNOTATION_SHADOW_OWNER, '{"gpushare-system/shadow-share-gpu-4-x-0": "forged-uid"}'),
        (keys.ANNOTATION_SHADOW_USERS, '{"gs-hostile-victim/victim/app": ["gpushare-system/x-0"]}'),
    ],
)
def test_a_forged_agent_record_on_create_is_refused(hostile: Env, victim: Victim, key: str, value: str) -> None:
    stderr = refused(hostile, tenant_pod("forger", annotations={key: value}))
    assert f"the annotation {key} is a record only the gpushare agent" in stderr, stderr
    reconciling(hostile)
    victim.unchanged()


def test_a_shadow_label_in_a_tenant_namespace_is_refused(hostile: Env, victim: Victim) -> None:
    labels = {keys.LABEL_ROLE: keys.ROLE_SHADOW, keys.LABEL_SHARE_SPEC: "4", keys.LABEL_SHARE_KIND: keys.KIND_SHARE}
    stderr = refused(hostile, tenant_pod("fake-shadow", {FAKE_RESOURCE: "1"}, labels=labels))
    assert "which marks the shadow pods of gpushare" in stderr, stderr
    reconciling(hostile)
    victim.unchanged()


@pytest.mark.parametrize(
    ("resources", "message"),
    [
        (
            {keys.RESOURCE_SPOT_GPU: "1", "gpushare/share-gpu-4": "1"},
            "asks for gpushare/spot-gpu and gpushare/share-gpu-4",
        ),
        (
            {"gpushare/share-gpu-4": "1", "gpushare/share-dev-gpu-4": "1"},
            "all the slots of a pod come from shadows of one kind",
        ),
        ({"gpushare/share-gpu-4": "1", FAKE_RESOURCE: "1"}, "run the shared and the whole-GPU work as separate pods"),
    ],
    ids=["spot+share", "share+share-dev", "share+real"],
)
def test_a_mixed_request_is_refused_with_its_message(
    hostile: Env, victim: Victim, resources: dict[str, str], message: str
) -> None:
    stderr = refused(hostile, tenant_pod("mixed", resources))
    assert message in stderr, stderr
    reconciling(hostile)
    victim.unchanged()


def test_a_docker_in_docker_target_asking_a_gpu_of_its_own_is_refused(hostile: Env, victim: Victim) -> None:
    manifest = tenant_pod(
        "dind-greedy",
        {FAKE_RESOURCE: "1"},
        containers=["main", "dind"],
        annotations={keys.POD_ANNOTATION_DEVICES_FROM_PREFIX + "main": "dind"},
    )
    stderr = refused(hostile, manifest)
    assert 'container "main" is named by the annotation' in stderr, stderr
    reconciling(hostile)


def test_annotations_flipped_after_creation_are_refused_and_change_nothing(hostile: Env, victim: Victim) -> None:
    """A running sharer tries to rewrite the agent's record of it, to take a shadow label, to make a
    GPU container a Docker-in-Docker target: each patch is refused, the pod and its GPU stay as they were."""
    hostile.start_pods([sharer("flipper", namespace=TENANT_NS)])
    before = hostile.cluster.pod("flipper", TENANT_NS) or {}
    sees = e_exec(hostile, "flipper", "app", TENANT_NS)
    forged = {keys.ANNOTATION_SHADOW_OWNER: json.dumps({victim_shadow(hostile): "forged"})}
    stderr = refused_patch(hostile, "flipper", {"metadata": {"annotations": forged}})
    assert "is a record only the gpushare agent" in stderr, stderr
    stderr = refused_patch(hostile, "flipper", {"metadata": {"labels": {keys.LABEL_ROLE: keys.ROLE_SHADOW}}})
    assert "which marks the shadow pods of gpushare" in stderr, stderr
    dind = {keys.POD_ANNOTATION_DEVICES_FROM_PREFIX + "app": "app"}
    stderr = refused_patch(hostile, "flipper", {"metadata": {"annotations": dind}})
    assert "a Docker-in-Docker target gets its GPU from its source container only" in stderr, stderr
    reconciling(hostile)
    after = hostile.cluster.pod("flipper", TENANT_NS) or {}
    assert after["metadata"]["annotations"] == before["metadata"]["annotations"]
    assert after["status"]["phase"] == "Running" and e_exec(hostile, "flipper", "app", TENANT_NS) == sees
    victim.unchanged()


def victim_shadow(e: Env) -> str:
    return _owner(e.cluster.pod(VICTIM, VICTIM_NS) or {})


# --- admitted, and it affects the tenant's own pod only ---------------------------------------------------


def test_a_visibility_variable_set_by_the_tenant_gives_no_device_and_no_holding(hostile: Env, victim: Victim) -> None:
    """The pod names the victim's GPU in the vendor's visibility variable: it sees no device node, and the
    agent never takes it for a holder of that GPU (holders come from kubelet's PodResources)."""
    gpu = victim.devices[1]
    manifest = tenant_pod("env-thief")
    manifest["spec"]["containers"][0]["env"] = [
        {"name": "FAKE_VISIBLE_DEVICES", "value": gpu},
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
    ]
    hostile.start_pods([manifest])
    devs, visible = e_exec(hostile, "env-thief", "app", TENANT_NS).split("\n")[:2]
    assert devs.strip() == "" and visible == gpu, (devs, visible)  # its own text, and no device behind it
    reconciling(hostile)
    assert "env-thief" not in json.dumps(hostile.agent.status())
    victim.unchanged()


def test_deep_json_and_unicode_digits_in_tenant_fields_leave_the_agent_reconciling(
    hostile: Env, victim: Victim
) -> None:
    """Values built to break a parser (JSON nested far past Python's recursion limit, digits that
    str.isdigit() accepts and int() refuses) in every gpushare key a tenant may write: the pass goes
    on, the pod asking for a pool nobody serves gets a Warning, and the victim notices nothing."""
    deep = "[" * 5000 + "]" * 5000
    annotations = {
        keys.ANNOTATION_POOL_RESOURCE: "example.com/gpu\u0663\u00b2",
        keys.ANNOTATION_DEVICES_FROM: deep,
        keys.ANNOTATION_DEVICES_IDS: '{"a":' * 3000 + "1" + "}" * 3000,
        "gpushare.k8s.io/anything-else": deep,
    }
    manifest = sharer("parser-breaker", namespace=TENANT_NS, annotations=annotations)
    manifest["metadata"]["labels"][keys.LABEL_LENDABLE] = "\u0663"  # not a valid label value: refused...
    res = hostile.cluster.kubectl("create", "-f", "-", input=json.dumps(manifest), check=False)
    assert res.returncode != 0 and "Invalid value" in res.stderr, res.stderr  # ...by the API server itself
    del manifest["metadata"]["labels"][keys.LABEL_LENDABLE]
    hostile.apply(manifest)
    # The leader writes this Warning while the pod waits unscheduled, its node's agent once the
    # scheduler has placed it on a free share slot (it knows no pools); a loaded node may take passes.
    hostile.wait("the unknown pool's Warning", lambda: "UnknownPoolResource" in events(hostile, "parser-breaker"), 180)
    pod = hostile.cluster.pod("parser-breaker", TENANT_NS) or {}
    assert pod["status"]["phase"] == "Pending", pod["status"]
    reconciling(hostile)
    victim.unchanged()


def test_a_pod_of_many_containers_is_served_like_any_other(hostile: Env, victim: Victim) -> None:
    """Twenty containers, the first a sharer: it alone sees a GPU, and the agent keeps its pace."""
    names = [f"c{i}" for i in range(20)]
    manifest = sharer("crowd", namespace=TENANT_NS, containers=names)
    hostile.start_pods([manifest], timeout_s=180)
    first = e_exec(hostile, "crowd", "c0", TENANT_NS).split("\n")
    last = e_exec(hostile, "crowd", "c19", TENANT_NS).split("\n")
    assert len(first[0].split()) == 1 and first[1] == first[0].split()[0], first
    assert last[0].strip() == "" and last[1] == "none", last
    reconciling(hostile)
    victim.unchanged()


def test_a_sharer_aimed_at_the_node_by_selector_takes_a_free_slot_and_nothing_more(
    hostile: Env, victim: Victim
) -> None:
    """Pinning itself to the node of the victim's shadow gets the tenant what any sharer gets there: a
    free slot of that shadow, kubelet's choice, and its one GPU. No shadow is made for it, the victim
    keeps its slot."""
    node = hostile.cluster.node()["metadata"]["labels"]["kubernetes.io/hostname"]
    shadows_before = sorted(s["metadata"]["uid"] for s in hostile.shadows())
    manifest = sharer("aimed", namespace=TENANT_NS)
    manifest["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    hostile.start_pods([manifest], timeout_s=120)
    assert recorded(hostile, "aimed", TENANT_NS) == victim_shadow(hostile)
    devs, visible = e_exec(hostile, "aimed", "app", TENANT_NS).split("\n")[:2]
    assert devs.split() == [visible] == [victim.devices[1]], (devs, visible, victim.devices)
    reconciling(hostile)
    # No shadow holds it but the victim's: any other shadow now standing is not the aimed pod's
    # (the warm pool or an earlier test's demand may add or drain shadows meanwhile).
    for shadow in hostile.shadows():
        if shadow["metadata"]["uid"] not in shadows_before:
            name = f"gpushare-system/{shadow['metadata']['name']}"
            holders = next((s["users"] for s in hostile.agent.status()["shadows"] if s["pod"] == name), [])
            assert not any(u.startswith(f"{TENANT_NS}/aimed") for u in holders), (name, holders)
    users = next(s["users"] for s in hostile.agent.status()["shadows"] if s["pod"] == victim_shadow(hostile))
    assert sorted(u.split("/")[0] for u in users) == [TENANT_NS, VICTIM_NS], users
    victim.unchanged()


def test_a_sharer_with_an_hour_of_grace_dies_when_its_shadow_goes(hostile: Env, victim: Victim) -> None:
    """A sharer that ignores TERM and asks for 3600 s of grace: once its shadow is gone the agent evicts
    it and kills its pod's tasks, so it does not keep using a GPU nobody holds for it."""
    manifest = sharer("stubborn", n=2, namespace=TENANT_NS)
    manifest["spec"]["terminationGracePeriodSeconds"] = 3600
    manifest["spec"]["containers"][0]["command"] = ["sh", "-c", "trap '' TERM; sleep 3600 & wait"]
    hostile.start_pods([manifest], timeout_s=120)
    uid = (hostile.cluster.pod("stubborn", TENANT_NS) or {})["metadata"]["uid"]
    shadow = recorded(hostile, "stubborn", TENANT_NS)
    assert shadow != victim_shadow(hostile)
    kills_before = hostile.agent.status()["spot_runtime"]["kills"].get("ShadowGone", 0)
    started = time.monotonic()
    hostile.cluster.kubectl("delete", "pod", "-n", "gpushare-system", shadow.split("/")[1], "--wait=false")

    def gone() -> bool:
        pod = hostile.cluster.pod("stubborn", TENANT_NS)
        return pod is None or pod["metadata"]["uid"] != uid

    hostile.wait("the stubborn sharer gone", gone, 120)
    took = time.monotonic() - started
    assert "ShadowGone" in events(hostile, "stubborn")
    assert hostile.agent.status()["spot_runtime"]["kills"].get("ShadowGone", 0) > kills_before
    print(f"shadow deleted -> sharer with 3600 s grace gone: {took:.1f} s")
    reconciling(hostile)
    victim.unchanged()


def test_the_tenant_cannot_write_to_gpushare_system(hostile: Env, victim: Victim) -> None:
    """As a tenant (a ServiceAccount with the stock edit role in its own namespace) deleting the victim's
    shadow is forbidden by RBAC before any policy is asked."""
    sa = "hostile-tenant"
    hostile.cluster.kubectl("create", "serviceaccount", sa, "-n", TENANT_NS, check=False)
    hostile.cluster.kubectl(
        "create", "rolebinding", "hostile-edit", "--clusterrole=edit", f"--serviceaccount={TENANT_NS}:{sa}",
        "-n", TENANT_NS, check=False,
    )  # fmt: skip
    who = f"system:serviceaccount:{TENANT_NS}:{sa}"
    shadow = victim_shadow(hostile).split("/")[1]
    try:
        res = hostile.cluster.kubectl(
            "delete", "pod", shadow, "-n", "gpushare-system", f"--as={who}", "--wait=false", check=False
        )
        assert res.returncode != 0 and "forbidden" in res.stderr.lower(), res.stderr
        res = hostile.cluster.kubectl("auth", "can-i", "create", "pods", "-n", TENANT_NS, f"--as={who}", check=False)
        assert res.stdout.strip() == "yes", res.stdout  # the tenant is a tenant, not nobody
    finally:
        hostile.cluster.kubectl("delete", "rolebinding", "hostile-edit", "-n", TENANT_NS, check=False)
    reconciling(hostile)
    victim.unchanged()
