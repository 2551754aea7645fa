"""The pods a ``k8s://pods/...`` metrics source names, listed on this node (docs/metrics.md).

One LIST in the source's namespace, with its label selector and the field selector
``spec.nodeName=<node>``, made only when the scraper has no readable exporter pod (at start,
and after a read of the pod it had failed); ``gpumetrics.discovery.pick_endpoint`` chooses
among what comes back. The agent's ClusterRole already lists pods in every namespace
(manifests/chart/templates/20-rbac.yaml), so the exporter's namespace needs nothing more.

Each pod is trimmed as its page arrives to what the choice reads: a namespace the agent does
not own may hold large pods, and only a few fields of each matter here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from controller.errors import KubeError
from controller.io.kube_client import KubeClient
from gpumetrics.discovery import PodSource
from gpumetrics.errors import MetricsError


def trim_exporter_pod(pod: Mapping[str, Any]) -> dict[str, Any]:
    """What ``pick_endpoint`` reads of a pod: its name, node, ports, phase, readiness and IP."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}

    def ports(containers: Any) -> list[dict[str, Any]]:
        return [{"ports": list(c.get("ports") or [])} for c in containers or [] if isinstance(c, Mapping)]

    return {
        "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "deletionTimestamp") if k in meta},
        "spec": {
            "nodeName": spec.get("nodeName"),
            "containers": ports(spec.get("containers")),
            "initContainers": ports(spec.get("initContainers")),
        },
        "status": {
            "phase": status.get("phase"),
            "podIP": status.get("podIP"),
            "conditions": [
                {"type": c.get("type"), "status": c.get("status")}
                for c in status.get("conditions") or []
                if isinstance(c, Mapping)
            ],
        },
    }


class ExporterPods:
    """A ``gpumetrics.scrape.PodLister`` over the agent's API client (its own: never the loop's)."""

    def __init__(self, client: KubeClient) -> None:
        self.client = client

    def __call__(self, spec: PodSource, node: str) -> list[dict[str, Any]]:
        try:
            pods, _ = self.client.list_pods(
                namespace=spec.namespace,
                label_selector=spec.label_selector,
                field_selector=f"spec.nodeName={node}",
                each=trim_exporter_pod,
            )
        except KubeError as exc:
            why = str(exc).removeprefix("gpushare: ")
            raise MetricsError(
                f"gpushare: metrics source {spec.source}: cannot list pods to find {spec.looked_for(node)}: {why}"
            ) from exc
        return pods

    def close(self) -> None:
        self.client.close()


__all__ = ["ExporterPods", "trim_exporter_pod"]
