"""The agent's wiring, built but not started: one registry holds the NRI latency and spot's series."""

from __future__ import annotations

from pathlib import Path

from controller.agent import Agent
from controller.spot.runtime import SpotRuntime
from gpushare.config import load_config

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "http://127.0.0.1:1"}}]
users: [{name: u, user: {}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


def test_metrics_and_status_of_an_agent_not_yet_started(tmp_path: Path) -> None:
    (tmp_path / "kubeconfig").write_text(KUBECONFIG)
    cfg = load_config(
        text=f"""version: v1
nodeName: n1
realResources: [example.com/gpu]
stateDir: {tmp_path}/state
metrics: {{listen: "127.0.0.1:0"}}
kubelet: {{devicePluginDir: {tmp_path}/dp/, podResourcesSocket: {tmp_path}/pr.sock}}
nri: {{socket: {tmp_path}/nri.sock}}
spot: {{cgroupRoot: {tmp_path}/no-cgroups}}
"""
    )
    agent = Agent(
        cfg,
        kubeconfig=str(tmp_path / "kubeconfig"),
        spot_runtime=SpotRuntime.from_config(cfg, use_kmod=False),
        use_lease=False,
    )
    try:
        # What the injector reports after a CreateContainer: (kind, pod, container, decision, took_ms).
        agent._on_nri_decision("inject", None, None, None, 0.7)
        lines = agent.metrics.render().decode().splitlines()
        assert 'gpushare_nri_handler_seconds_bucket{decision="inject",le="0.001"} 1.0' in lines
        assert "gpushare_nri_connected 0.0" in lines
        assert "gpushare_spot_kmod_available 0.0" in lines and "gpushare_spot_return_seconds_count 0.0" in lines
        status = agent.status()
        assert status["source"] == "agent" and status["passes"] == 0 and "spot_runtime" in status
        # No pod cgroups where the config points: spot says it lends nothing, and why.
        assert agent.spot_runtime is not None and agent.spot_runtime.blocked()
        why = agent.status()["spot_runtime"]["lending_blocked"]
        assert f"{tmp_path}/no-cgroups" in why
        assert any(
            line.startswith("gpushare_spot_lending_blocked{") and line.endswith("} 1.0")
            for line in agent.metrics.render().decode().splitlines()
        )
        # A kernel notice closes the owner's spot devices itself, through the plugins.
        assert agent.spot_runtime.spot_health_target == agent.plugins.set_spot_health
        # /metrics off the node needs a reviewed token by default, through a client of its own.
        assert agent.endpoint.access == "rbac" and agent.reviews is not None and agent.reviews is not agent.client
    finally:
        agent.endpoint.close()
        if agent.reviews is not None:
            agent.reviews.close()
        agent.podresources.close()
        agent.client.close()
