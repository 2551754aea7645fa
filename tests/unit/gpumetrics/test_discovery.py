"""gpumetrics.discovery: the k8s://pods/ source read, and the node's exporter pod picked from listed pods."""

from __future__ import annotations

from typing import Any

import pytest

from gpumetrics.discovery import (
    GPU_OPERATOR_SOURCE,
    PodSource,
    is_pod_source,
    parse_pod_source,
    pick_endpoint,
    relist_delay_s,
)
from gpumetrics.errors import MetricsError

NODE = "gpu-node-1"
SPEC = parse_pod_source(GPU_OPERATOR_SOURCE)


def exporter_pod(
    name: str = "nvidia-dcgm-exporter-x7k2p",
    *,
    node: str = NODE,
    ip: str | None = "10.244.3.17",
    phase: str = "Running",
    ready: bool = True,
    ports: list[dict[str, Any]] | None = None,
    deleting: bool = False,
) -> dict[str, Any]:
    """A pod as the GPU Operator's dcgm-exporter DaemonSet makes it (API JSON, as listed)."""
    meta: dict[str, Any] = {"name": name, "namespace": "gpu-operator", "uid": f"uid-{name}"}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    status: dict[str, Any] = {"phase": phase, "conditions": [{"type": "Ready", "status": str(ready)}]}
    if ip is not None:
        status["podIP"] = ip
    return {
        "metadata": meta,
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "nvidia-dcgm-exporter",
                    "ports": ports if ports is not None else [{"name": "metrics", "containerPort": 9400}],
                }
            ],
        },
        "status": status,
    }


def test_the_gpu_operator_preset_reads_as_its_layout() -> None:
    assert PodSource(GPU_OPERATOR_SOURCE, "gpu-operator", "app=nvidia-dcgm-exporter", "metrics") == SPEC
    assert SPEC.scheme == "http" and SPEC.path == "/metrics"
    assert is_pod_source(GPU_OPERATOR_SOURCE) and not is_pod_source("http://127.0.0.1:9400/metrics")


def test_every_part_of_the_source_is_read_escaped_or_not() -> None:
    source = "k8s://pods/monitoring?labelSelector=app%3Ddcgm%2Ctier%20in%20(a%2Cb)&port=9500&scheme=https&path=/m"
    spec = parse_pod_source(source)
    assert (spec.namespace, spec.label_selector, spec.port, spec.scheme, spec.path) == (
        "monitoring",
        "app=dcgm,tier in (a,b)",
        "9500",
        "https",
        "/m",
    )
    assert parse_pod_source("k8s://pods/m?labelSelector=app!=x,k&port=metrics").label_selector == "app!=x,k"


@pytest.mark.parametrize(
    ("source", "needle"),
    [
        ("k8s://services/gpu-operator?labelSelector=a=b&port=metrics", "starts with k8s://pods/"),
        ("k8s://pods/?labelSelector=a=b&port=metrics", "'' is not a namespace name"),
        ("k8s://pods/GPU_op?labelSelector=a=b&port=metrics", "'GPU_op' is not a namespace name"),
        ("k8s://pods/a/b?labelSelector=a=b&port=metrics", "'a/b' is not a namespace name"),
        ("k8s://pods/gpu-operator?port=metrics", "labelSelector is required"),
        ("k8s://pods/gpu-operator?labelSelector=&port=metrics", "labelSelector is required"),
        ("k8s://pods/gpu-operator?labelSelector=a=b", "port is required"),
        ("k8s://pods/gpu-operator?labelSelector=a=b&port=0", "port 0 is not between 1 and 65535"),
        ("k8s://pods/gpu-operator?labelSelector=a=b&port=Metrics", "neither a number nor a container port"),
        ("k8s://pods/gpu-operator?labelSelector=a=b&port=a-very-long-port-name", "neither a number"),
        ("k8s://pods/gpu-operator?labelSelector=a=b&port=metrics&scheme=ftp", "scheme must be http or https"),
        ("k8s://pods/gpu-operator?labelSelector=a=b&port=metrics&path=metrics", "path must start with /"),
        ("k8s://pods/gpu-operator?labelSelector=a=b&port=metrics&selector=x", "unknown key 'selector'"),
        ("k8s://pods/gpu-operator?labelSelector=a=b&port=metrics&port=9400", "port is given twice"),
        ("k8s://pods/gpu-operator?labelSelector=a=b&port", "'port' has no value"),
        ("k8s://pods/gpu-operator?labelSelector=a=b&port=metrics#x", "a fragment"),
    ],
)
def test_a_malformed_source_is_refused_naming_the_problem_and_the_form(source: str, needle: str) -> None:
    with pytest.raises(MetricsError) as err:
        parse_pod_source(source)
    assert needle in str(err.value) and source in str(err.value)
    assert "k8s://pods/<namespace>?labelSelector=" in str(err.value)


