"""Spot never pretends: an agent that finds no pod cgroups lends nothing, and says so, on a real cluster.

The agent here (the tier's way of running it, with the fake vendor plugin and the fake dcgm
file) is told ``spot.cgroupRoot: <an empty directory>``: it could not kill a borrower there, so
an idle, lendable owner must not be lent. Its own private cluster (a module fixture), since the
tier's shared agent must keep lending for the other modules. The tier's other modules are the
control: the same owner, idle for the same window, is lent there.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpushare import keys
from localcluster.agent import agent_mode
from localcluster.bringup import find_installs, running_cluster
from localcluster.deploy import fake_gpus
from localcluster.errors import ClusterUnavailable
from localcluster.helm import helm_binary
from localcluster.layout import NODE_NAME
from tests.harness.worlds.agent_pod import node_agent
from tests.harness.worlds.spot import (
    GPUS,
    IDLE_WINDOW_S,
    SpotEnv,
    owner_gpu,
    owner_manifest,
    spot_manifest,
    spot_settings,
)

SPOT = keys.RESOURCE_SPOT_GPU


@pytest.fixture(scope="module")
def blocked_env() -> Iterator[SpotEnv]:
    try:
        find_installs()
        if agent_mode() == "pod":
            helm_binary()
    except ClusterUnavailable as exc:
        pytest.skip(str(exc))
    root = Path(tempfile.mkdtemp(prefix="gs-spot-blocked", dir="/tmp"))
    empty = root / "no-cgroups"
    empty.mkdir()
    metrics = root / "metrics" / "dcgm.prom"  # in a directory of its own: a pod agent mounts it
    metrics.parent.mkdir()
    with running_cluster() as cluster:
        for ns in ("team", "spot"):
            cluster.kubectl("create", "namespace", ns, check=False)
        settings = spot_settings(cluster, metrics)
        settings = dataclasses.replace(settings, config={**settings.config, "spot": {"cgroupRoot": str(empty)}})
        gpus = fake_gpus(cluster, root)
        agent = node_agent(cluster, root, settings)
        env = SpotEnv(cluster, agent, gpus, root, metrics)
        env.write_metrics({g: None for g in GPUS})
        try:
            gpus.start()
            env.wait("example.com/gpu=2", lambda: env.allocatable("example.com/gpu") == "2", 60)
            agent.start()
            agent.wait_healthy()
            env.wait("spot-gpu registered", lambda: env.allocatable(SPOT) is not None, 30)
            yield env
        finally:
            for ns in ("spot", "team"):
                cluster.kubectl("delete", "pods", "-n", ns, "--all", "--wait=true", "--timeout=60s", check=False)
            agent.close()
            gpus.stop()
    if not os.environ.get("GPUSHARE_KEEP_CLUSTER"):
        shutil.rmtree(root, ignore_errors=True)


def test_no_pod_cgroups_no_lending_and_every_place_says_why(blocked_env: SpotEnv) -> None:
    env = blocked_env
    empty = str(env.root / "no-cgroups")
    env.apply(owner_manifest())
    env.cluster.wait_pod_phase("owner", ["Running"], namespace="team", timeout_s=60)
    gpu = owner_gpu(env)
    # The owner idle on its GPU, the other GPU busy: on a node with pod cgroups this lends within a window.
    env.write_metrics({g: 50.0 for g in GPUS} | {gpu: 0.0})
    env.apply(spot_manifest("job"))

    def owner_row() -> dict[str, object]:
        rows = [g for g in env.agent.status()["spot"] if g["real_id"] == gpu]
        return rows[0] if rows else {"state": "", "reason": ""}

    env.wait("the owner's GPU judged", lambda: "not lent:" in str(owner_row()["reason"]), 30)
    deadline = time.monotonic() + 4 * IDLE_WINDOW_S + 3.0  # many windows, many passes
    while time.monotonic() < deadline:
        assert env.allocatable(SPOT) == "0"
        assert owner_row()["state"] == "busy", owner_row()
        time.sleep(0.5)
    job = env.cluster.pod("job", "spot")
    assert job is not None and job["status"]["phase"] == "Pending", job and job["status"]

    status = env.agent.status()["spot_runtime"]
    assert empty in status["lending_blocked"], status
    assert empty in str(owner_row()["reason"])
    text = env.status_text()
    assert "LENDING BLOCKED: " in text and empty in text, text
    _, body = env.agent.get("/metrics")
    blocked = [line for line in body.decode().splitlines() if line.startswith("gpushare_spot_lending_blocked{")]
    assert len(blocked) == 1 and empty in blocked[0] and blocked[0].endswith(" 1.0"), blocked

    events = json.loads(
        env.cluster.kubectl(
            "get", "events", "-n", "default", "--field-selector", "reason=SpotLendingBlocked", "-o", "json"
        ).stdout
    )["items"]
    assert [(e["involvedObject"]["kind"], e["involvedObject"]["name"], e["type"]) for e in events] == [
        ("Node", NODE_NAME, "Warning")
    ], events
    assert empty in events[0]["message"]
    described = env.cluster.kubectl("describe", "node", NODE_NAME).stdout
    assert "SpotLendingBlocked" in described, described[-2000:]
