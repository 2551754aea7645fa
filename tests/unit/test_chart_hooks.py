"""The chart's hooks: the uninstall Jobs and `helm test`'s install check.

Their accounts grant exactly what their commands send (the agent's own RBAC is checked in
test_rbac_client.py), the plain manifests never carry a hook, and the install check's verdict is
read from plain objects.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import typer

from cli import install_check, uninstall
from controller.core.dependents import Dependent
from controller.core.pod_facts import PodRef
from controller.io.kube_client import KubeClient
from gpushare import installation, keys
from tests.harness.rbac import NAMESPACE, compare, grants_from
from tests.unit.test_chart_values import _refused
from tests.unit.test_manifests_rendered import _template
from tests.unit.test_rbac_client import _Recorder, use_of

REPO = Path(__file__).resolve().parents[2]


def _hooks(*sets: str) -> list[dict[str, Any]]:
    return [d for d in _template(*sets) if "helm.sh/hook" in (d["metadata"].get("annotations") or {})]


def _uses(recorder: _Recorder) -> set[Any]:
    return {use_of(*r) for r in recorder.requests}


class _ShadowRecorder(_Recorder):
    """Lists one shadow in the installation's namespace, so that `finish` deletes it."""

    def call_api(self, method: str, path: str, query: dict[str, list[str]], **kw: Any) -> Any:
        response = super().call_api(method, path, query, **kw)
        if method == "GET" and path == f"/api/v1/namespaces/{NAMESPACE}/pods":
            labels = {keys.LABEL_ROLE: keys.ROLE_SHADOW}
            shadow = {"metadata": {"namespace": NAMESPACE, "name": "s", "uid": "u", "labels": labels}}
            response._body = json.dumps({"items": [shadow], "metadata": {"resourceVersion": "1"}}).encode()
        return response


def test_the_uninstall_account_grants_exactly_what_prepare_and_finish_send(monkeypatch: pytest.MonkeyPatch) -> None:
    recorder = _ShadowRecorder()
    monkeypatch.setattr(uninstall, "_client", lambda _kubeconfig: KubeClient(recorder))
    uninstall.prepare(namespace=NAMESPACE, evict=True, timeout="0s", poll="0s", kubeconfig=None)
    # The recorder lists no pod: evict one as the loop would.
    uninstall._evict_all(KubeClient(recorder), [Dependent(PodRef("team-a", "p", "u"), "n", "x")], 0.0, 0.1)
    uninstall.finish(namespace=NAMESPACE, kubeconfig=None)
    grants = grants_from(_hooks("uninstall.evictTenants=true"), "gpushare-uninstall", names=True)
    verdict = compare(grants, _uses(recorder))
    assert verdict.exact, verdict.explain()


def test_the_uninstall_accounts_named_objects_are_the_ones_the_code_deletes() -> None:
    docs = _hooks("uninstall.evictTenants=true")
    names = {
        (rule["resources"][0], tuple(rule["resourceNames"]))
        for d in docs
        if d["kind"] in ("ClusterRole", "Role")
        for rule in d["rules"]
        if rule.get("resourceNames")
    }
    assert names == {
        ("namespaces", (NAMESPACE,)),
        ("leases", (keys.LEASE_NAME,)),
        ("validatingadmissionpolicies", (uninstall.UNINSTALLING_POLICY,)),
    }
    policies = {d["metadata"]["name"] for d in docs if d["kind"].startswith("ValidatingAdmissionPolicy")}
    assert policies == {uninstall.UNINSTALLING_POLICY}


def test_the_test_account_grants_exactly_what_install_check_sends(monkeypatch: pytest.MonkeyPatch) -> None:
    recorder = _Recorder()
    monkeypatch.setattr(KubeClient, "from_kubeconfig", classmethod(lambda cls, *_a, **_kw: KubeClient(recorder)))
    with pytest.raises(typer.Exit):  # the recorder lists no DaemonSet: not serving
        install_check.install_check(namespace=NAMESPACE, timeout="0s", kubeconfig=None)
    verdict = compare(grants_from(_hooks(), "gpushare-test"), _uses(recorder))
    assert verdict.exact, verdict.explain()


