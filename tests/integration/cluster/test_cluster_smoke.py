"""Smoke tests of the real one-node cluster: the newest supported kubelet, containerd 2.x and etcd."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from localcluster.cluster import Cluster
from localcluster.images import BUSYBOX_IMAGE
from localcluster.layout import KUBE_VERSION, NODE_NAME

# busybox as PID 1 ignores SIGTERM; this exits at once so deletes do not wait for the grace period.
SLEEP_FOREVER = "trap 'exit 0' TERM; sleep 3600 & wait"


def pod_manifest(
    name: str, command: str, *, host_network: bool = True, resources: dict[str, Any] | None = None
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "main",
        "image": BUSYBOX_IMAGE,
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", command],
    }
    if resources:
        container["resources"] = {"limits": resources, "requests": resources}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"hostNetwork": host_network, "restartPolicy": "Never", "containers": [container]},
    }


def apply(cluster: Cluster, manifest: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def test_node_is_ready_on_loopback_with_containerd_2(cluster: Cluster) -> None:
    node = cluster.node()
    ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
    assert ready and ready[0]["status"] == "True", ready
    info = node["status"]["nodeInfo"]
    assert info["kubeletVersion"] == KUBE_VERSION
    assert info["containerRuntimeVersion"].startswith("containerd://2."), info
    assert {"type": "InternalIP", "address": "127.0.0.1"} in node["status"]["addresses"]
    # kubectl itself works with the admin kubeconfig (what `make cluster-up` hands to people).
    out = cluster.kubectl("get", "node", NODE_NAME, "-o", "jsonpath={.metadata.name}").stdout
    assert out == NODE_NAME


def test_kubelet_sockets_are_private(cluster: Cluster) -> None:
    assert cluster.device_plugin_dir.is_relative_to(cluster.root)
    assert (cluster.device_plugin_dir / "kubelet.sock").is_socket()
    assert cluster.pod_resources_socket.is_socket()
    assert cluster.cri_socket.is_socket() and cluster.nri_socket.is_socket()


def test_pod_runs_and_its_logs_are_readable(cluster: Cluster) -> None:
    name, token = unique("logs"), uuid.uuid4().hex
    apply(cluster, pod_manifest(name, f"echo hello {token}"))
    pod = cluster.wait_pod_phase(name, ["Succeeded", "Failed"])
    assert pod["status"]["phase"] == "Succeeded", pod["status"]
    logs = cluster.kubectl("logs", name).stdout
    assert logs.strip() == f"hello {token}"
    cluster.kubectl("delete", "pod", name, "--wait=true")


def test_service_account_token_is_mounted(cluster: Cluster) -> None:
    name = unique("sa")
    apply(cluster, pod_manifest(name, "cat /var/run/secrets/kubernetes.io/serviceaccount/namespace"))
    pod = cluster.wait_pod_phase(name, ["Succeeded", "Failed"])
    assert pod["status"]["phase"] == "Succeeded", pod["status"]
    assert cluster.kubectl("logs", name).stdout == "default"
    cluster.kubectl("delete", "pod", name, "--wait=true")


def test_deployment_scales_to_three(cluster: Cluster) -> None:
    name = unique("web")
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "hostNetwork": True,
                    "terminationGracePeriodSeconds": 1,
                    "containers": [
                        {
                            "name": "main",
                            "image": BUSYBOX_IMAGE,
                            "imagePullPolicy": "Never",
                            "command": ["sh", "-c", SLEEP_FOREVER],
                        }
                    ],
                },
            },
        },
    }
    apply(cluster, deployment)
    cluster.kubectl("scale", f"deployment/{name}", "--replicas=3")
    cluster.kubectl("rollout", "status", f"deployment/{name}", "--timeout=90s", timeout_s=100)
    dep = cluster.request("GET", f"/apis/apps/v1/namespaces/default/deployments/{name}")
    assert dep["status"]["readyReplicas"] == 3
    pods = cluster.request("GET", f"/api/v1/namespaces/default/pods?labelSelector=app%3D{name}")["items"]
    assert len([p for p in pods if p["status"]["phase"] == "Running"]) == 3
    cluster.kubectl("delete", f"deployment/{name}", "--wait=true")


def pod_cgroups(cluster: Cluster, uid: str) -> list[str]:
    """The pod's cgroup dirs under the cluster's private cgroup root, in any v1 hierarchy."""
    root = cluster.layout.cgroup_root.lstrip("/")
    return [str(p) for p in Path("/sys/fs/cgroup").glob(f"*/{root}/kubepods/**/pod{uid}")]


def test_deleting_a_pod_stops_its_processes(cluster: Cluster) -> None:
    name = unique("del")
    apply(cluster, pod_manifest(name, SLEEP_FOREVER))
    pod = cluster.wait_pod_phase(name, ["Running"])
    uid = pod["metadata"]["uid"]
    assert pod_cgroups(cluster, uid), "kubelet put the pod in no cgroup under the private root"
    cluster.kubectl("delete", "pod", name, "--wait=true", timeout_s=60)
    assert cluster.pod(name) is None
    # kubelet removes the pod cgroup once every process in it is gone.
    cluster.wait_for(f"cgroups of {name} removed", lambda: not pod_cgroups(cluster, uid), 30)


def test_extended_resource_schedules_only_when_advertised(cluster: Cluster) -> None:
    resource = "example.com/fake-gpu"
    escaped = resource.replace("/", "~1")
    name = unique("ext")
    apply(cluster, pod_manifest(name, "echo scheduled", resources={resource: "1"}))
    try:

        def unschedulable() -> bool:
            pod = cluster.pod(name) or {}
            conds = pod.get("status", {}).get("conditions", [])
            return any(c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable" for c in conds)

        cluster.wait_for(f"{name} reported Unschedulable", unschedulable, 30)
        pod = cluster.pod(name)
        assert pod is not None and not pod["spec"].get("nodeName"), "scheduled without the resource"
        msg = next(c["message"] for c in pod["status"]["conditions"] if c["type"] == "PodScheduled")
        assert f"Insufficient {resource}" in msg, msg

        patch = [
            {"op": "add", "path": f"/status/capacity/{escaped}", "value": "2"},
            {"op": "add", "path": f"/status/allocatable/{escaped}", "value": "2"},
        ]
        cluster.request("PATCH", f"/api/v1/nodes/{NODE_NAME}/status", patch, content_type="application/json-patch+json")
        pod = cluster.wait_pod_phase(name, ["Succeeded", "Failed"], timeout_s=60)
        assert pod["spec"]["nodeName"] == NODE_NAME
        assert pod["status"]["phase"] == "Succeeded", pod["status"]
    finally:
        cluster.kubectl("delete", "pod", name, "--ignore-not-found", "--wait=true")
        node = cluster.node()
        if resource in node["status"].get("capacity", {}):
            remove = [
                {"op": "remove", "path": f"/status/capacity/{escaped}"},
                {"op": "remove", "path": f"/status/allocatable/{escaped}"},
            ]
            cluster.request(
                "PATCH", f"/api/v1/nodes/{NODE_NAME}/status", remove, content_type="application/json-patch+json"
            )


def test_pod_network_stays_inside_the_pod(cluster: Cluster) -> None:
    name = unique("net")
    apply(cluster, pod_manifest(name, "ip -o -4 addr; ip route; ip -o link", host_network=False))
    pod = cluster.wait_pod_phase(name, ["Succeeded", "Failed"])
    assert pod["status"]["phase"] == "Succeeded", pod["status"]
    ip = pod["status"]["podIP"]
    assert ip.startswith("10.244."), ip
    logs = cluster.kubectl("logs", name).stdout
    assert f"inet {ip}/32" in logs, logs
    # No default route and no subnet route: nothing can leave the pod's namespace.
    assert "default" not in logs and "via" not in logs, logs
    # Both veth ends live in the pod's namespace; the host never sees one.
    host_links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    assert "gs-peer0" not in host_links
    cluster.kubectl("delete", "pod", name, "--wait=true")


def start_sleeper(cluster: Cluster, prefix: str) -> str:
    name = unique(prefix)
    apply(cluster, pod_manifest(name, SLEEP_FOREVER))
    cluster.wait_pod_phase(name, ["Running"])
    return name


def assert_untouched(cluster: Cluster, name: str) -> None:
    """The pod still runs its first container: a restart of a node daemon did not disturb it."""
    pod = cluster.pod(name)
    assert pod is not None and pod["status"]["phase"] == "Running"
    assert pod["status"]["containerStatuses"][0]["restartCount"] == 0


@pytest.mark.slow
def test_kubelet_restart_keeps_pods_and_recreates_its_socket(cluster: Cluster) -> None:
    name = start_sleeper(cluster, "survive")
    sock = cluster.device_plugin_dir / "kubelet.sock"
    before = sock.stat().st_ctime_ns
    old_pid = cluster.pids["kubelet"]
    cluster.restart_kubelet()
    assert cluster.pids["kubelet"] != old_pid
    assert sock.is_socket() and sock.stat().st_ctime_ns > before, "kubelet did not recreate kubelet.sock"
    assert_untouched(cluster, name)
    cluster.kubectl("delete", "pod", name, "--wait=true")


@pytest.mark.slow
def test_containerd_restart_keeps_pods_and_serves_new_ones(cluster: Cluster) -> None:
    old = start_sleeper(cluster, "old")
    old_pid = cluster.pids["containerd"]
    cluster.restart_containerd()
    assert cluster.pids["containerd"] != old_pid
    new = unique("new")
    apply(cluster, pod_manifest(new, "echo after-restart"))
    pod = cluster.wait_pod_phase(new, ["Succeeded", "Failed"], timeout_s=90)
    assert pod["status"]["phase"] == "Succeeded", pod["status"]
    assert cluster.kubectl("logs", new).stdout.strip() == "after-restart"
    assert_untouched(cluster, old)
    cluster.kubectl("delete", "pod", old, new, "--wait=true")


def test_start_time_and_memory(cluster: Cluster) -> None:
    """The cluster's figures: cached start to node Ready (goal < 30 s) and control-plane memory."""
    ready = cluster.timings["node_ready"]
    rss = cluster.rss_mib()
    control_plane = sum(rss[c] for c in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"))
    print(f"\nnode Ready {ready:.1f} s after start; RSS MiB: {', '.join(f'{k} {v:.0f}' for k, v in rss.items())}")
    print(f"control plane (etcd + apiserver + controller-manager + scheduler): {control_plane:.0f} MiB")
    assert ready < 30, cluster.timings
    assert set(rss) >= {"etcd", "kube-apiserver", "kubelet", "containerd"}, rss


def test_a_host_device_plugin_registers_through_the_private_dir(cluster: Cluster, tmp_path: Path) -> None:
    """The fake vendor plugin runs on the host, kubelet in its mount namespace: they meet in device_plugin_dir."""
    resource = f"example.com/gs-{uuid.uuid4().hex[:6]}"
    # The console script of `pip install -e .` (cli.main has no __main__ guard).
    argv = [str(Path(sys.executable).parent / "gpushare"), "fake-gpus", "--count", "2", "--resource", resource]
    argv += ["--dev-dir", str(tmp_path), "--plugin-dir", str(cluster.device_plugin_dir)]
    with open(tmp_path / "plugin.log", "wb") as log:
        plugin = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=Path(__file__).parents[3])
    name = unique("gpu")
    try:
        cluster.wait_for(
            f"{resource} in node capacity",
            lambda: cluster.node()["status"].get("allocatable", {}).get(resource) == "2",
            30,
        )
        apply(cluster, pod_manifest(name, "echo $FAKE_VISIBLE_DEVICES; ls /dev", resources={resource: "1"}))
        pod = cluster.wait_pod_phase(name, ["Succeeded", "Failed"])
        assert pod["status"]["phase"] == "Succeeded", pod["status"]
        visible, *dev = cluster.kubectl("logs", name).stdout.split()
        assert visible in ("fakegpu0", "fakegpu1") and visible in dev, (visible, dev)
    finally:
        plugin.terminate()
        plugin.wait(timeout=10)
        cluster.kubectl("delete", "pod", name, "--ignore-not-found", "--wait=true")


def test_every_port_of_the_cluster_is_on_loopback(cluster: Cluster) -> None:
    ss = subprocess.run(["ss", "-H", "-ltunp"], capture_output=True, text=True, check=True).stdout
    ours = {pid: name for name, pid in cluster.pids.items()}
    listeners = []
    for line in ss.splitlines():
        fields = line.split()
        pids = {int(p) for p in re.findall(r"pid=(\d+)", line)}
        for pid in pids & ours.keys():
            listeners.append((ours[pid], fields[4]))
    assert {name for name, _ in listeners} >= {"etcd", "kube-apiserver", "kubelet"}, listeners
    assert all(local.startswith("127.0.0.1:") for _, local in listeners), listeners
