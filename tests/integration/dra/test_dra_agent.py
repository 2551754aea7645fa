"""The agent in DRA mode, installed as the chart's DRA DaemonSet: lending an idle owner's GPU
through its spot device, the reclaim and the taints' clean-up, Docker-in-Docker on a claim's
devices, and the admission rules for the driver's slices and for claims."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare import keys
from localcluster.agent import agent_mode
from localcluster.cluster import Cluster
from localcluster.pods import pod_manifest
from tests.harness.worlds.agent_pod import AgentPod
from tests.harness.worlds.dra import DRIVER, DraAgentEnv, dra_agent, wait

OWNER_ACTIVE = (keys.TAINT_OWNER_ACTIVE, "NoSchedule")
RECLAIMED = (keys.TAINT_RECLAIMED, "NoExecute")


@pytest.fixture(scope="module")
def env(cluster: Cluster) -> Iterator[DraAgentEnv]:
    for ns in ("team", "spot"):
        cluster.kubectl("create", "namespace", ns, check=False)
    with dra_agent(cluster) as e:
        yield e


def _apply(env: DraAgentEnv, obj: dict[str, Any]) -> None:
    env.cluster.kubectl("apply", "-f", "-", input=json.dumps(obj))


def _owner(env: DraAgentEnv) -> str:
    """A lendable owner holding a whole GPU by a claim; returns the vendor's ID of that GPU."""
    _apply(
        env,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "owner-gpu", "namespace": "team"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": keys.DRA_CLASS_GPU}}]}},
        },
    )
    pod = pod_manifest("owner", namespace="team", labels={keys.LABEL_LENDABLE: "true"})
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "owner-gpu"}]
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    _apply(env, pod)
    env.cluster.wait_pod_phase("owner", ["Running"], namespace="team", timeout_s=90)
    return _visible(env, "team", "owner")


def _visible(env: DraAgentEnv, ns: str, pod: str, container: str | None = None) -> str:
    argv = ["exec", "-n", ns, pod, *(["-c", container] if container else []), "--", "sh", "-c"]
    return env.cluster.kubectl(*argv, "echo $FAKE_VISIBLE_DEVICES").stdout.strip()


def _spot_pod(name: str) -> dict[str, Any]:
    pod = pod_manifest(name, namespace="spot", resources={keys.RESOURCE_SPOT_GPU: "1"})
    pod["spec"]["priorityClassName"] = "gpushare-spot"
    return pod


def test_an_idle_owner_lends_its_gpu_and_gets_it_back(env: DraAgentEnv) -> None:
    gpu = _owner(env)
    assert gpu in env.node.gpu_ids
    others = {g: 50.0 for g in env.node.gpu_ids if g != gpu}
    # Busy or unknown: nobody may borrow; the spot device is closed.
    assert env.spot_taints(gpu) == [OWNER_ACTIVE]
    env.write_metrics({**others, gpu: 0.0})
    wait(lambda: env.spot_taints(gpu) == [], f"{gpu}'s spot device open", 60)
    _apply(env, _spot_pod("job"))
    env.cluster.wait_pod_phase("job", ["Running"], namespace="spot", timeout_s=90)
    # The borrower runs on the owner's GPU, with the vendor's own edits for it.
    assert _visible(env, "spot", "job") == gpu
    assert f"/dev/{gpu}" in env.cluster.kubectl("exec", "-n", "spot", "job", "--", "ls", f"/dev/{gpu}").stdout
    job_uid = env.cluster.pod("job", "spot")["metadata"]["uid"]

    # The owner returns: its pod uses its GPU.
    returned = time.monotonic()
    env.write_metrics({**others, gpu: 60.0}, {gpu: ("team/owner",)})
    wait(lambda: (p := env.cluster.pod("job", "spot")) is None or p["metadata"]["uid"] != job_uid, "borrower gone", 60)
    gone_s = time.monotonic() - returned
    # Closed again, and once the borrower's claim is unprepared no eviction taint is left.
    wait(lambda: env.spot_taints(gpu) == [OWNER_ACTIVE], f"{gpu}'s spot device closed, nothing to evict", 60)
    owner = env.cluster.pod("owner", "team")
    assert owner is not None and owner["status"]["phase"] == "Running"
    assert owner["status"]["containerStatuses"][0]["restartCount"] == 0
    events = env.cluster.kubectl("get", "events", "-n", "spot", "-o", "json").stdout
    assert any(e["reason"] == "OwnerBack" for e in json.loads(events)["items"])
    print(f"owner return -> borrower pod gone: {gone_s * 1000:.0f} ms")

    # While the owner is busy a new borrower waits, unscheduled.
    _apply(env, _spot_pod("job2"))
    time.sleep(4)
    job2 = env.cluster.pod("job2", "spot")
    assert job2 is not None and job2["status"]["phase"] == "Pending"
    # Idle again: lent again.
    env.write_metrics({**others, gpu: 0.0})
    env.cluster.wait_pod_phase("job2", ["Running"], namespace="spot", timeout_s=90)
    env.cluster.kubectl("delete", "pod", "-n", "spot", "job2", "--wait=true")


