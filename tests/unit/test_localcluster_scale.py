"""The scale harness's pieces that need no cluster: kwok's config, the simulated node side's device
manager and records, and the settled-world check (localcluster/kwok.py, sim_nodes.py, scale.py)."""

from __future__ import annotations

import json
from typing import Any

import yaml

from controller.core.pod_facts import PodRef
from controller.io.kube_client import WatchEvent
from gpushare import keys
from gpushare.config import load_config
from localcluster.kwok import SIMULATED_LABEL, kwok_config_text, node_manifest, sim_node_names
from localcluster.scale import check_sharers
from localcluster.sim_nodes import SimulatedNodeAgents
from tests.unit.controller.loop_pods import pod, shadow

CFG = load_config(text="version: v1\nrealResources: [example.com/gpu]\nshareSpecs: [4]\ndevShareSpecs: [2]\n")
SHARE4 = "gpushare/share-gpu-4"


def test_kwok_manages_only_the_labelled_nodes_and_runs_pods_through_three_stages() -> None:
    config, *stages = yaml.safe_load_all(kwok_config_text())
    assert config["kind"] == "KwokConfiguration"
    assert config["options"]["manageNodesWithLabelSelector"] == f"{SIMULATED_LABEL}=true"
    for key in ("podPlayStageParallelism", "nodePlayStageParallelism", "nodeLeaseParallelism"):
        assert config["options"][key] > 0  # kwok refuses a config file without them
    assert [(s["metadata"]["name"], s["spec"]["resourceRef"]["kind"]) for s in stages] == [
        ("gs-node-ready", "Node"),
        ("gs-pod-running", "Pod"),
        ("gs-pod-gone", "Pod"),
    ]
    assert stages[2]["spec"]["next"] == {"delete": True}


def test_a_simulated_node_offers_eight_fake_gpus_and_carries_the_label() -> None:
    node = node_manifest("sim-0007")
    assert node["metadata"]["labels"][SIMULATED_LABEL] == "true"
    assert node["status"]["capacity"]["example.com/gpu"] == "8" == node["status"]["allocatable"]["example.com/gpu"]
    assert sim_node_names(3) == ["sim-0000", "sim-0001", "sim-0002"]


class FakeCluster:
    def __init__(self) -> None:
        self.patches: list[tuple[str, dict[str, Any]]] = []

    def request(self, method: str, path: str, body: Any = None, content_type: str = "") -> Any:
        assert method == "PATCH" and content_type == "application/merge-patch+json"
        self.patches.append((path, body))
        return {}


class FakeClient:
    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods
        self.annotations: list[tuple[str, dict[str, str | None]]] = []

    def list_pods(self, **_: Any) -> tuple[list[dict[str, Any]], str]:
        return list(self.pods), "1"

    def patch_pod_annotations(self, ref: PodRef, ann: dict[str, str | None]) -> bool:
        self.annotations.append((ref.key, dict(ann)))
        return True


def _sharer(name: str, node: str) -> dict[str, Any]:
    return pod(name, ns="team", node=node, phase="Running", limits={SHARE4: "1"})


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def _agents(
    pods: list[dict[str, Any]], clock: Clock | None = None
) -> tuple[SimulatedNodeAgents, FakeCluster, FakeClient]:
    cluster, client = FakeCluster(), FakeClient(pods)
    agents = SimulatedNodeAgents(
        cluster,  # type: ignore[arg-type]
        CFG,
        ["sim-0000"],
        client=client,  # type: ignore[arg-type]
        clock=clock or Clock(),
    )
    agents._cache.relist()
    return agents, cluster, client


def _bind(agents: SimulatedNodeAgents, *pods: dict[str, Any]) -> None:
    """The scheduler binds: the pods arrive on the node side's watch."""
    for p in pods:
        agents._cache.apply(WatchEvent("ADDED", p))


def test_the_node_side_advertises_n_slots_per_running_shadow_and_records_who_holds_them() -> None:
    box = shadow("shadow-share-4-aaaa-0", node="sim-0000", phase="Running")
    agents, cluster, client = _agents([box, _sharer("elsewhere", "127.0.0.1")])
    agents.pass_once()
    assert len(agents.capacity("sim-0000")[SHARE4]) == 4
    published = [(path, body["status"]) for path, body in cluster.patches if SHARE4 in body["status"]["capacity"]]
    assert published == [("/api/v1/nodes/sim-0000/status", {"capacity": {SHARE4: "4"}, "allocatable": {SHARE4: "4"}})]

    _bind(agents, _sharer("a", "sim-0000"))
    agents.pass_once()
    users = [a for key, a in client.annotations if key == "gpushare-system/shadow-share-4-aaaa-0"]
    owners = [a for key, a in client.annotations if key == "team/a"]
    assert json.loads(users[-1][keys.ANNOTATION_SHADOW_USERS] or "") == {
        "team/a/main": ["gpushare-system/shadow-share-4-aaaa-0-0"]
    }
    assert list(json.loads(owners[-1][keys.ANNOTATION_SHADOW_OWNER] or "")) == ["gpushare-system/shadow-share-4-aaaa-0"]
    assert not any(key == "team/elsewhere" for key, _ in client.annotations)  # not this node's pod
    assert agents.refused == set()


