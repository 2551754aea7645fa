"""The node holds on its own: a pod whose mix of GPU requests gpushare refuses never runs on a GPU,
with the admission policy absent (``admission.enabled: false``) and with it only warning
(``validationActions: [Warn, Audit]``), the two ways the chart lets an operator run without it.

Each row of docs/security.md's mixed-request table is created for real on the live node. Where the
scheduler can place the pod (the shadows and GPUs it asks for exist), the NRI plugin refuses each of
its containers in the policy's words, kubelet puts that in the pod's Events, and the agent evicts
it; where it cannot, the leader says why it gets no GPU. Throughout, kubelet's own PodResources is
read for the one thing that must never happen: a GPU held by two pods that are not a shadow and its
sharers (a sharer holding slots of a shadow that no longer holds a GPU, whose GPU kubelet may then
give to anybody).

The agent evicts a refused pod that was already running when the guard came (admitted before the
policy existed, or while the agent was away): that case runs last, with the agent stopped while
the pod starts.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from controller.io.podresources import PodResourcesClient
from gpushare import keys, rules
from localcluster.agent import FAKE_RESOURCE
from localcluster.pods import pod_manifest, sharer
from tests.harness.worlds.agent_pod import AgentPod
from tests.integration.e2e.conftest import Env, _clean

SHARE2 = keys.share_resource(keys.KIND_SHARE, 2)
SHARE4 = keys.share_resource(keys.KIND_SHARE, 4)
DEV4 = keys.share_resource(keys.KIND_SHARE_DEV, 4)
SPOT = keys.RESOURCE_SPOT_GPU
REAL = FAKE_RESOURCE
DIND = keys.POD_ANNOTATION_DEVICES_FROM_PREFIX
NS = "default"

# The chart's two ways to run without the policy refusing anything.
MODES: dict[str, dict[str, Any]] = {
    "policy-absent": {"admission": {"enabled": False}},
    "policy-warns": {"admission": {"enabled": True, "validationActions": ["Warn", "Audit"]}},
}

Containers = list[tuple[str, dict[str, str]]]


def manifest(name: str, containers: Containers, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A busybox pod whose containers each ask for their own resources (limits)."""
    return pod_manifest(name, namespace=NS, annotations=annotations, each=dict(containers))


def rule_of(m: dict[str, Any]) -> str:
    """The refusal the node must give, from the one rule every part asks."""
    containers = [(c["name"], list((c.get("resources") or {}).get("limits") or {})) for c in m["spec"]["containers"]]
    why = rules.refused_mix(f"{NS}/{m['metadata']['name']}", containers, m["metadata"]["annotations"], [REAL])
    assert why is not None, f"{m['metadata']['name']} is not a refused mix"
    return why


def reason_words(why: str) -> str:
    """The rule and its advice (after the pod's own words), as the policy and the node both say it."""
    return why.split("; ", 1)[1]


class Guard:
    """The live node, read the way a check that nothing is given twice must read it."""

    def __init__(self, env: Env, mode: str) -> None:
        self.env = env
        self.mode = mode
        self.podres = PodResourcesClient(str(env.cluster.pod_resources_socket), timeout_s=5.0)
        self.checks = 0

    def create(self, m: dict[str, Any]) -> str:
        """Create as a tenant; it must be admitted. Returns kubectl's stderr (the policy's warning in Warn)."""
        res = self.env.cluster.kubectl("create", "-f", "-", input=json.dumps(m), check=False)
        assert res.returncode == 0, f"{self.mode}: {m['metadata']['name']} was refused at admission: {res.stderr}"
        return str(res.stderr)

    def no_gpu_given_twice(self) -> None:
        """Every pod kubelet says holds share slots holds them of a shadow that still holds a GPU."""
        self.checks += 1
        holders: dict[str, str] = {}  # "ns/shadow" -> the real ID it holds
        slots: list[tuple[str, str]] = []  # (sharer "ns/pod", "ns/shadow")
        for pod in self.podres.list():
            for ctr in pod.containers:
                for dev in ctr.devices:
                    if dev.resource_name == REAL and pod.namespace == keys.DEFAULT_NAMESPACE:
                        for rid in dev.device_ids:
                            holders[f"{pod.namespace}/{pod.name}"] = rid
                    elif keys.parse_share_resource(dev.resource_name) is not None:
                        for vid in dev.device_ids:
                            slots.append((f"{pod.namespace}/{pod.name}", vid.rsplit("-", 1)[0]))
        orphans = sorted({(who, shadow) for who, shadow in slots if shadow not in holders})
        assert not orphans, f"{self.mode}: pods hold slots of shadows that hold no GPU any more: {orphans}"

    def ever_ran(self, name: str) -> bool:
        status = (self.env.cluster.pod(name, NS) or {}).get("status") or {}
        apps = status.get("containerStatuses") or ()
        inits = status.get("initContainerStatuses") or ()
        return any("running" in (st.get("state") or {}) or st.get("restartCount", 0) for st in (*apps, *inits)) or any(
            ((st.get("state") or {}).get("terminated") or {}).get("reason") == "Completed" for st in inits
        )

    def refused_on_the_node(self, m: dict[str, Any], timeout_s: float = 60.0) -> dict[str, str]:
        """Wait until the agent has evicted the pod, checking all along that it never ran and nothing
        is given twice; its Events by reason."""
        name = m["metadata"]["name"]
        deadline = time.monotonic() + timeout_s
        while self.env.cluster.pod(name, NS) is not None:
            assert not self.ever_ran(name), f"{self.mode}: a container of {name} ran"
            self.no_gpu_given_twice()
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.mode}: {name} was not evicted; {self.env.diagnosis()}")
            time.sleep(0.5)
        self.no_gpu_given_twice()
        # The agent writes its Event just after the delete it reports.
        self.env.wait(
            f"the eviction Event of {name}",
            lambda: _NODE_REFUSES in events(self.env, name).get("GpuRequestsRefused", ""),
            15,
        )
        seen = events(self.env, name)
        # kubelet may not even try a container before the agent's eviction; when it did, the NRI
        # plugin's refusal is what it reports.
        if "Failed" in seen:
            failed = seen["Failed"]
            assert "refused on the node" in failed or "cannot check the GPU requests" in failed, seen
        return seen


