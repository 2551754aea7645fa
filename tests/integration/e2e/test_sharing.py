"""Sharing end to end: real kubelet + containerd with NRI + fake vendor GPUs + the agent."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any

from localcluster.agent import FAKE_RESOURCE
from localcluster.component_config import AGENT_USER
from localcluster.pods import pod_manifest, sharer
from tests.integration.e2e.conftest import IDLE_TIMEOUT_S, Env

DEV_SCRIPT = "ls /dev | grep fakegpu | tr '\\n' ' '; echo; echo ${FAKE_VISIBLE_DEVICES:-none}"


def _running(e: Env, names: list[str], namespace: str = "default") -> bool:
    pods = {p["metadata"]["name"]: p for p in e.pods(namespace)}
    return all(n in pods and pods[n]["status"].get("phase") == "Running" for n in names)


def _owner(pod: dict[str, Any]) -> str:
    """The shadow a sharer holds, from the agent's owner record."""
    record = json.loads(pod["metadata"].get("annotations", {}).get("gpushare.k8s.io/shadow-owner", "{}"))
    assert len(record) == 1, record
    return str(next(iter(record)))


def _shadow_gpus(e: Env) -> dict[str, list[str]]:
    """shadow ns/name -> the real GPU kubelet gave it (the agent reads PodResources)."""
    return {s["pod"]: s["gpu"] for s in e.agent.status()["shadows"] if s["gpu"]}


def test_dind_pod_sees_its_gpu_in_both_containers(e2e: Env) -> None:
    """The same-pod instruction (design §4): `dind` gets exactly what kubelet gave `main`."""
    e2e.apply(
        pod_manifest(
            "dind-dev",
            resources={FAKE_RESOURCE: "1"},
            containers=["main", "dind"],
            annotations={"gpushare.k8s.io/container-devices-from.dind": "main"},
        )
    )
    e2e.wait("dind-dev Running", lambda: _running(e2e, ["dind-dev"]))
    main = e2e.exec("dind-dev", "main", DEV_SCRIPT).split("\n")
    dind = e2e.exec("dind-dev", "dind", DEV_SCRIPT).split("\n")
    assert main[0].split() == dind[0].split() and len(main[0].split()) == 1, (main, dind)
    assert main[1] == dind[1] == main[0].split()[0], (main, dind)


def test_eight_sharers_two_shadows_ninth_pending_then_idle_shadow_goes(e2e: Env) -> None:
    names = [f"sharer-{i}" for i in range(8)]
    created_at = datetime.now(UTC)
    e2e.start_pods([sharer(n) for n in names])
    # Nothing drains or goes yet: a status write of its own Node can only be the agent publishing
    # the new shadows' slots as soon as kubelet held them, ahead of kubelet's node status.
    patches = [
        line
        for line in e2e.cluster.layout.audit_log.read_text().splitlines()
        if line.strip()
        and (entry := json.loads(line)).get("user", {}).get("username") == AGENT_USER
        and datetime.fromisoformat(entry["requestReceivedTimestamp"]) >= created_at
        and entry.get("verb") == "patch"
        and (entry.get("objectRef") or {}).get("subresource") == "status"
        and (entry.get("objectRef") or {}).get("resource") == "nodes"
    ]
    assert patches, "the agent never published the new shadows' share counts in its Node"

    shadows = e2e.shadows()
    assert len(shadows) == 2, [s["metadata"]["name"] for s in shadows]
    e2e.wait("both shadows' GPUs known", lambda: len(_shadow_gpus(e2e)) == 2, 20)
    gpus = _shadow_gpus(e2e)
    assert sorted(g for v in gpus.values() for g in v) == ["fakegpu0", "fakegpu1"], gpus

    e2e.wait(
        "owner records on all 8",
        lambda: all(
            "gpushare.k8s.io/shadow-owner" in (p["metadata"].get("annotations") or {}) for p in e2e.pods("default")
        ),
        20,
    )
    by_shadow: dict[str, list[str]] = {}
    for pod in e2e.pods("default"):
        name = pod["metadata"]["name"]
        shadow = _owner(pod)
        by_shadow.setdefault(shadow, []).append(name)
        (gpu,) = gpus[shadow]
        devs, visible = e2e.exec(name, "app", DEV_SCRIPT).split("\n")[:2]
        # Exactly its shadow's device node and variable; never the other GPU.
        assert devs.split() == [gpu], (name, shadow, devs)
        assert visible == gpu, (name, shadow, visible)
    assert sorted(len(v) for v in by_shadow.values()) == [4, 4], by_shadow

    # A ninth: a third shadow cannot be placed (both GPUs held) -> Pending, with our Event saying why.
    e2e.apply(sharer("sharer-8"))
    e2e.wait("a third shadow", lambda: len(e2e.shadows()) == 3, 20)

    def has_event() -> bool:
        return any(ev["reason"] == "ShadowUnschedulable" for ev in e2e.events("sharer-8"))

    e2e.wait("ShadowUnschedulable Event on sharer-8", has_event, 30)
    (event,) = [ev for ev in e2e.events("sharer-8") if ev["reason"] == "ShadowUnschedulable"]
    assert "cannot be scheduled" in event["message"] and FAKE_RESOURCE in event["message"], event
    ninth = e2e.cluster.pod("sharer-8")
    assert ninth is not None and ninth["status"]["phase"] == "Pending", ninth

    # Delete the ninth and the 4 sharers of one shadow: past the idle timeout the empty shadows go,
    # the used one stays.
    emptied, kept = sorted(by_shadow)
    e2e.cluster.kubectl("delete", "pod", "sharer-8", *by_shadow[emptied], "--wait=true")
    started = time.monotonic()
    e2e.wait(
        f"only {kept} left",
        lambda: [f"gpushare-system/{s['metadata']['name']}" for s in e2e.shadows()] == [kept],
        IDLE_TIMEOUT_S + 30,
    )
    assert time.monotonic() - started >= IDLE_TIMEOUT_S - 0.5
    assert _running(e2e, by_shadow[kept])
    assert not [ev for p in by_shadow[kept] for ev in e2e.events(p) if ev["reason"] == "ShadowGone"]


