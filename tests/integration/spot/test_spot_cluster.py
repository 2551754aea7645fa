"""Spot on the one-node cluster: lend an idle owner's GPU, take it back on the owner's return.

The owner's "return" uses the utilization path (no gpukmod on this host): the test rewrites the
fake dcgm file so the owner's pod shows up using its GPU. Tests run in order and share the agent.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from gpushare import keys
from podcgroups.cgroups import CgroupIndex
from tests.harness.worlds.spot import GPUS, IDLE_WINDOW_S, SpotEnv, owner_gpu, owner_manifest, spot_manifest

SPOT = keys.RESOURCE_SPOT_GPU


def pod(env: SpotEnv, name: str, ns: str) -> dict[str, Any] | None:
    return env.cluster.pod(name, ns)


def container_pids(container_id: str) -> list[int]:
    cg = CgroupIndex().locate([container_id]).get(container_id)
    return cg.pids() if cg else []


def cid_of(p: dict[str, Any]) -> str:
    status = p["status"]["containerStatuses"][0]
    return str(status["containerID"]).split("://", 1)[1]


def lend(env: SpotEnv, name: str = "owner") -> str:
    """Owner running and idle for the window -> spot-gpu allocatable 1; returns the owner's GPU.

    Every other GPU reads busy, so an owner left over from an earlier test cannot be lent too and
    take the spot pod meant for this one.
    """
    if pod(env, name, "team") is None:
        env.apply(owner_manifest(name))
    env.cluster.wait_pod_phase(name, ["Running"], namespace="team", timeout_s=60)
    gpu = owner_gpu(env, name)
    env.write_metrics(others_busy(gpu))

    def only_this_gpu_lendable() -> bool:
        # "stolen" too: an earlier test may have left its borrower running on this owner's GPU.
        lendable = {g["real_id"] for g in env.agent.status()["spot"] if g["state"] in ("away", "stolen")}
        return lendable == {gpu}

    # The node's allocatable may still count an earlier owner's GPU; the agent's own view is the truth.
    env.wait(f"only {gpu} lendable", only_this_gpu_lendable, 30)
    env.wait("spot-gpu allocatable 1", lambda: env.allocatable(SPOT) == "1", 30)
    return gpu


def others_busy(gpu: str, utilization_pct: float = 0.0) -> dict[str, float]:
    return {g: 50.0 for g in GPUS} | {gpu: utilization_pct}


def test_idle_owner_lends_and_spot_pod_sees_the_owners_device(spot_env: SpotEnv) -> None:
    env = spot_env
    env.apply(owner_manifest())
    env.cluster.wait_pod_phase("owner", ["Running"], namespace="team", timeout_s=60)
    gpu = owner_gpu(env)
    env.write_metrics({g: 0.0 for g in GPUS})  # metrics were unknown until now: never idle
    started = time.monotonic()
    assert env.allocatable(SPOT) == "0"
    env.wait("spot-gpu allocatable 1", lambda: env.allocatable(SPOT) == "1", 30)
    assert time.monotonic() - started >= IDLE_WINDOW_S * 0.9  # not before the idle window
    env.apply(spot_manifest("job"))
    job = env.cluster.wait_pod_phase("job", ["Running"], namespace="spot", timeout_s=60)
    env.wait("the job's tree started", lambda: len(container_pids(cid_of(job))) >= 4, 20)
    devs = env.cluster.kubectl("exec", "-n", "spot", "job", "--", "cat", "/tmp/devs").stdout.split()
    assert gpu in devs, f"the spot container sees {devs}, not the owner's {gpu}"
    status = env.agent.status()
    lent = [g for g in status["spot"] if g["state"] == "stolen"]
    assert [g["real_id"] for g in lent] == [gpu] and lent[0]["borrowers"] == ["spot/job"]
    assert status["spot_runtime"]["mode"] == "utilization alone (gpukmod not loaded)"


def test_owner_returns_borrower_killed_and_deleted_with_reason(spot_env: SpotEnv) -> None:
    env = spot_env
    gpu = lend(env)
    if pod(env, "job", "spot") is None:
        env.apply(spot_manifest("job"))
    job = env.cluster.wait_pod_phase("job", ["Running"], namespace="spot", timeout_s=60)
    pids = container_pids(cid_of(job))
    assert len(pids) >= 4
    owner_before = pod(env, "owner", "team")
    assert owner_before is not None
    # The owner returns: its own pod uses its GPU (utilization path).
    returned = time.monotonic()
    env.write_metrics({g: 0.0 for g in GPUS} | {gpu: 60.0}, {gpu: ("team/owner",)})
    env.wait("every borrower process dead", lambda: not any(Path(f"/proc/{p}").exists() for p in pids), 10)
    dead_s = time.monotonic() - returned
    env.wait("spot pod deleted", lambda: pod(env, "job", "spot") is None, 30)
    env.wait("spot-gpu allocatable 0", lambda: env.allocatable(SPOT) == "0", 30)
    reasons = [e["reason"] for e in env.events("job", "spot")]
    assert "OwnerBack" in reasons, reasons
    owner_after = pod(env, "owner", "team")
    assert owner_after is not None and owner_after["metadata"]["uid"] == owner_before["metadata"]["uid"]
    assert owner_after["status"]["phase"] == "Running"
    assert owner_after["status"]["containerStatuses"][0]["restartCount"] == 0
    assert cid_of(owner_after) == cid_of(owner_before)
    status = env.agent.status()
    assert status["spot_runtime"]["kills"] == {"OwnerBack": 1}
    assert any(e["reason"] == "OwnerBack" and e["pod"] == "spot/job" for e in status["evictions"])
    _, body = env.agent.get("/metrics")
    text = body.decode()
    assert 'gpushare_evictions_total{reason="OwnerBack"} 1' in text
    assert "gpushare_spot_return_seconds_count 1" in text
    # Printed for the report: from the file rewrite (scrape every 200 ms included) to dead.
    last = status["spot_runtime"]["last_return"]
    print(f"owner return -> borrower dead: {dead_s * 1000:.0f} ms from the file rewrite; agent: {last}")


def test_second_spot_pod_not_admitted_while_owner_busy(spot_env: SpotEnv) -> None:
    env = spot_env
    gpu = owner_gpu(env)
    env.write_metrics({g: 0.0 for g in GPUS} | {gpu: 60.0}, {gpu: ("team/owner",)})
    env.wait("spot-gpu allocatable 0", lambda: env.allocatable(SPOT) == "0", 30)
    env.apply(spot_manifest("job2"))
    time.sleep(IDLE_WINDOW_S * 2)  # longer than a window: busy never lends
    p = pod(env, "job2", "spot")
    assert p is not None and p["status"]["phase"] == "Pending", p and p["status"]
    assert env.allocatable(SPOT) == "0"
    env.cluster.kubectl("delete", "pod", "-n", "spot", "job2", "--wait=true", "--timeout=30s")


def test_gpushare_status_says_why(spot_env: SpotEnv) -> None:
    env = spot_env
    text = env.status_text()
    assert "SPOT  (returns seen by: utilization alone (gpukmod not loaded))" in text, text
    assert "OwnerBack" in text, text


def test_agent_restart_while_lent_keeps_lending_without_false_eviction(spot_env: SpotEnv) -> None:
    env = spot_env
    # A fresh owner: the NRI plugin forgets an owner whose borrower was removed (bug reported to
    # the NRI part; test_next_borrower_after_an_eviction_gets_the_device below).
    env.cluster.kubectl("delete", "pod", "-n", "team", "owner", "--wait=true", "--timeout=30s")
    lend(env, "owner2")
    env.apply(spot_manifest("job3"))
    job = env.cluster.wait_pod_phase("job3", ["Running"], namespace="spot", timeout_s=60)
    pids = container_pids(cid_of(job))
    mark = env.agent.mark()
    env.agent.kill9()
    env.agent.start()
    env.agent.wait_healthy()
    # Several windows and many passes after the restart: still lent, nobody evicted.
    time.sleep(IDLE_WINDOW_S * 3)
    after = pod(env, "job3", "spot")
    assert after is not None and after["metadata"]["uid"] == job["metadata"]["uid"]
    assert after["status"]["phase"] == "Running" and after["metadata"].get("deletionTimestamp") is None
    assert all(Path(f"/proc/{p}").exists() for p in pids)
    log_after = env.agent.log_text()[mark:]
    assert "decision=evict" not in log_after and "decision=kill" not in log_after, log_after[-3000:]
    env.wait("spot-gpu allocatable 1 again", lambda: env.allocatable(SPOT) == "1", 30)
    lent = [g for g in env.agent.status()["spot"] if g["state"] == "stolen"]
    assert [g["borrowers"] for g in lent] == [["spot/job3"]]
    env.cluster.kubectl("delete", "pod", "-n", "spot", "job3", "--wait=true", "--timeout=30s")


def test_next_borrower_after_an_eviction_gets_the_device(spot_env: SpotEnv) -> None:
    env = spot_env
    gpu = lend(env, "owner3")
    env.apply(spot_manifest("job4"))
    env.cluster.wait_pod_phase("job4", ["Running"], namespace="spot", timeout_s=60)
    env.write_metrics(others_busy(gpu, 60.0), {gpu: ("team/owner3",)})
    env.wait("job4 deleted", lambda: pod(env, "job4", "spot") is None, 30)
    lend(env, "owner3")
    env.apply(spot_manifest("job5"))
    try:
        env.cluster.wait_pod_phase("job5", ["Running"], namespace="spot", timeout_s=30)
    finally:
        env.cluster.kubectl("delete", "pod", "-n", "spot", "job5", "--wait=false", check=False)