def test_docker_in_docker_gets_the_claims_devices(env: DraAgentEnv) -> None:
    pod = pod_manifest(
        "dind",
        namespace="team",
        each={"gpu": {"gpushare/share-gpu-2": "1"}, "docker": {}},
        annotations={f"{keys.POD_ANNOTATION_DEVICES_FROM_PREFIX}docker": "gpu"},
    )
    _apply(env, pod)
    env.cluster.wait_pod_phase("dind", ["Running"], namespace="team", timeout_s=120)
    gpu = _visible(env, "team", "dind", "gpu")
    assert gpu in env.node.gpu_ids
    assert _visible(env, "team", "dind", "docker") == gpu
    docker_env = env.cluster.kubectl("exec", "-n", "team", "dind", "-c", "docker", "--", "env").stdout
    assert "GPUSHARE_GPU_MILLI=500" in docker_env
    devs = env.cluster.kubectl("exec", "-n", "team", "dind", "-c", "docker", "--", "ls", "/dev").stdout.split()
    assert gpu in devs and not ({*env.node.gpu_ids} - {gpu}) & set(devs)
    env.cluster.kubectl("delete", "pod", "-n", "team", "dind", "--wait=true")


def _claim(name: str, tolerations: list[dict[str, Any]]) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": "spot-gpu.gpushare.k8s.io", "tolerations": tolerations}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "spot"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }


@pytest.mark.parametrize(
    "toleration",
    [
        {"key": keys.TAINT_OWNER_ACTIVE, "operator": "Exists", "effect": "NoSchedule"},
        {"key": keys.TAINT_RECLAIMED, "operator": "Exists"},
        {"operator": "Exists"},
    ],
)
def test_no_claim_may_tolerate_gpushares_taints(env: DraAgentEnv, toleration: dict[str, Any]) -> None:
    res = env.cluster.kubectl(
        "create", "--dry-run=server", "-f", "-", input=json.dumps(_claim("t", [toleration])), check=False
    )
    assert res.returncode != 0 and "may not tolerate a gpushare.k8s.io/ taint" in res.stderr, res.stderr
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "t", "namespace": "spot"},
        "spec": {"spec": _claim("t", [toleration])["spec"]},
    }
    res = env.cluster.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(template), check=False)
    assert res.returncode != 0 and "may not tolerate" in res.stderr, res.stderr
    other = _claim("ok", [{"key": "example.com/other", "operator": "Exists"}])
    env.cluster.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(other))


def _agent_kubeconfig(env: DraAgentEnv, tmp: Path) -> Path:
    """The token kubelet mounted into the agent's pod, as the agent itself sends it."""
    assert isinstance(env.agent, AgentPod)
    (pod,) = [
        p
        for p in json.loads(
            env.cluster.kubectl("get", "pods", "-n", "gpushare-system", "-l", env.agent.selector, "-o", "json").stdout
        )["items"]
        if not p["metadata"].get("deletionTimestamp")
    ]
    volumes = env.cluster.kubelet_root / "pods" / pod["metadata"]["uid"] / "volumes" / "kubernetes.io~projected"
    (token_file,) = volumes.glob("kube-api-access-*/token")
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "c",
                "cluster": {
                    "server": env.cluster.server,
                    "certificate-authority": str(env.cluster.layout.pki / "ca.crt"),
                },
            }
        ],
        "users": [{"name": "agent", "user": {"token": token_file.read_text().strip()}}],
        "contexts": [{"name": "agent", "context": {"cluster": "c", "user": "agent"}}],
        "current-context": "agent",
    }
    path = tmp / "agent.kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    return path


def _slice(node: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"generateName": "forged-"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 99, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-9", "attributes": {"kind": {"string": "whole"}}}],
        },
    }


@pytest.mark.skipif(agent_mode() == "process", reason="the agent's own pod-bound token exists only in pod mode")
def test_only_a_nodes_agent_writes_its_nodes_slices(env: DraAgentEnv, tmp_path: Path) -> None:
    kubectl = [str(env.cluster.binaries.kubectl)]

    def create(kubeconfig: Path, obj: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*kubectl, f"--kubeconfig={kubeconfig}", "create", "--dry-run=server", "-f", "-"],
            input=json.dumps(obj),
            capture_output=True,
            text=True,
            check=False,
        )

    # An administrator (or any tenant granted it by mistake) may not publish the driver's devices.
    res = create(env.cluster.kubeconfig, _slice(env.cluster.node_name))
    assert res.returncode != 0 and "only the gpushare agent publishes ResourceSlices" in res.stderr, res.stderr
    agent = _agent_kubeconfig(env, tmp_path)
    res = create(agent, _slice("another-node"))
    assert res.returncode != 0 and "writes only the ResourceSlices of its own node" in res.stderr, res.stderr
    res = create(agent, _slice(env.cluster.node_name))
    assert res.returncode == 0, res.stderr
