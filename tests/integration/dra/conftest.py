"""DRA tier: gpushare's DRA driver on the newest supported Kubernetes, with the real scheduler,
kubelet and containerd, and the fake vendor's GPUs described by its CDI spec.

One DRA node per module (``dra``): the plugin runs as a host process next to the session's
cluster; the DeviceClasses are the chart's, rendered by helm.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from localcluster.cluster import Cluster
from localcluster.pods import pod_manifest
from tests.harness.cluster_fixture import cluster  # noqa: F401
from tests.harness.worlds.dra import DRIVER, DraNode, dra_node

NAMESPACE = "dra-e2e"


@pytest.fixture(scope="module")
def dra(cluster: Cluster) -> Iterator[DraNode]:  # noqa: F811
    cluster.kubectl("create", "namespace", NAMESPACE, check=False)
    with dra_node(cluster) as node:
        yield node
        cluster.kubectl("delete", "pods,resourceclaims", "--all", "-n", NAMESPACE, "--wait=true", timeout_s=120)


class Api:
    """The few calls the DRA tests make, on the cluster's admin credentials."""

    def __init__(self, cluster: Cluster) -> None:  # noqa: F811
        self.cluster = cluster

    def apply(self, obj: dict[str, Any]) -> None:
        self.cluster.kubectl("apply", "-f", "-", input=json.dumps(obj))

    def claims(self) -> list[dict[str, Any]]:
        got: dict[str, Any] = self.cluster.request(
            "GET", f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims"
        )
        return list(got["items"])

    def claim(self, name: str) -> dict[str, Any]:
        got: dict[str, Any] = self.cluster.request(
            "GET", f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims/{name}"
        )
        return got

    def pods(self) -> list[dict[str, Any]]:
        got: dict[str, Any] = self.cluster.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods")
        return list(got["items"])

    def pod(self, name: str) -> dict[str, Any]:
        got: dict[str, Any] = self.cluster.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")
        return got

    def delete_pods(self, *names: str) -> None:
        self.cluster.kubectl("delete", "pod", "-n", NAMESPACE, "--wait=true", "--grace-period=0", *names, timeout_s=120)

    def wait_running(self, names: list[str], timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            phases = {p["metadata"]["name"]: p.get("status", {}).get("phase") for p in self.pods()}
            if all(phases.get(n) == "Running" for n in names):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"not Running after {timeout_s} s: {phases}; {self.why(names)}")
            time.sleep(0.3)

    def why(self, names: list[str]) -> str:
        res = self.cluster.kubectl(
            "get", "events", "-n", NAMESPACE, "-o", "custom-columns=OBJ:.involvedObject.name,MSG:.message", check=False
        )
        lines = [line for line in res.stdout.splitlines() if any(n in line for n in names)]
        return "\n".join(lines[-20:])

    def exec(self, pod: str, *argv: str) -> str:
        return self.cluster.kubectl("exec", "-n", NAMESPACE, pod, "--", *argv).stdout


@pytest.fixture(scope="module")
def api(cluster: Cluster) -> Api:  # noqa: F811
    return Api(cluster)


def share_pod(name: str, n: int = 4, kind: str = "share-gpu") -> dict[str, Any]:
    return pod_manifest(name, namespace=NAMESPACE, resources={f"gpushare/{kind}-{n}": "1"})


def claim_pod(name: str, claim: str) -> dict[str, Any]:
    pod = pod_manifest(name, namespace=NAMESPACE)
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim}]
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    return pod


def claim(
    name: str, device_class: str, *, milli: int | None = None, tolerations: list[Any] | None = None
) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": device_class}
    if milli is not None:
        exactly["capacity"] = {"requests": {"milli": str(milli)}}
    if tolerations:
        exactly["tolerations"] = tolerations
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }


def results(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """A claim's allocation results of gpushare's driver."""
    alloc = (obj.get("status") or {}).get("allocation") or {}
    return [r for r in (alloc.get("devices") or {}).get("results", []) if r.get("driver") == DRIVER]
