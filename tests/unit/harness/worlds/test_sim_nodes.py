"""The simulated node side without a cluster: its device manager, the records it writes, draining, and
its index of pods by node (tests/harness/worlds/sim_nodes.py)."""

from __future__ import annotations

import json
from typing import Any

from controller.core.pod_facts import PodRef
from controller.io.kube_client import WatchEvent
from gpushare import keys
from gpushare.config import load_config
from tests.harness.worlds.sim_nodes import NodeIndexedPodCache, SimulatedNodeAgents
from tests.unit.controller.loop_pods import pod, shadow

CFG = load_config(text="version: v1\nrealResources: [example.com/gpu]\nshareSpecs: [4]\ndevShareSpecs: [2]\n")
SHARE4 = "gpushare/share-gpu-4"


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


# -- the node side's index: a pass costs the pods that changed ------------------------------------


def _event(kind: str, p: dict[str, Any]) -> WatchEvent:
    return WatchEvent(kind, p)  # type: ignore[arg-type]


def test_the_index_names_the_nodes_whose_pods_changed_old_and_new_and_the_deleted_shadows() -> None:
    a, b, waiting = _sharer("a", "n1"), _sharer("b", "n2"), pod("c", ns="team")
    cache = NodeIndexedPodCache(FakeClient([a, b, waiting]), on_change=lambda: None)  # type: ignore[arg-type]
    assert cache.take_due() is None  # nothing listed yet: no pass
    cache.relist()
    first = cache.take_due()
    assert first is not None and first.fresh and set(first.pods) == {"n1", "n2"}  # unbound pods on no node
    assert [p["metadata"]["name"] for p in first.pods["n1"]] == ["a"]
    quiet = cache.take_due()
    assert quiet is not None and not quiet.fresh and quiet.pods == {}

    cache.apply(_event("MODIFIED", pod("c", ns="team", node="n3", rv="2")))  # bound: its new node
    cache.apply(_event("MODIFIED", _sharer("a", "n1") | {"status": {"phase": "Succeeded"}}))
    cache.apply(_event("BOOKMARK", {"metadata": {"resourceVersion": "9"}}))
    changed = cache.take_due()
    assert changed is not None and set(changed.pods) == {"n1", "n3"}
    assert changed.pods["n1"][0]["status"]["phase"] == "Succeeded"

    cache.apply(_event("ADDED", _sharer("d", "n1")))
    cache.apply(_event("MODIFIED", _sharer("a", "n1")))  # keeps its place, as in the cache's own view
    in_order = cache.take_due()
    assert in_order is not None and [p["metadata"]["name"] for p in in_order.pods["n1"]] == ["a", "d"]
    assert [p["metadata"]["name"] for p in cache.view().pods if p["spec"]["nodeName"] == "n1"] == ["a", "d"]
    cache.apply(_event("DELETED", _sharer("d", "n1")))

    cache.apply(_event("MODIFIED", _sharer("b", "n4")))  # a move (not in Kubernetes, but the index holds)
    cache.apply(_event("DELETED", shadow("s", node="n1", phase="Running")))  # never listed: n1 not touched
    cache.apply(_event("DELETED", _sharer("a", "n1")))
    moved = cache.take_due(also=["n9"])
    assert moved is not None and moved.pods == {"n1": (), "n2": (), "n4": (moved.pods["n4"][0],), "n9": ()}
    assert moved.deleted_shadows == {PodRef("gpushare-system", "s", "uid-s")}

    cache.relist()  # a full LIST: every node again, the deletions it knows of forgotten
    fresh = cache.take_due()
    assert fresh is not None and fresh.fresh and set(fresh.pods) == {"n1", "n2"} and fresh.deleted_shadows == set()


def _passed(agents: SimulatedNodeAgents) -> list[str]:
    """Run one pass; the nodes it passed."""
    names: list[str] = []
    real = agents._node_pass

    def note(state: Any, pods: Any, fresh: bool, deleted: Any) -> None:
        names.append(state.cfg.node_name)
        real(state, pods, fresh, deleted)

    agents._node_pass = note  # type: ignore[method-assign]
    agents.pass_once()
    agents._node_pass = real  # type: ignore[method-assign]
    return sorted(names)


def test_a_pass_visits_every_node_after_a_list_then_only_those_whose_pods_changed() -> None:
    cluster, client = FakeCluster(), FakeClient([_sharer("a", "sim-0000")])
    agents = SimulatedNodeAgents(
        cluster,  # type: ignore[arg-type]
        CFG,
        ["sim-0000", "sim-0001"],
        client=client,  # type: ignore[arg-type]
        clock=Clock(),
    )
    agents._cache.relist()
    assert _passed(agents) == ["sim-0000", "sim-0001"]  # a fresh LIST: every node, even one without pods
    assert _passed(agents) == []
    _bind(agents, _sharer("x", "127.0.0.1"))  # not a simulated node
    assert _passed(agents) == []
    _bind(agents, _sharer("b", "sim-0001"))
    assert _passed(agents) == ["sim-0001"]
    agents._cache.apply(_event("MODIFIED", _sharer("a", "sim-0000")))  # the same resourceVersion: nothing new
    assert _passed(agents) == []
    agents._again.add("sim-0001")  # a pass that published a new list asks for another
    agents._nodes["sim-0001"].seen = frozenset()
    assert _passed(agents) == ["sim-0001"]