def test_a_sharer_bound_where_every_slot_is_taken_is_refused_as_kubelet_would() -> None:
    agents, _, _ = _agents([shadow("shadow-share-4-aaaa-0", node="sim-0000", phase="Running")])
    agents.pass_once()
    _bind(agents, *(_sharer(f"s{i}", "sim-0000") for i in range(5)))
    agents.pass_once()
    assert len(agents.refused) == 1


def test_a_draining_shadow_keeps_its_slots_for_the_settle_time_and_while_a_fresh_list_shows_a_sharer_waiting() -> None:
    """The simulated node drains as an agent does: a sharer the scheduler placed on the old count
    just before the lower one was published still finds its slot."""
    clock = Clock()
    name = "shadow-share-4-aaaa-0"
    draining = shadow(name, node="sim-0000", phase="Running", annotations={keys.ANNOTATION_SHADOW_DRAINING: "1.000"})
    agents, cluster, client = _agents([draining], clock)
    agents.pass_once()
    assert len(agents.capacity("sim-0000")[SHARE4]) == 4  # still listed
    lowered = [body["status"] for _, body in cluster.patches if SHARE4 in body["status"].get("allocatable", {})]
    assert lowered[-1] == {"capacity": {SHARE4: "0"}, "allocatable": {SHARE4: "0"}}
    ((_, noted),) = [(k, a) for k, a in client.annotations if k == f"gpushare-system/{name}"]
    assert noted[keys.ANNOTATION_SHADOW_DRAINED] == f"1.000 published {clock.now:.3f}"

    # The node's agent noted the publish; the shadow now carries it. A late sharer is bound and
    # listed, but not yet on the node side's watch: only the fresh LIST shows it.
    published = shadow(
        name,
        node="sim-0000",
        phase="Running",
        rv="2",
        annotations={
            keys.ANNOTATION_SHADOW_DRAINING: "1.000",
            keys.ANNOTATION_SHADOW_DRAINED: noted[keys.ANNOTATION_SHADOW_DRAINED],
        },
    )
    _bind(agents, published)
    late = pod("late", ns="team", node="sim-0000", phase="Pending", limits={SHARE4: "1"})
    client.pods = [published, late]
    clock.now += 6.0  # past the settle time
    agents.pass_once()
    assert len(agents.capacity("sim-0000")[SHARE4]) == 4, "withdrawn while a sharer waited"
    assert agents.capacity_published("sim-0000")[SHARE4] == 0, "the lower count was raised again"
    client.pods = [published]
    agents.pass_once()  # nothing changed on the watch: the pass comes round anyway while it drains
    assert agents.capacity("sim-0000")[SHARE4] == ()
    assert client.annotations[-1] == (f"gpushare-system/{name}", {keys.ANNOTATION_SHADOW_DRAINED: "1.000"})


def test_a_drain_called_off_gets_its_full_count_back_as_kubelet_would_write_it() -> None:
    """A sharer lands on a draining shadow, the leader takes the mark off: the slots were never
    withdrawn, so the list does not change, but the lowered count must go back up."""
    clock = Clock()
    name = "shadow-share-4-aaaa-0"
    draining = shadow(name, node="sim-0000", phase="Running", annotations={keys.ANNOTATION_SHADOW_DRAINING: "1.000"})
    agents, _, _ = _agents([draining], clock)
    agents.pass_once()
    assert agents.capacity_published("sim-0000")[SHARE4] == 0  # the drain's lower count
    _bind(agents, shadow(name, node="sim-0000", phase="Running", rv="2"))  # the mark taken off
    agents.pass_once()
    assert len(agents.capacity("sim-0000")[SHARE4]) == 4
    assert agents.capacity_published("sim-0000")[SHARE4] == 4


def _settled(name: str, node: str, shadow_key: str) -> dict[str, Any]:
    p = _sharer(name, node)
    p["metadata"]["annotations"] = {keys.ANNOTATION_SHADOW_OWNER: json.dumps({shadow_key: "uid"})}
    return p


def test_the_settled_world_check_names_each_kind_of_fault() -> None:
    shadows = [shadow("s0", node="n1", phase="Running"), shadow("s1", node="n2", phase="Running")]
    good = [_settled(f"a{i}", "n1", "gpushare-system/s0") for i in range(4)]
    assert check_sharers(good, shadows[:1]) == []
    wrong_node = [_settled("b", "n2", "gpushare-system/s0")]
    assert "elsewhere" in check_sharers(wrong_node, shadows[:1])[0]
    over = [*good, _settled("a4", "n1", "gpushare-system/s0")]
    assert any("over its 4" in p for p in check_sharers(over, shadows))
    assert any("at most 1 needed" in p for p in check_sharers(good, shadows))
    unrecorded = [_sharer("c", "n1")]
    assert "recorded on 0 shadows" in check_sharers(unrecorded, shadows[:1])[0]
