"""``kubectl gpushare`` decision code: roles and GPUs (``who``), node rows (``status``) and the
one-paragraph explanations (``why``), from tables of raw pods, Events and agent documents."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cli.kubectl import view
from cli.kubectl.explain import explain, refusal_fix
from gpushare import keys
from tests.unit.controller.podmaker import NODE, pod, shadow, sharer

SHADOW = "gpushare-system/shadow-share-4-abcd0123-0"
GPU = "GPU-0a1b2c3d-0000-1111-2222-333344445555"


def _agent_doc(**kw: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "source": "agent",
        "node": NODE,
        "at": 1000.0,
        "nri": {"connected": True},
        "allocated": {"nvidia.com/gpu": 2},
        "shadows": [{"pod": SHADOW, "gpu": [GPU], "users": ["default/s-0/app"]}],
        "sharers": [{"pod": "default/s-0", "shadows": [SHADOW]}],
        "spot": [
            {"real_id": "GPU-owner", "state": "stolen", "owner": "team/trainer/main", "borrowers": ["batch/b-0"]},
        ],
        "problems": [],
        "evictions": [],
    }
    doc.update(kw)
    return doc


def _cluster() -> list[dict[str, Any]]:
    return [
        shadow("shadow-share-4-abcd0123-0", camel=True),
        sharer("s-0", node=NODE, phase="Running", camel=True),
        pod(
            "trainer",
            "team",
            node=NODE,
            phase="Running",
            requests={"nvidia.com/gpu": 1},
            containers=["main"],
            camel=True,
        ),
        pod("b-0", "batch", node=NODE, phase="Running", requests={keys.RESOURCE_SPOT_GPU: 1}, camel=True),
        pod(
            "dind-dev",
            node=NODE,
            phase="Running",
            requests={"nvidia.com/gpu": 1},
            containers=["main", "dind"],
            annotations={keys.POD_ANNOTATION_DEVICES_FROM_PREFIX + "dind": "main"},
            camel=True,
        ),
        pod("plain", node=NODE, phase="Running", camel=True),
    ]


def test_every_role_and_its_gpu_from_the_agent_document() -> None:
    uses = view.gpu_uses(_cluster(), {NODE: _agent_doc()})
    got = {(u.pod, u.container): (u.role, u.gpu, u.via) for u in uses}
    assert got == {
        (SHADOW, "main"): ("shadow", (GPU,), ""),
        ("default/s-0", "app"): ("sharer", (GPU,), SHADOW),
        ("team/trainer", "main"): ("owner", ("GPU-owner",), ""),
        ("batch/b-0", "app"): ("borrower", ("GPU-owner",), "team/trainer/main"),
        ("default/dind-dev", "main"): ("owner", (), ""),
        ("default/dind-dev", "dind"): ("dind", (), "default/dind-dev/main"),
    }


def test_without_an_agent_roles_stay_and_gpus_are_unknown_but_the_sharers_record_names_its_shadow() -> None:
    pods = _cluster()
    pods[1]["metadata"]["annotations"] = {keys.ANNOTATION_SHADOW_OWNER: json.dumps({SHADOW: "uid-1"})}
    uses = {(u.pod, u.role): u for u in view.gpu_uses(pods, {})}
    assert all(u.gpu == () for u in uses.values())
    assert uses[("default/s-0", "sharer")].via == SHADOW
    assert uses[("team/trainer", "owner")].resource == "nvidia.com/gpu"


def test_a_deeply_nested_shadow_record_is_unreadable_not_a_crash() -> None:
    pods = _cluster()
    pods[1]["metadata"]["annotations"] = {keys.ANNOTATION_SHADOW_OWNER: "[" * 100_000 + "]" * 100_000}
    uses = {(u.pod, u.role): u for u in view.gpu_uses(pods, {})}
    assert uses[("default/s-0", "sharer")].via == ""


def test_a_gpu_by_id_or_unique_prefix_lists_its_shadow_and_sharers() -> None:
    uses = view.gpu_uses(_cluster(), {NODE: _agent_doc()})
    by_id = view.uses_of_gpu(uses, GPU)
    assert [(u.role, u.pod) for u in by_id] == [("shadow", SHADOW), ("sharer", "default/s-0")]
    assert view.uses_of_gpu(uses, "gpu-0a1b") == by_id
    assert view.uses_of_gpu(uses, "GPU-") == []  # two GPUs start so: ambiguous, nothing guessed
    assert [u.role for u in view.uses_of_pod(uses, "batch/b-0")] == ["borrower"]


def test_finished_pods_and_unreadable_pods_use_nothing() -> None:
    done = pod("done", node=NODE, phase="Succeeded", requests={"nvidia.com/gpu": 1}, camel=True)
    broken: dict[str, Any] = {"metadata": {"name": "x"}}
    assert view.gpu_uses([done, broken], {}) == []


def _node(name: str, alloc: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"allocatable": alloc}}


def _agent_pod(node: str, ready: bool = True, restarts: int = 0) -> dict[str, Any]:
    return {
        "metadata": {"name": f"gpushare-agent-{node}"},
        "spec": {"nodeName": node},
        "status": {
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "containerStatuses": [{"name": "agent", "restartCount": restarts}],
        },
    }


def test_node_rows_from_agents_and_the_api() -> None:
    nodes = [
        _node(NODE, {"nvidia.com/gpu": "2", "gpushare/share-gpu-4": "4", "cpu": "8"}),
        _node("node-b", {"nvidia.com/gpu": "1"}),
        _node("cpu-only", {"cpu": "8"}),
    ]
    rows = view.node_rows(
        nodes,
        _cluster(),
        agent_pods={NODE: _agent_pod(NODE), "node-b": _agent_pod("node-b", ready=False, restarts=3)},
        docs={NODE: _agent_doc(problems=["pod x unreadable"])},
        errors={"node-b": "kubectl exec gpushare-agent-node-b: forbidden"},
        leader=NODE,
        now=1004.0,
    )
    a, b = rows
    assert (a.node, a.agent_ready, a.leader, a.nri, a.gpus, a.shadows, a.sharers, a.borrowers) == (
        NODE, True, True, True, 2, 1, 1, 1,
    )  # fmt: skip
    assert a.advertised == {"gpushare/share-gpu-4": 4} and a.spot == {"stolen": 1}
    assert a.last_pass_age_s == 4.0 and a.source == "agent" and a.problems == ("pod x unreadable",)
    assert (b.node, b.agent_ready, b.restarts, b.leader, b.nri, b.source) == ("node-b", False, 3, False, None, "api")
    assert b.problems == ("agent status unavailable: kubectl exec gpushare-agent-node-b: forbidden",)


def test_a_gpu_node_without_an_agent_is_a_problem() -> None:
    (row,) = view.node_rows(
        [_node("bare", {"nvidia.com/gpu": "4"})], [], agent_pods={}, docs={}, errors={}, leader="", now=0
    )
    assert row.agent_pod == "" and row.agent_ready is None and row.problems == ("no gpushare agent pod on this node",)


# -- why -----------------------------------------------------------------------------------------------------


def _event(reason: str, message: str, when: str = "2026-12-03T10:00:00Z", **kw: Any) -> dict[str, Any]:
    return {"reason": reason, "message": message, "lastTimestamp": when, "type": "Warning", **kw}


def _refused(message: str) -> dict[str, Any]:
    p = pod("thief", node=NODE, camel=True)
    p["status"]["containerStatuses"] = [
        {"name": "app", "state": {"waiting": {"reason": "CreateContainerError", "message": message}}}
    ]
    return p


def test_a_container_the_nri_plugin_refused_is_explained_with_its_rule_and_fix() -> None:
    msg = "failed to create containerd container: gpushare: annotation x names y, not a container of this pod"
    e = explain("default/thief", _refused(msg), [], [], {})
    assert (e.state, e.reason) == ("Refused", "CreateContainerError")
    assert "refused it" in e.explanation and "not a container of this pod" in e.explanation
    assert "same pod" in e.fix
    assert e.paragraph == f"{e.explanation} Fix: {e.fix}" and "\n" not in e.paragraph


@pytest.mark.parametrize(
    "message, needle",
    [
        ("gpushare: k is also a pod annotation of p", "remove that key"),
        ("gpushare: ... not created yet; kubelet retries", "kubelet retries"),
        ("gpushare: refused: no PodResources oracle", "gpushare doctor"),
        ("gpushare: pod t/p asks for a and b; ... (container 'x' refused on the node)", "separate pods"),
        ("gpushare: something new", "docs/nri.md"),
    ],
)
def test_each_refusal_rule_has_its_fix(message: str, needle: str) -> None:
    assert needle in refusal_fix(message)


def test_a_sharer_waiting_on_an_unschedulable_shadow() -> None:
    waiting = sharer("s-9", camel=True)
    ev = _event("ShadowUnschedulable", "gpushare: no free slot of gpushare/share-gpu-4; ... cannot be scheduled: 0/1")
    e = explain("default/s-9", waiting, [ev], [], {})
    assert (e.state, e.reason) == ("Pending", "ShadowUnschedulable")
    assert "cannot be scheduled" in e.explanation and "free a GPU" in e.fix


def test_a_sharer_pending_before_the_agent_wrote_its_event_reads_the_shadow_itself() -> None:
    stuck = shadow("shadow-share-4-abcd0123-1", phase="Pending", node="", camel=True)
    stuck["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "False", "message": "0/1 nodes are available: 1 Insufficient nvidia.com/gpu"}
    ]
    e = explain("default/s-9", sharer("s-9", camel=True), [], [stuck], {})
    assert e.reason == "ShadowUnschedulable" and "Insufficient nvidia.com/gpu" in e.explanation


def test_a_sharer_pending_with_no_shadow_yet_waits_for_the_leader() -> None:
    e = explain("default/s-9", sharer("s-9", camel=True), [_event("FailedScheduling", "Insufficient ...")], [], {})
    assert e.reason == "FailedScheduling" and "Lease" in e.explanation and "kubectl gpushare status" in e.fix


def test_a_sharer_pending_while_its_shadows_gpu_is_unhealthy_says_which_gpu() -> None:
    why = "GPU GPU-3 is Unhealthy at the nvidia.com/gpu device plugin"
    doc = {"shadows": [{"pod": "gpushare-system/s4", "resource": "gpushare/share-gpu-4", "unhealthy": why}]}
    e = explain("default/s-9", sharer("s-9", camel=True), [_event("FailedScheduling", "Insufficient")], [], {NODE: doc})
    assert e.reason == "GPUUnhealthy"
    assert f"gpushare-system/s4 on {NODE} ({why})" in e.explanation and "repair or replace the GPU" in e.fix


def test_a_refused_mix_waiting_for_nothing_says_so() -> None:
    mix = pod("m", requests={keys.RESOURCE_SPOT_GPU: 1, "gpushare/share-gpu-4": 1}, camel=True)
    ev = _event("GpuRequestsRefused", "gpushare: pod default/m asks for ...; gpushare gives it no GPU on any node")
    e = explain("default/m", mix, [ev], [], {})
    assert (e.state, e.reason) == ("Pending", "GpuRequestsRefused") and "separate pods" in e.fix


def test_a_borrower_pending_lists_the_spot_states() -> None:
    b = pod("b-1", requests={keys.RESOURCE_SPOT_GPU: 1}, camel=True)
    e = explain("default/b-1", b, [], [], {NODE: _agent_doc()})
    assert "GPU-owner=stolen" in e.explanation and "lendable=true" in e.fix


@pytest.mark.parametrize(
    "reason", ["ShadowGone", "OwnerBack", "OwnerLeft", "OwnerNotLendable", "GpuRequestsRefused", "PodUnreadable"]
)
def test_an_evicted_pod_is_explained_from_its_event_after_it_is_gone(reason: str) -> None:
    e = explain("default/s-0", None, [_event(reason, f"deleted: {reason}")], [], {})
    assert (e.state, e.reason) == ("Evicted", reason)
    assert reason in e.explanation and e.fix and "Fix:" not in e.explanation


def test_an_eviction_known_only_to_the_agent() -> None:
    doc = _agent_doc(evictions=[{"pod": "default/s-0", "reason": "ShadowGone", "message": "shadow x gone"}])
    e = explain("default/s-0", None, [], [], {NODE: doc})
    assert e.reason == "ShadowGone"


def test_a_namesake_running_again_is_not_called_evicted() -> None:
    again = sharer("s-0", node=NODE, phase="Running", camel=True)
    e = explain("default/s-0", again, [_event("ShadowGone", "old")], [], {NODE: _agent_doc()})
    assert e.state == "Running" and e.fix == ""


def test_a_controller_whose_pods_admission_refused() -> None:
    ev = _event(
        "FailedCreate",
        "Error creating: pods \"job-x\" is forbidden: ValidatingAdmissionPolicy 'gpushare' denied request: no",
        involvedObject={"kind": "Job", "name": "job"},
    )
    e = explain("default/job", None, [ev], [], {})
    assert (e.state, e.reason) == ("Refused", "FailedCreate") and "Job" in e.explanation


def test_an_unknown_pod() -> None:
    e = explain("default/nope", None, [], [], {})
    assert e.state == "NotFound" and "admission" in e.explanation


def test_running_on_a_node_whose_nri_is_down_says_so() -> None:
    running = sharer("s-0", node=NODE, phase="Running", camel=True)
    e = explain("default/s-0", running, [], [], {NODE: _agent_doc(nri={"connected": False})})
    assert "not connected to containerd's NRI socket" in e.explanation
