"""With the real kubelet: a container that requires gpushare waits while the plugin is down.

kubelet reports it as ``CreateContainerError`` with containerd's validator message, starts the
pod's other containers and every plain pod as usual, keeps retrying, and the container starts on
its own once ``gpushare nri run`` is connected again.
"""

from __future__ import annotations

import json
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

from localcluster.cluster import Cluster
from localcluster.containerd_config import NRI_REQUIRED_PLUGINS_ANNOTATION
from localcluster.pods import pod_manifest
from tests.harness.plugin_process import PluginProcess

VALIDATOR_REFUSAL = 'rejected container adjustment, reason: validation error: required plugin "gpushare" not present'
Condition = Callable[[dict[str, Any]], bool]


def apply(cluster: Cluster, manifest: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))


def container_state(cluster: Cluster, pod: str, container: str) -> dict[str, Any]:
    found = cluster.pod(pod) or {}
    for status in found.get("status", {}).get("containerStatuses", []):
        if status["name"] == container:
            state: dict[str, Any] = status.get("state", {})
            return state
    return {}


def wait_state(
    cluster: Cluster, pod: str, container: str, ok: Condition, *, what: str, timeout_s: float
) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    def reached() -> bool:
        seen["state"] = container_state(cluster, pod, container)
        return ok(seen["state"])

    cluster.wait_for(f"{pod}/{container} {what}", reached, timeout_s)
    state: dict[str, Any] = seen["state"]
    return state


def failed_creates(cluster: Cluster, pod: str) -> int:
    """How often kubelet reported a failed container creation for ``pod`` (Events, as `describe` shows)."""
    selector = urllib.parse.quote(f"involvedObject.name={pod},reason=Failed")
    events = cluster.request("GET", f"/api/v1/namespaces/default/events?fieldSelector={selector}")
    return sum(int(e.get("count") or 1) for e in events.get("items", []) if "failed to create" in e.get("message", ""))


def running(state: dict[str, Any]) -> bool:
    return "running" in state


def create_error(state: dict[str, Any]) -> bool:
    return bool(state.get("waiting", {}).get("reason") == "CreateContainerError")


def test_kubelet_retries_the_required_container_until_the_plugin_is_back(validating_cluster: Cluster) -> None:
    cluster = validating_cluster
    apply(cluster, pod_manifest("plain"))
    requires = {f"{NRI_REQUIRED_PLUGINS_ANNOTATION}/container.app": '["gpushare"]'}
    apply(cluster, pod_manifest("sharer", containers=["sidecar", "app"], annotations=requires))

    cluster.wait_pod_phase("plain", ["Running"], timeout_s=90)
    waiting = wait_state(cluster, "sharer", "app", create_error, what="in CreateContainerError", timeout_s=90)
    assert VALIDATOR_REFUSAL in waiting["waiting"].get("message", ""), waiting
    wait_state(cluster, "sharer", "sidecar", running, what="running", timeout_s=30)
    # kubelet does not give up: it tries again on a later sync of the pod.
    cluster.wait_for("kubelet's second attempt", lambda: failed_creates(cluster, "sharer") >= 2, 120)
    assert cluster.containerd is not None
    assert cluster.containerd.log_text().count("rejecting adjustment") >= 2  # two real CreateContainer calls
    assert not running(container_state(cluster, "sharer", "app"))

    plugin = PluginProcess.gpushare(cluster.containerd, pod_resources_socket=str(cluster.pod_resources_socket))
    with plugin:
        t0 = time.monotonic()
        wait_state(cluster, "sharer", "app", running, what="running once the plugin is back", timeout_s=120)
        print(f"app running {time.monotonic() - t0:.1f} s after the plugin connected")
    assert running(container_state(cluster, "plain", "app"))
    cluster.kubectl("delete", "pod", "plain", "sharer", "--wait=false")
