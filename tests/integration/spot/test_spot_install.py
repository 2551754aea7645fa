"""The spot agent as the chart installs it by default, kmod init container included.

This machine's kernel cannot have gpukmod (no headers, not even /lib/modules): the init
container runs `gpushare kmod install --best-effort`, says why in one line and exits 0, the agent
starts anyway, and spot sees owners return by utilization alone, which `gpushare status` says.
"""

from __future__ import annotations

import pytest

from localcluster.helm import pods
from tests.harness.worlds.agent_pod import NAMESPACE, SELECTOR, AgentPod
from tests.harness.worlds.spot import SpotEnv


def test_kmod_init_container_says_why_in_one_line_and_the_agent_lends_by_utilization(spot_env: SpotEnv) -> None:
    agent = spot_env.agent
    if not isinstance(agent, AgentPod):
        pytest.skip("the agent runs as a host process (GPUSHARE_AGENT_MODE=process): no init container")
    (pod,) = pods(spot_env.cluster, NAMESPACE, SELECTOR)
    (init,) = pod["status"]["initContainerStatuses"]
    assert init["name"] == "kmod" and init["state"]["terminated"]["exitCode"] == 0, init
    name = pod["metadata"]["name"]
    lines = spot_env.cluster.kubectl("logs", "-n", NAMESPACE, name, "-c", "kmod").stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpukmod not installed: "), lines
    assert "spot sees owners return by utilization alone" in lines[0], lines
    assert agent.status()["spot_runtime"]["mode"] == "utilization alone (gpukmod not loaded)"
    assert "SPOT  (returns seen by: utilization alone (gpukmod not loaded))" in spot_env.status_text()
