"""controller.io.exporter_pods: the one LIST a k8s://pods/ source makes, and its refusals as MetricsError."""

from __future__ import annotations

from typing import Any

import pytest

from controller.io.exporter_pods import ExporterPods, trim_exporter_pod
from controller.io.kube_client import KubeClient, _translate
from gpumetrics.discovery import GPU_OPERATOR_SOURCE, parse_pod_source, pick_endpoint
from gpumetrics.errors import MetricsError
from tests.unit.gpumetrics.test_discovery import NODE, exporter_pod

SPEC = parse_pod_source(GPU_OPERATOR_SOURCE)


def client_answering(answer: Any, asked: list[tuple[str, str, dict[str, Any]]]) -> KubeClient:
    def call(method: str, path: str, *, query: dict[str, Any]) -> tuple[int, Any]:
        asked.append((method, path, dict(query)))
        if isinstance(answer, Exception):
            raise answer
        return 200, answer

    client = object.__new__(KubeClient)
    client._call = call  # type: ignore[method-assign,assignment]
    return client


def test_one_list_in_the_sources_namespace_with_its_selector_on_this_node() -> None:
    pod = exporter_pod()
    pod["metadata"]["annotations"] = {"big": "x" * 10_000}
    pod["spec"]["containers"][0]["env"] = [{"name": "DCGM_EXPORTER_LISTEN", "value": ":9400"}]
    asked: list[tuple[str, str, dict[str, Any]]] = []
    pods = ExporterPods(client_answering({"metadata": {"resourceVersion": "3"}, "items": [pod]}, asked))(SPEC, NODE)
    [(method, path, query)] = asked
    assert (method, path) == ("GET", "/api/v1/namespaces/gpu-operator/pods")
    assert query["labelSelector"] == "app=nvidia-dcgm-exporter" and query["fieldSelector"] == f"spec.nodeName={NODE}"
    assert "annotations" not in pods[0]["metadata"] and "env" not in pods[0]["spec"]["containers"][0]
    assert pick_endpoint(SPEC, NODE, pods).url == "http://10.244.3.17:9400/metrics"  # the trim keeps what is read


def test_the_trim_keeps_every_field_the_choice_reads() -> None:
    pod = exporter_pod("leaving", deleting=True)
    assert trim_exporter_pod(pod) == {
        "metadata": pod["metadata"],
        "spec": {
            "nodeName": NODE,
            "containers": [{"ports": [{"name": "metrics", "containerPort": 9400}]}],
            "initContainers": [],
        },
        "status": {"phase": "Running", "podIP": "10.244.3.17", "conditions": [{"type": "Ready", "status": "True"}]},
    }


def test_an_rbac_refusal_names_the_source_what_was_looked_for_and_the_manifest() -> None:
    denied = _translate(
        403,
        "GET /api/v1/namespaces/gpu-operator/pods",
        b'{"message": "pods is forbidden: User \\"x\\" cannot list resource \\"pods\\" in gpu-operator"}',
        None,
    )
    with pytest.raises(MetricsError) as err:
        ExporterPods(client_answering(denied, []))(SPEC, NODE)
    message = str(err.value)
    assert message.startswith(
        f"gpushare: metrics source {GPU_OPERATOR_SOURCE}: cannot list pods to find a pod labelled"
    )
    assert "was refused with 403" in message and "manifests/20-rbac.yaml" in message
    assert message.count("gpushare:") == 1
