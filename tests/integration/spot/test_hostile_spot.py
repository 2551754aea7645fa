"""Hostile tenants in the spot tier: what a lending owner or a borrower does to its own pod stays
with its own pod (docs/security.md, "Tested hostile scenarios").

- A privileged owner sees every host device; its borrower gets the lent GPU and nothing else of
  the owner's (no /dev/kmsg, no /dev/mem, no other GPU).
- A borrower that added an ephemeral container (``kubectl debug``) loses every container on
  reclaim, the ephemeral one included, and none of them runs again.

The tests run in order on the tier's one agent, after the tier's other modules (conftest.py):
the module starts by removing the pods they left, and leaves none behind.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpushare import keys
from localcluster.images import BUSYBOX_IMAGE
from tests.harness.worlds.spot import GPUS, SpotEnv, owner_manifest, spot_manifest
from tests.integration.spot.test_spot_cluster import cid_of, container_pids, lend, others_busy, pod

OWNER = "h-owner"
BORROWER = "h-job"
SPOT = keys.RESOURCE_SPOT_GPU
# What runc gives every container in /dev (and kubelet's termination log); anything else a borrower
# sees beyond its lent GPU came from somewhere.
EVERY_CONTAINER = {"core", "fd", "full", "mqueue", "null", "ptmx", "pts", "random", "shm", "stderr", "stdin"}
EVERY_CONTAINER |= {"stdout", "termination-log", "tty", "urandom", "zero", "console"}


@pytest.fixture(scope="module")
def hostile_spot(spot_env: SpotEnv) -> Iterator[SpotEnv]:
    env = spot_env
    # Last in the tier: the owners the other modules left hold both GPUs, and an owner needs one.
    for ns in ("spot", "team"):
        env.cluster.kubectl("delete", "pods", "--all", "-n", ns, "--wait=true", "--timeout=60s", check=False)
    try:
        yield env
    finally:
        for ns, name in (("spot", BORROWER), ("team", OWNER)):
            env.cluster.kubectl(
                "delete", "pod", "-n", ns, name, "--grace-period=0", "--force", "--wait=true", check=False
            )
        env.write_metrics({g: None for g in GPUS})
        env.wait("spot-gpu allocatable 0", lambda: env.allocatable(SPOT) in ("0", None), 60)


def reconciling(env: SpotEnv) -> None:
    before = env.agent.status()["passes"]
    env.wait("the agent's next pass", lambda: env.agent.status()["passes"] > before, 30)


def _devices(env: SpotEnv, ns: str, name: str, container: str | None = None) -> set[str]:
    args = ["exec", "-n", ns, name, *(["-c", container] if container else []), "--", "ls", "/dev"]
    return set(env.cluster.kubectl(*args).stdout.split())


def test_a_privileged_owners_host_devices_do_not_reach_its_borrower(hostile_spot: SpotEnv) -> None:
    env = hostile_spot
    owner = owner_manifest(OWNER)
    owner["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    env.apply(owner)
    gpu = lend(env, OWNER)
    host_only = _devices(env, "team", OWNER) - EVERY_CONTAINER - {gpu}
    assert "kmsg" in host_only, host_only  # the test means something: the owner sees the host's devices
    env.apply(spot_manifest(BORROWER))
    env.cluster.wait_pod_phase(BORROWER, ["Running"], namespace="spot", timeout_s=60)
    env.wait("the borrower wrote what it sees", lambda: _file(env, "/tmp/devs") != "", 20)
    borrowed = set(_file(env, "/tmp/devs").split())
    assert gpu in borrowed, borrowed
    assert not borrowed & host_only, borrowed & host_only
    assert borrowed - EVERY_CONTAINER == {gpu}, borrowed - EVERY_CONTAINER
    assert f"FAKE_VISIBLE_DEVICES={gpu}" in _file(env, "/tmp/env").split("\n")
    reconciling(env)


def _file(env: SpotEnv, path: str) -> str:
    return env.cluster.kubectl("exec", "-n", "spot", BORROWER, "-c", "app", "--", "cat", path, check=False).stdout


def _ephemeral_status(env: SpotEnv) -> dict[str, Any]:
    p = pod(env, BORROWER, "spot") or {}
    statuses = (p.get("status") or {}).get("ephemeralContainerStatuses") or [{}]
    return dict(statuses[0])


def test_every_container_of_a_reclaimed_borrower_dies_the_ephemeral_one_too(hostile_spot: SpotEnv) -> None:
    """The borrower adds a debug container after it was admitted; the owner comes back: every task of
    the pod dies (the kill is of the pod cgroup), and no container of it runs again before it is gone."""
    env = hostile_spot
    gpu = next(g["real_id"] for g in env.agent.status()["spot"] if g["borrowers"] == [f"spot/{BORROWER}"])
    env.cluster.kubectl(
        "debug", "-n", "spot", BORROWER, f"--image={BUSYBOX_IMAGE}", "--image-pull-policy=Never", "-c", "dbg",
        "--", "sh", "-c", "sleep 3600 & sleep 3600 & wait",
    )  # fmt: skip
    env.wait("the debug container running", lambda: "running" in (_ephemeral_status(env).get("state") or {}), 60)
    job = pod(env, BORROWER, "spot") or {}
    uid = job["metadata"]["uid"]
    dbg_id = str(_ephemeral_status(env)["containerID"]).split("://", 1)[1]
    pids = container_pids(cid_of(job)) + container_pids(dbg_id)
    assert len(container_pids(dbg_id)) >= 3, "the debug container's tree did not start"
    kills_before = env.agent.status()["spot_runtime"]["kills"].get("OwnerBack", 0)

    env.write_metrics(others_busy(gpu, 60.0), {gpu: (f"team/{OWNER}",)})  # the owner is back
    env.wait("every task of the pod dead", lambda: not any(Path(f"/proc/{p}").exists() for p in pids), 20)
    restarted: list[str] = []

    def gone_without_a_comeback() -> bool:
        p = pod(env, BORROWER, "spot")
        if p is None or p["metadata"]["uid"] != uid:
            return True
        status = p.get("status") or {}
        for st in (status.get("containerStatuses") or []) + (status.get("ephemeralContainerStatuses") or []):
            if "running" in (st.get("state") or {}) and st.get("restartCount", 0) > 0:
                restarted.append(json.dumps(st))
        return False

    env.wait("the borrower deleted", gone_without_a_comeback, 60)
    assert not restarted, restarted
    assert env.agent.status()["spot_runtime"]["kills"].get("OwnerBack", 0) > kills_before
    assert "OwnerBack" in [e["reason"] for e in env.events(BORROWER, "spot")]
    owner = pod(env, OWNER, "team")
    assert owner is not None and owner["status"]["phase"] == "Running"
    assert owner["status"]["containerStatuses"][0]["restartCount"] == 0
    reconciling(env)