def test_the_ready_pod_on_this_node_is_scraped_at_its_ip_and_named_port() -> None:
    pods = [exporter_pod(), exporter_pod("on-another-node", node="gpu-node-2", ip="10.244.9.9")]
    found = pick_endpoint(SPEC, NODE, pods)
    assert found.url == "http://10.244.3.17:9400/metrics"
    assert (found.key, found.uid, found.port) == (
        "gpu-operator/nvidia-dcgm-exporter-x7k2p",
        "uid-nvidia-dcgm-exporter-x7k2p",
        9400,
    )


def test_a_pod_on_another_node_is_never_picked_even_if_the_listing_returned_it() -> None:
    with pytest.raises(MetricsError) as err:
        pick_endpoint(SPEC, NODE, [exporter_pod(node="gpu-node-2")])
    message = str(err.value)
    assert "no Running and Ready pod" in message
    assert "a pod labelled app=nvidia-dcgm-exporter in namespace gpu-operator on node gpu-node-1" in message
    assert "found only" not in message  # the other node's pod is not this node's


def test_pods_not_ready_are_named_with_why_they_were_not_taken() -> None:
    pods = [
        exporter_pod("starting", phase="Pending", ip=None),
        exporter_pod("warming", ready=False),
        exporter_pod("leaving", deleting=True),
    ]
    with pytest.raises(MetricsError) as err:
        pick_endpoint(SPEC, NODE, pods)
    assert "found only leaving (terminating), starting (Pending), warming (not Ready)" in str(err.value)


def test_an_old_pod_terminating_beside_its_ready_replacement_gives_way() -> None:
    pods = [exporter_pod("old", deleting=True, ip="10.244.3.1"), exporter_pod("new", ip="10.244.3.2")]
    assert pick_endpoint(SPEC, NODE, pods).pod == "new"


def test_two_ready_exporters_on_one_node_are_refused_by_name() -> None:
    with pytest.raises(MetricsError) as err:
        pick_endpoint(SPEC, NODE, [exporter_pod("b"), exporter_pod("a")])
    assert "2 Running and Ready pods match" in str(err.value) and "(a, b)" in str(err.value)
    assert "narrow labelSelector" in str(err.value)


def test_a_missing_named_port_lists_the_ports_the_pod_has() -> None:
    pod = exporter_pod(ports=[{"name": "gpu-metrics", "containerPort": 9400}, {"containerPort": 5555}])
    with pytest.raises(MetricsError) as err:
        pick_endpoint(SPEC, NODE, [pod])
    assert "declares no container port named 'metrics' (its ports: 9400/gpu-metrics, 5555)" in str(err.value)


def test_a_numbered_port_is_taken_as_given_and_the_scheme_and_path_carry_over() -> None:
    spec = parse_pod_source("k8s://pods/gpu-operator?labelSelector=a=b&port=9500&scheme=https&path=/x/metrics")
    assert pick_endpoint(spec, NODE, [exporter_pod(ports=[])]).url == "https://10.244.3.17:9500/x/metrics"


def test_a_named_port_of_a_sidecar_counts_and_ipv6_is_bracketed() -> None:
    pod = exporter_pod(ip="fd00::17", ports=[])
    pod["spec"]["initContainers"] = [{"name": "side", "ports": [{"name": "metrics", "containerPort": 9401}]}]
    assert pick_endpoint(SPEC, NODE, [pod]).url == "http://[fd00::17]:9401/metrics"


def test_a_ready_pod_without_an_ip_and_an_unnamed_node_are_refused() -> None:
    with pytest.raises(MetricsError, match="has no IP yet"):
        pick_endpoint(SPEC, NODE, [exporter_pod(ip="")])
    with pytest.raises(MetricsError, match="needs this node's name"):
        pick_endpoint(SPEC, "", [exporter_pod()])


def test_lists_back_off_from_at_once_to_a_minute() -> None:
    assert [relist_delay_s(n) for n in range(8)] == [0.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]