def test_shadow_deleted_by_hand_evicts_its_sharers_with_a_reason(e2e: Env) -> None:
    names = [f"victim-{i}" for i in range(2)]
    e2e.start_pods([sharer(n) for n in names])
    (shadow,) = e2e.shadows()
    e2e.cluster.kubectl("delete", "pod", "-n", "gpushare-system", shadow["metadata"]["name"], "--wait=false")

    def evicted() -> bool:
        left = {p["metadata"]["uid"] for p in e2e.pods("default") if not p["metadata"].get("deletionTimestamp")}
        return not left

    e2e.wait("sharers evicted", evicted, 30)
    for n in names:
        reasons = {ev["reason"]: ev["message"] for ev in e2e.events(n)}
        assert "ShadowGone" in reasons, reasons
        assert shadow["metadata"]["name"] in reasons["ShadowGone"]
    recent = e2e.agent.status()["evictions"]
    assert {(ev["pod"], ev["reason"]) for ev in recent} >= {(f"default/{n}", "ShadowGone") for n in names}


def test_kill9_and_restart_changes_nothing(e2e: Env) -> None:
    names = [f"steady-{i}" for i in range(3)]
    e2e.start_pods([sharer(n) for n in names])
    e2e.wait("users recorded", lambda: sum(len(s["users"]) for s in e2e.agent.status()["shadows"]) == 3, 20)
    before = e2e.agent.status()
    uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in e2e.pods("default")}
    alloc = e2e.allocatable()

    e2e.agent.kill9()
    mark = e2e.agent.mark()
    e2e.agent.start()
    e2e.agent.wait_healthy()
    time.sleep(IDLE_TIMEOUT_S + 2)  # a few passes, and past the idle timeout
    after = e2e.agent.status()

    assert "decision=evict" not in e2e.agent.log_text()[mark:]
    assert "decision=delete-shadow" not in e2e.agent.log_text()[mark:]
    assert {p["metadata"]["name"]: p["metadata"]["uid"] for p in e2e.pods("default")} == uids
    assert [(s["pod"], s["uid"], s["gpu"], s["users"]) for s in after["shadows"]] == [
        (s["pod"], s["uid"], s["gpu"], s["users"]) for s in before["shadows"]
    ]
    assert [(p["pod"], p["shadows"]) for p in after["sharers"]] == [(p["pod"], p["shadows"]) for p in before["sharers"]]
    e2e.wait("allocatable back", lambda: e2e.allocatable() == alloc, 20)
    assert after["nri"]["connected"] is True
