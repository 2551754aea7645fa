"""Spot reclaim does not depend on anything the endpoint's clients can use up (docs/security.md).

Twelve hundred slowloris clients from eight addresses off the node (tests/harness/off_node.py)
hold connections to the agent's endpoint, opened 200 a second, each sending its request a byte a
second and opening a new connection a second after the agent closes one. Meanwhile an owner returns: its borrower
must be dead within the bound of test_spot_cluster.py (10 s). kubelet's probe of /healthz, which
reaches the agent at 127.0.0.1 (the chart's probes), must keep answering within kubelet's default
probe timeout (1 s), with no liveness failure and no restart; a new client off the node must be
answered or refused within a second, not left waiting.

The agent's open-files limit is set to 1024 (soft) for the test, on the running process: what
containerd 2.x under systemd gives a container (it dropped its own LimitNOFILE for systemd's
1024:524288), while this harness's containerd passes on the limit of the shell that started it.

Last in the tier (conftest.py): it starts by removing the pods earlier modules left.
"""

from __future__ import annotations

import json
import resource
import time
from pathlib import Path
from typing import Any

import pytest

from localcluster.agent import AgentEndpoint
from tests.harness.off_node import SlowClients, get, off_node_addresses
from tests.harness.worlds.agent_pod import NAMESPACE, AgentPod
from tests.harness.worlds.spot import GPUS, SpotEnv, spot_manifest
from tests.integration.spot.test_spot_cluster import cid_of, container_pids, lend, pod

OWNER = "sat-owner"
BORROWER = "sat-job"
SOURCES = 8
PER_SOURCE = 150
FD_SOFT_LIMIT = 1024
RECLAIM_BOUND_S = 10.0
KUBELET_PROBE_TIMEOUT_S = 1.0


def _agent_pid(env: SpotEnv) -> int:
    pid = getattr(env.agent, "pid", None)
    assert isinstance(pid, int), f"the agent has no process: {pid!r}"
    return pid


def _proc_counts(pid: int) -> tuple[int, int]:
    """The agent's open file descriptors and threads."""
    fds = len(list(Path(f"/proc/{pid}/fd").iterdir()))
    status = Path(f"/proc/{pid}/status").read_text()
    threads = int(next(line.split()[1] for line in status.splitlines() if line.startswith("Threads:")))
    return fds, threads


def _liveness_failures(env: SpotEnv) -> int:
    """How many times kubelet's liveness probe of the agent failed, by its Unhealthy Events."""
    out = env.cluster.kubectl("get", "events", "-n", NAMESPACE, "--field-selector", "reason=Unhealthy", "-o", "json")
    items: list[dict[str, Any]] = json.loads(out.stdout)["items"]
    return sum(int(e.get("count") or 1) for e in items if str(e.get("message", "")).startswith("Liveness probe"))


def _agent_restarts(env: SpotEnv) -> int:
    out = env.cluster.kubectl("get", "pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/name=gpushare", "-o", "json")
    pods = json.loads(out.stdout)["items"]
    return sum(int(s.get("restartCount", 0)) for p in pods for s in p["status"].get("containerStatuses") or [])


def _probe(agent: AgentEndpoint) -> tuple[int, float]:
    """/healthz as kubelet's probe asks it: from the node, at 127.0.0.1, giving up after 1 s."""
    started = time.monotonic()
    try:
        code = agent.get("/healthz", timeout_s=KUBELET_PROBE_TIMEOUT_S)[0]
    except OSError:
        code = 0
    return code, time.monotonic() - started


@pytest.fixture
def clean(spot_env: SpotEnv) -> SpotEnv:
    for ns in ("spot", "team"):
        spot_env.cluster.kubectl("delete", "pods", "--all", "-n", ns, "--wait=true", "--timeout=60s", check=False)
    return spot_env


def test_reclaim_and_probes_hold_while_slow_clients_fill_the_endpoint(clean: SpotEnv) -> None:
    env = clean
    agent = env.agent
    assert isinstance(agent, AgentEndpoint)
    gpu = lend(env, OWNER)
    env.apply(spot_manifest(BORROWER))
    job = env.cluster.wait_pod_phase(BORROWER, ["Running"], namespace="spot", timeout_s=60)
    env.wait("the job's tree started", lambda: len(container_pids(cid_of(job))) >= 4, 20)
    pids = container_pids(cid_of(job))

    pid = _agent_pid(env)
    limit = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (FD_SOFT_LIMIT, limit[1]))
    in_pod = isinstance(agent, AgentPod)
    failures_before = _liveness_failures(env) if in_pod else 0
    restarts_before = _agent_restarts(env) if in_pod else 0
    try:
        with off_node_addresses(SOURCES + 1) as sources, SlowClients(agent.port, sources[:SOURCES], PER_SOURCE) as slow:
            env.wait("every slow client connecting", lambda: slow.stats.opened >= SOURCES * PER_SOURCE, 30)
            # Longer than the endpoint's read deadline: the first slow clients have been cut, and
            # every slot they may take is held again by the next ones.
            time.sleep(6.0)
            fds, threads = _proc_counts(pid)
            probes = [_probe(agent) for _ in range(3)]

            returned = time.monotonic()
            env.write_metrics({g: 0.0 for g in GPUS} | {gpu: 60.0}, {gpu: (f"team/{OWNER}",)})
            env.wait(
                "every borrower process dead",
                lambda: not any(Path(f"/proc/{p}").exists() for p in pids),
                RECLAIM_BOUND_S,
            )
            dead_s = time.monotonic() - returned

            probes += [_probe(agent) for _ in range(3)]
            started = time.monotonic()
            try:
                newcomer = get(agent.port, "/metrics", source=sources[SOURCES], timeout_s=5.0)[0]
            except OSError as exc:
                newcomer = -1 if "reset" in str(exc).lower() else 0
            newcomer_s = time.monotonic() - started
            fds_after, threads_after = _proc_counts(pid)
            stats = slow.stats
    finally:
        resource.prlimit(pid, resource.RLIMIT_NOFILE, limit)

    print(
        f"slow clients: {stats}; agent fds {fds}/{fds_after}, threads {threads}/{threads_after}; "
        f"borrower dead {dead_s * 1000:.0f} ms after the owner's return; probes {probes}; "
        f"a new client off the node: {newcomer} after {newcomer_s * 1000:.0f} ms"
    )
    assert stats.opened >= SOURCES * PER_SOURCE, stats
    assert all(code == 200 and took < KUBELET_PROBE_TIMEOUT_S for code, took in probes), probes
    # Refused at once (503, or a reset when the agent closes on its request) or served; never left waiting.
    assert newcomer in (200, 401, 503, -1) and newcomer_s < 1.0, (newcomer, newcomer_s)
    assert max(fds, fds_after) < FD_SOFT_LIMIT // 2 and max(threads, threads_after) < 200, (fds, threads)

    env.wait("the borrower deleted", lambda: pod(env, BORROWER, "spot") is None, 30)
    assert "OwnerBack" in [e["reason"] for e in env.events(BORROWER, "spot")]
    if in_pod:
        assert _liveness_failures(env) == failures_before
        assert _agent_restarts(env) == restarts_before