def test_hooks_run_only_under_helm_never_from_the_plain_manifests() -> None:
    kinds = {(d["kind"], d["metadata"]["annotations"]["helm.sh/hook"]) for d in _hooks()}
    assert ("Job", "pre-delete") in kinds and ("Job", "post-delete") in kinds and ("Pod", "test") in kinds
    for path in (REPO / "manifests").glob("*.yaml"):
        assert "helm.sh/hook" not in path.read_text(), path


def test_prepare_evicts_only_when_asked_and_the_policy_comes_with_every_uninstall() -> None:
    def commands(*sets: str) -> list[list[str]]:
        return [d["spec"]["template"]["spec"]["containers"][0]["command"] for d in _hooks(*sets) if d["kind"] == "Job"]

    assert commands() == [
        ["gpushare", "uninstall", "prepare", "--namespace", NAMESPACE, "--timeout", "10m"],
        ["gpushare", "uninstall", "finish", "--namespace", NAMESPACE],
    ]
    assert ["gpushare", "uninstall", "prepare", "--namespace", NAMESPACE, "--timeout", "90s", "--evict"] in commands(
        "uninstall.evictTenants=true", "uninstall.timeout=90s"
    )
    policies = [d for d in _hooks() if d["kind"].startswith("ValidatingAdmissionPolicy")]
    assert {d["metadata"]["annotations"]["helm.sh/hook"] for d in policies} == {"pre-delete"}
    assert all("hook-succeeded" not in d["metadata"]["annotations"]["helm.sh/hook-delete-policy"] for d in policies)
    left = {d["metadata"]["name"] for d in _hooks("uninstall.enabled=false", "uninstall.evictTenants=true")}
    assert left == {"gpushare-test", "gpushare-install-check"}


def test_a_bad_uninstall_timeout_is_refused_by_name() -> None:
    assert "/uninstall/timeout" in _refused("uninstall.timeout=soon")  # values.schema.json


# -- the install check's verdict ------------------------------------------------------------------


def _ds(name: str, desired: int, ready: int, updated: int | None = None) -> dict[str, Any]:
    status = {"desiredNumberScheduled": desired, "numberReady": ready, "observedGeneration": 2}
    status["updatedNumberScheduled"] = desired if updated is None else updated
    return {"metadata": {"name": name, "generation": 2}, "status": status}


def _agent_on(node: str) -> dict[str, Any]:
    return {"spec": {"nodeName": node}}


def _node(name: str, **allocatable: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"allocatable": {"cpu": "8", **allocatable}}}


def test_a_rolled_out_install_whose_nodes_serve_passes() -> None:
    installation.use_namespace(NAMESPACE)
    v = install_check.verdict(
        [_ds("gpushare-agent", 1, 1), _ds("gpushare-agent-dra", 1, 1)],
        [_agent_on("n1"), _agent_on("n2")],
        [_node("n1", **{"gpushare/share-gpu-4": "4", "nvidia.com/gpu": "1"}), _node("n2")],
        [{"spec": {"nodeName": "n2", "driver": keys.DOMAIN}}],
    )
    assert v.problems == []
    assert v.ok == [
        "node n1: serves gpushare/share-gpu-4",
        f"node n2: serves GPUs through the DRA driver {keys.DOMAIN}",
    ]


@pytest.mark.parametrize(
    ("daemonsets", "agents", "nodes", "expected"),
    [
        ([], [], [], "no agent DaemonSet in namespace gpushare-system"),
        ([_ds("gpushare-agent", 0, 0)], [], [], "no node runs the agent: label the GPU nodes"),
        ([_ds("gpushare-agent", 2, 1)], [_agent_on("n1")], [_node("n1", **{"gpushare/share-gpu-2": "2"})], "1 of 2"),
        ([_ds("gpushare-agent", 1, 1, 0)], [_agent_on("n1")], [_node("n1", **{"gpushare/share-gpu-2": "2"})], "0 up"),
        ([_ds("gpushare-agent", 1, 1)], [_agent_on("n1")], [_node("n1")], "node n1: its agent runs but the node"),
    ],
)
def test_what_is_not_serving_is_said(
    daemonsets: list[dict[str, Any]], agents: list[dict[str, Any]], nodes: list[dict[str, Any]], expected: str
) -> None:
    installation.use_namespace(NAMESPACE)
    v = install_check.verdict(daemonsets, agents, nodes, [])
    assert any(expected in p for p in v.problems), v.problems