_NODE_REFUSES = "the node refuses this mix whether or not the admission policy is on"


def events(env: Env, name: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for ev in env.events(name, NS):
        out[ev["reason"]] = out.get(ev["reason"], "") + ev["message"] + "\n"
    return out


@pytest.fixture(scope="module", params=sorted(MODES))
def guard(env: Env, request: pytest.FixtureRequest) -> Iterator[Guard]:
    agent = env.agent
    if not isinstance(agent, AgentPod):
        pytest.skip("the admission policy comes with the chart: run with the agent as the DaemonSet's pod")
    if not agent.alive():
        agent.start()
    before = agent.settings
    agent.upgrade(dataclasses.replace(before, chart={**before.chart, **MODES[request.param]}))
    binding = env.cluster.kubectl("get", "validatingadmissionpolicybinding", "gpushare-pods", "-o", "json", check=False)
    if request.param == "policy-absent":
        assert binding.returncode != 0, "the policy is still installed"
    else:
        assert json.loads(binding.stdout)["spec"]["validationActions"] == ["Warn", "Audit"]
    g = Guard(env, request.param)
    try:
        yield g
    finally:
        _clean(env.cluster)
        g.podres.close()
        agent.upgrade(before)
        if not agent.alive():
            agent.start()
        agent.wait_healthy()


@pytest.fixture(autouse=True)
def clean_slate(guard: Guard) -> None:
    """Each test starts with no pods of its own and no shadows, both GPUs free."""
    _clean(guard.env.cluster)


def test_two_share_specs_never_run_and_their_shadows_are_not_given_away(guard: Guard) -> None:
    e = guard.env
    e.start_pods([sharer("s2", n=2), sharer("s4", n=4)])
    shadows = {s["metadata"]["uid"] for s in e.shadows()}
    mix = manifest("mix-specs", [("a", {SHARE2: "1"}), ("b", {SHARE4: "1"})])
    why = rule_of(mix)
    warning = guard.create(mix)
    if guard.mode == "policy-warns":
        assert reason_words(why) in warning.replace("\n", " "), warning
    seen = guard.refused_on_the_node(mix)
    assert why in seen["GpuRequestsRefused"], seen
    # The sharers that made the shadows are untouched, on the same shadows.
    assert {s["metadata"]["uid"] for s in e.shadows()} == shadows
    for name in ("s2", "s4"):
        pod = e.cluster.pod(name, NS) or {}
        assert pod["status"]["phase"] == "Running" and not pod["metadata"].get("deletionTimestamp"), name
    assert guard.checks > 0


@pytest.mark.parametrize(
    "containers, annotations",
    [
        pytest.param([("serve", {SHARE4: "1"}), ("train", {REAL: "1"})], {}, id="share-and-vendor"),
        pytest.param([("app", {SHARE4: "1", REAL: "1"})], {}, id="share-and-vendor-in-one-container"),
        pytest.param(
            [("main", {SHARE4: "1"}), ("dind", {SHARE4: "1"})], {DIND + "dind": "main"}, id="dind-target-asks-share"
        ),
    ],
)
def test_a_placeable_refused_mix_is_refused_on_the_node_and_evicted(
    guard: Guard, containers: Containers, annotations: dict[str, str]
) -> None:
    # One sharer's shadow on one GPU, the other GPU free: the scheduler can place each of these.
    guard.env.start_pods([sharer("s4", n=4)])
    mix = manifest("mix", containers, annotations)
    why = rule_of(mix)
    guard.create(mix)
    seen = guard.refused_on_the_node(mix)
    assert why in seen["GpuRequestsRefused"], seen


@pytest.mark.parametrize(
    "containers",
    [
        pytest.param([("app", {SPOT: "1", SHARE4: "1"})], id="spot-and-share-in-one-container"),
        pytest.param([("train", {SPOT: "1"}), ("serve", {SHARE4: "1"})], id="spot-and-share"),
        pytest.param([("app", {SPOT: "1"}), ("keep", {REAL: "1"})], id="spot-and-vendor"),
        pytest.param([("app", {SHARE4: "1"}), ("dev", {DEV4: "1"})], id="share-and-dev"),
    ],
)
def test_an_unplaceable_refused_mix_is_told_why_and_gets_nothing(guard: Guard, containers: Containers) -> None:
    # Nothing makes a shadow or lends a GPU for a refused pod, so the scheduler never places it.
    e = guard.env
    mix = manifest("mix", containers)
    why = rule_of(mix)
    guard.create(mix)
    e.wait("the leader's refusal", lambda: "GpuRequestsRefused" in events(e, "mix"), 30)
    seen = events(e, "mix")
    assert why in seen["GpuRequestsRefused"] and "no GPU on any node" in seen["GpuRequestsRefused"], seen
    pod = e.cluster.pod("mix", NS) or {}
    assert not pod["spec"].get("nodeName") and not e.shadows(), (pod["spec"], e.shadows())
    guard.no_gpu_given_twice()


def test_a_refused_pod_already_running_when_the_agent_comes_is_evicted(guard: Guard) -> None:
    # With the agent away, containerd creates containers without the NRI plugin: a Docker-in-Docker
    # target asking the vendor's GPU itself starts next to its source.
    e = guard.env
    mix = manifest("mix-old", [("main", {REAL: "1"}), ("dind", {REAL: "1"})], {DIND + "dind": "main"})
    why = rule_of(mix)
    e.agent.stop()
    try:
        guard.create(mix)
        e.wait("the refused pod running without the agent", lambda: guard.ever_ran("mix-old"), 60)
    finally:
        e.agent.start()
        e.agent.wait_healthy()
    e.wait("the agent's eviction", lambda: e.cluster.pod("mix-old", NS) is None, 60)
    seen = events(e, "mix-old")
    assert why in seen.get("GpuRequestsRefused", ""), seen
    guard.no_gpu_given_twice()


def test_records_and_shadow_labels_written_by_a_tenant_affect_at_most_its_own_pod(guard: Guard) -> None:
    """Every key of docs/security.md's records table, written by a tenant the policy does not stop."""
    e = guard.env
    e.start_pods([sharer("victim", n=4)])
    (real_shadow,) = e.shadows()
    shadow_key = f"{keys.DEFAULT_NAMESPACE}/{real_shadow['metadata']['name']}"
    victim_uid = (e.cluster.pod("victim", NS) or {})["metadata"]["uid"]
    # Posing as a shadow: the labels on a pod that holds the other GPU.
    poser = manifest("poser", [("main", {REAL: "1"})])
    poser["metadata"]["labels"] |= {
        keys.LABEL_ROLE: keys.ROLE_SHADOW,
        keys.LABEL_SHARE_KIND: keys.KIND_SHARE,
        keys.LABEL_SHARE_SPEC: "4",
    }
    # Every record the agent writes, forged on a sharer of the victim's shadow, with the tenant's own keys.
    forger = manifest("forger", [("app", {SHARE4: "1"})])
    forger["metadata"]["annotations"] |= {
        keys.ANNOTATION_SHADOW_OWNER: json.dumps({shadow_key: "00000000-0000-4000-8000-000000000000"}),
        keys.ANNOTATION_SHADOW_USERS: json.dumps({f"{NS}/victim/app": [f"{shadow_key}-0"]}),
        keys.ANNOTATION_SHADOW_DRAINING: "forged",
        keys.ANNOTATION_SHADOW_DRAINED: "forged",
        keys.ANNOTATION_POOL_RESOURCE: REAL,
    }
    forger["metadata"]["labels"] |= {keys.LABEL_LENDABLE: "true"}
    for m in (poser, forger):
        guard.create(m)
    passes = e.agent.status()["passes"]
    e.wait("five passes of the agent", lambda: e.agent.status()["passes"] >= passes + 5, 60)
    for _ in range(6):
        guard.no_gpu_given_twice()
        time.sleep(0.5)
    # The poser is no shadow: its GPU adds no slots, and nobody's slots come from it.
    assert e.allocatable().get(SHARE4) == "4", e.allocatable()
    assert [s["metadata"]["uid"] for s in e.shadows()] == [real_shadow["metadata"]["uid"]]
    shadow_now = e.shadows()[0]
    assert keys.ANNOTATION_SHADOW_DRAINING not in (shadow_now["metadata"].get("annotations") or {})
    victim = e.cluster.pod("victim", NS) or {}
    assert victim["metadata"]["uid"] == victim_uid and victim["status"]["phase"] == "Running"
    assert not victim["metadata"].get("deletionTimestamp")
    # What the forger's record says can cost the forger its own pod, nobody else's.
    evicted = {ev["pod"] for ev in e.agent.status()["evictions"]}
    assert f"{NS}/victim" not in evicted and f"{NS}/poser" not in evicted, evicted


def test_sharers_bound_to_the_node_past_the_scheduler_take_free_slots_and_nothing_more(guard: Guard) -> None:
    """``spec.nodeName`` set by the tenant: no scheduler, no policy. kubelet's own admission still
    counts the slots, and a bound pod is no demand the leader makes shadows for."""
    e = guard.env
    e.start_pods([sharer("s4", n=4)])
    (shadow,) = e.shadows()
    node = e.cluster.node()["metadata"]["name"]
    bound = [sharer(f"bound-{i}", n=4) for i in range(4)]
    for m in bound:
        m["spec"]["nodeName"] = node
    e.start_pods(bound[:3])  # the shadow's three free slots
    guard.create(bound[3])
    e.wait(
        "kubelet's refusal of the fifth sharer",
        lambda: ((e.cluster.pod("bound-3", NS) or {}).get("status") or {}).get("phase") == "Failed",
        60,
    )
    status = (e.cluster.pod("bound-3", NS) or {})["status"]
    assert SHARE4 in str(status.get("reason")) + str(status.get("message")), status
    passes = e.agent.status()["passes"]
    e.wait("three passes of the agent", lambda: e.agent.status()["passes"] >= passes + 3, 60)
    guard.no_gpu_given_twice()
    # Every slot is the one shadow's, and the free GPU stays free: no shadow for a bound pod.
    assert [s["metadata"]["uid"] for s in e.shadows()] == [shadow["metadata"]["uid"]]
    held = {
        (pod.name, dev.resource_name)
        for pod in guard.podres.list()
        for ctr in pod.containers
        for dev in ctr.devices
        if pod.namespace == NS
    }
    assert held == {(name, SHARE4) for name in ("s4", "bound-0", "bound-1", "bound-2")}, held


@pytest.mark.parametrize("placeable", [False, True], ids=["no-shadow", "beside-a-shadow"])
def test_slots_in_a_plain_init_container_are_refused_on_the_node(guard: Guard, placeable: bool) -> None:
    """kubelet does not report what a plain init container holds, so gpushare could never confirm
    its slots: the leader tells the pod why and makes no shadow for it; where a shadow could place
    it, the NRI plugin refuses the init container and the agent evicts the pod."""
    e = guard.env
    if placeable:
        e.start_pods([sharer("s4", n=4)])
    shadows = {s["metadata"]["uid"] for s in e.shadows()}
    pod = manifest("staged", [("app", {SHARE4: "2"})])
    init = dict(pod["spec"]["containers"][0], name="helper", command=["sh", "-c", "true"])
    pod["spec"]["initContainers"] = [init]
    why = rules.refused_mix(f"{NS}/staged", [("app", [SHARE4]), ("helper", [SHARE4])], {}, [REAL], ("helper",))
    assert why is not None and 'init container "helper"' in why
    guard.create(pod)
    if placeable:
        seen = guard.refused_on_the_node(pod)
        assert why in seen["GpuRequestsRefused"], seen
    else:
        e.wait("the leader's refusal", lambda: "GpuRequestsRefused" in events(e, "staged"), 30)
        assert why in events(e, "staged")["GpuRequestsRefused"]
        assert not (e.cluster.pod("staged", NS) or {})["spec"].get("nodeName")
    passes = e.agent.status()["passes"]
    e.wait("three passes of the agent", lambda: e.agent.status()["passes"] >= passes + 3, 60)
    assert {s["metadata"]["uid"] for s in e.shadows()} == shadows
    guard.no_gpu_given_twice()
