"""Uninstall and install as an operator runs them, with the real helm and the chart's hooks.

`helm test` runs the install check; `helm uninstall` refuses while a sharer holds a shadow's GPU
and deletes nothing; with uninstall.evictTenants it evicts the sharer first, and afterwards no
pod holds a gpushare device and no shadow, Lease or policy is left. The chart then installs into
another namespace, whose shadows the node trusts, and a sharer runs there.

Runs last in the tier (file order): it uninstalls the tier's agent and installs it again.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import yaml

from controller.core.dependents import dependents
from gpushare import keys
from localcluster.errors import ClusterError
from localcluster.helm import RELEASE_NAMESPACE, Helm
from localcluster.pods import sharer
from tests.harness.worlds.agent_pod import CHART, DAEMONSET, NAMESPACE, RELEASE, AgentPod
from tests.integration.e2e.conftest import Env
from tests.integration.e2e.test_sharing import DEV_SCRIPT

OTHER_NAMESPACE = "gpu-platform"


def _pod_agent(e: Env) -> AgentPod:
    if not isinstance(e.agent, AgentPod):
        pytest.fail("the uninstall tier needs the agent installed by helm (GPUSHARE_AGENT_MODE=pod, the default)")
    return e.agent


def _get(e: Env, *args: str) -> dict[str, Any] | None:
    res = e.cluster.kubectl("get", *args, "-o", "json", check=False)
    return json.loads(res.stdout) if res.returncode == 0 else None


def _stranded(e: Env) -> list[str]:
    """Every live pod that would hold a gpushare device, and every shadow, in any namespace."""
    pods = e.pods()
    shadows = [p for p in pods if (p["metadata"].get("labels") or {}).get(keys.LABEL_ROLE) == keys.ROLE_SHADOW]
    return [str(d) for d in dependents(pods)] + [f"shadow {p['metadata']['name']}" for p in shadows]


def test_uninstall_refuses_then_evicts_and_strands_no_sharer(e2e: Env) -> None:
    agent = _pod_agent(e2e)
    helm = Helm(e2e.cluster)

    try:
        checked = helm("test", RELEASE, "--namespace", RELEASE_NAMESPACE, "--logs", timeout_s=240)
    except ClusterError as exc:
        events = e2e.cluster.kubectl("get", "events", "-n", NAMESPACE, "-o", "wide", check=False).stdout
        raise AssertionError(f"{exc}\nevents in {NAMESPACE}:\n{events}") from exc
    assert "Phase:          Succeeded" in checked and "is serving" in checked, checked

    e2e.start_pods([sharer("held-0")])
    (shadow,) = e2e.shadows()
    before = e2e.exec("held-0", "app", DEV_SCRIPT)

    with pytest.raises(ClusterError, match="gpushare-uninstall-prepare") as refused:
        helm.uninstall(RELEASE, RELEASE_NAMESPACE)
    log = e2e.cluster.kubectl("logs", "-n", NAMESPACE, "job/gpushare-uninstall-prepare").stdout
    assert "uninstall refused: 1 pod(s)" in log and "default/held-0" in log, log
    # Helm deleted nothing: the agent, the shadow and the sharer's GPU are as they were. Helm 4 has
    # marked the release "uninstalling", which an upgrade or another uninstall goes on from.
    status = json.loads(helm("status", RELEASE, "--namespace", RELEASE_NAMESPACE, "-o", "json"))
    assert status["info"]["status"] == "uninstalling", (status["info"], refused.value)
    assert _get(e2e, "daemonset", "-n", NAMESPACE, DAEMONSET) is not None
    assert [s["metadata"]["uid"] for s in e2e.shadows()] == [shadow["metadata"]["uid"]]
    assert e2e.exec("held-0", "app", DEV_SCRIPT) == before

    # No new sharer meanwhile: the uninstall's policy refuses it (a Deployment would make one again).
    with pytest.raises(ClusterError, match="gpushare is being uninstalled"):
        e2e.apply(sharer("late-0"))
    # Helm upgrades no release whose uninstall it refused: the operator says "evict" on the namespace.
    e2e.cluster.kubectl("annotate", "namespace", NAMESPACE, f"{keys.ANNOTATION_UNINSTALL}={keys.UNINSTALL_EVICT}")
    started = time.monotonic()
    helm.uninstall(RELEASE, RELEASE_NAMESPACE, timeout_s=300)
    took = time.monotonic() - started
    agent.installed = False
    try:
        e2e.wait("the evicted sharer gone", lambda: e2e.cluster.pod("held-0") is None, 60)
        assert _stranded(e2e) == []
        assert _get(e2e, "daemonset", "-n", NAMESPACE, DAEMONSET) is None
        assert _get(e2e, "lease", "-n", NAMESPACE, keys.LEASE_NAME) is None
        assert _get(e2e, "validatingadmissionpolicy", "gpushare-uninstalling") is None
        assert _get(e2e, "namespace", NAMESPACE) is not None, "the release's namespace is the operator's, not Helm's"
        print(f"helm uninstall with eviction took {took:.1f} s")
        _install_elsewhere(e2e, helm, agent)
    finally:
        e2e.cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=true", "--timeout=120s", check=False)
        agent.install()


def _install_elsewhere(e: Env, helm: Helm, agent: AgentPod) -> None:
    """The chart in another namespace: the shadows live there, and the node trusts them there only."""
    e.cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=true", "--timeout=120s")
    helm.install(RELEASE, CHART, OTHER_NAMESPACE, agent.values_path)
    try:
        e.cluster.kubectl("rollout", "status", "-n", OTHER_NAMESPACE, f"ds/{DAEMONSET}", "--timeout=180s")
        config = _get(e, "configmap", "-n", OTHER_NAMESPACE, "gpushare-config")
        assert config is not None, f"no gpushare-config in {OTHER_NAMESPACE}"
        assert yaml.safe_load(config["data"]["config.yaml"])["namespace"] == OTHER_NAMESPACE
        e.start_pods([sharer("elsewhere-0")])
        shadows = e.pods(OTHER_NAMESPACE, f"{keys.LABEL_ROLE}={keys.ROLE_SHADOW}")
        assert len(shadows) == 1 and e.shadows() == [], (shadows, e.shadows())
        assert "fakegpu" in e.exec("elsewhere-0", "app", DEV_SCRIPT)
        e.cluster.kubectl("delete", "pod", "elsewhere-0", "--wait=true")
    finally:
        helm.uninstall(RELEASE, OTHER_NAMESPACE, timeout_s=300)
        e.cluster.kubectl("delete", "namespace", OTHER_NAMESPACE, "--wait=true", "--timeout=120s", check=False)
