"""Pods no node will run cannot push the agent past its memory limit with what they carry.

The leader caches every unscheduled pod of the cluster. Here 120 pods that nothing will ever
place (a nodeSelector no node has), each carrying 260 kB of environment (just under the admission
policy's default cap, admission.maxPodEnvBytes; with the policy off a pod may carry more, and the
count is what no cap bounds), are created on the live cluster; the agent (the DaemonSet's pod,
leader of the one-node cluster) must keep of them only what it reads. Its resident memory is read
from /proc before and after, and compared with the 31 MB the pods carry: a cache of whole pods
grows by at least that much.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from localcluster.pods import pod_manifest
from tests.integration.e2e.conftest import Env

PODS = 120
ENV_BYTES = 260_000


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def _heavy(name: str) -> dict[str, Any]:
    pod = pod_manifest(name)
    pod["spec"]["nodeSelector"] = {"gpushare-e2e/nowhere": "true"}
    pod["spec"]["containers"][0]["env"] = [{"name": "PAYLOAD", "value": "x" * ENV_BYTES}]
    return pod


def test_pending_pods_large_env_do_not_grow_the_agent(e2e: Env) -> None:
    pid = getattr(e2e.agent, "pid", None)
    assert isinstance(pid, int), "the agent's process is not known"
    passes = e2e.agent.status()["passes"]
    e2e.wait("the agent settled", lambda: e2e.agent.status()["passes"] >= passes + 3, 30)
    before = _rss(pid)
    heavy = {"apiVersion": "v1", "kind": "List", "items": [_heavy(f"heavy-{i}") for i in range(PODS)]}
    e2e.cluster.kubectl("create", "-f", "-", input=json.dumps(heavy))
    # The pending watch has delivered them all once the leader's passes move on; give it a few.
    passes = e2e.agent.status()["passes"]
    e2e.wait("five passes after the pods", lambda: e2e.agent.status()["passes"] >= passes + 5, 60)
    time.sleep(2)
    grown = _rss(pid) - before
    carried = PODS * ENV_BYTES
    print(f"\nagent RSS {before / 1e6:.1f} MB -> grew {grown / 1e6:.1f} MB for {carried / 1e6:.0f} MB the pods carry")
    assert e2e.agent.pid == pid, "the agent restarted meanwhile"
    assert grown < carried // 3, f"the agent grew by {grown / 1e6:.1f} MB for {carried / 1e6:.0f} MB the pods carry"