def test_an_old_generation_is_not_rolled_out_yet() -> None:
    ds = _ds("gpushare-agent", 1, 1)
    ds["metadata"]["generation"] = 3
    v = install_check.verdict([ds], [_agent_on("n1")], [_node("n1", **{"gpushare/share-gpu-2": "2"})], [])
    assert v.problems == ["DaemonSet gpushare-agent: its controller has not seen the latest spec yet"]


def test_prepare_refuses_bad_flags_before_reading_anything(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_client(_kubeconfig: str | None) -> KubeClient:
        raise AssertionError("read the API before checking its flags")

    monkeypatch.setattr(uninstall, "_client", no_client)
    with pytest.raises(typer.BadParameter):
        uninstall.prepare(namespace=NAMESPACE, evict=True, timeout="soon", poll="1s", kubeconfig=None)
    with pytest.raises(typer.BadParameter):
        uninstall.prepare(namespace="Not_A_Namespace", evict=False, timeout="1m", poll="1s", kubeconfig=None)


def test_no_hook_pod_matches_an_agent_daemonsets_selector() -> None:
    # A pod the selector matches is adopted by the DaemonSet controller, which deletes it as a
    # surplus pod on its node: `helm test` then fails with its pod gone.
    docs = _template("dra.enabled=true")
    selectors = [d["spec"]["selector"]["matchLabels"] for d in docs if d["kind"] == "DaemonSet"]
    pods = [
        d["spec"]["template"]["metadata"]["labels"] if d["kind"] == "Job" else d["metadata"]["labels"]
        for d in _hooks("uninstall.evictTenants=true")
        if d["kind"] in ("Job", "Pod")
    ]
    assert len(selectors) == 2 and len(pods) == 3
    for labels in pods:
        for selector in selectors:
            assert not selector.items() <= labels.items(), (selector, labels)


class _AnnotatedRecorder(_Recorder):
    """The installation's namespace carries an uninstall annotation of ``value``; one sharer runs."""

    def __init__(self, value: str) -> None:
        super().__init__()
        self.value = value

    def call_api(self, method: str, path: str, query: dict[str, list[str]], **kw: Any) -> Any:
        response = super().call_api(method, path, query, **kw)
        if method == "GET" and path == f"/api/v1/namespaces/{NAMESPACE}":
            meta = {"name": NAMESPACE, "annotations": {keys.ANNOTATION_UNINSTALL: self.value}}
            response._body = json.dumps({"metadata": meta}).encode()
        elif method == "GET" and path == "/api/v1/pods":
            pod = {
                "metadata": {"namespace": "team-a", "name": "s", "uid": "u"},
                "spec": {
                    "nodeName": "n",
                    "containers": [{"name": "c", "resources": {"requests": {"gpushare/share-gpu-4": "1"}}}],
                },
                "status": {"phase": "Running"},
            }
            response._body = json.dumps({"items": [pod], "metadata": {"resourceVersion": "1"}}).encode()
        return response


@pytest.mark.parametrize(("value", "evicts"), [("evict", True), ("evcit", False), ("", False)])
def test_only_the_evict_annotation_evicts_and_another_value_is_named(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], value: str, evicts: bool
) -> None:
    recorder = _AnnotatedRecorder(value)
    monkeypatch.setattr(uninstall, "_client", lambda _kubeconfig: KubeClient(recorder))
    with pytest.raises(typer.Exit):  # the sharer stays listed: the recorder never lets it go
        uninstall.prepare(namespace=NAMESPACE, evict=False, timeout="0s", poll="0s", kubeconfig=None)
    evictions = [r for r in recorder.requests if r[1].endswith("/eviction")]
    assert bool(evictions) == evicts, recorder.requests
    err = capsys.readouterr().err
    assert (f"{keys.ANNOTATION_UNINSTALL}='{value}' is not 'evict'" in err) == (not evicts), err
    assert "team-a/s on n" in err
