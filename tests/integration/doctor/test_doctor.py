"""`gpushare doctor` on the real cluster: exit 0 on a healthy node (on the host and in the agent's pod),
and, for each fault, a non-zero exit with the fault named and its fix."""

from __future__ import annotations

import json

import pytest

from localcluster.agent import FAKE_RESOURCE, agent_mode
from localcluster.containerd import VERSIONS, Containerd, find_install
from localcluster.deploy import FAKE_GPUS_NAMESPACE
from tests.integration.doctor.conftest import Node

VENDOR = f"vendor {FAKE_RESOURCE}"


def test_a_healthy_node_passes(node: Node) -> None:
    verdict = node.doctor(node.env.agent.config_path)
    assert verdict.code == 0, verdict.text
    assert verdict.failed() == set()
    assert verdict.doc["spot"] is True and verdict.doc["spot_from"] == "the running agent"
    # Each answer came from the real peer, not from a default.
    assert verdict.check("nri-socket")["summary"].endswith("handshake with containerd v2.4.2"), verdict.text
    assert "containerd v2.4.2 (from NRI handshake)" in verdict.check("containerd")["summary"]
    assert verdict.check("pod-resources")["status"] == "ok"
    vendor = verdict.check(VENDOR)
    assert vendor["status"] == "ok" and vendor["summary"].startswith("2 devices (kubelet); node allocatable 2"), vendor
    assert verdict.check("exporter")["summary"].endswith("2 devices (nvidia); labels name GPU processes")
    assert verdict.check("agent")["status"] == "ok"
    # This machine's kernel cannot have gpukmod: spot runs on utilization alone, which is a warning.
    assert verdict.check("kmod")["status"] == "warn"
    returns = verdict.check("spot-returns")
    assert returns["status"] == "warn" and "the agent reports: utilization alone" in returns["summary"], returns
    assert verdict.text.splitlines()[-1].endswith(": every feature that is on can be served"), verdict.text


def test_in_the_agent_pod(node: Node) -> None:
    """The same command through `kubectl exec`, with the DaemonSet's mounts and the pod's config."""
    if agent_mode() != "pod":
        pytest.skip("the agent runs as a host process (GPUSHARE_AGENT_MODE=process): there is no agent pod")
    # The command docs/doctor.md gives the operator, with JSON output.
    res = node.cluster.kubectl(
        "-n", "gpushare-system", "exec", "ds/gpushare-agent", "-c", "agent", "--",
        "gpushare", "doctor", "--config", "/etc/gpushare/config.yaml", "-o", "json",
        check=False, timeout_s=120,
    )  # fmt: skip
    assert res.returncode == 0, f"{res.stdout}\n{res.stderr}"
    doc = json.loads(res.stdout)
    status = {c["name"]: c["status"] for c in doc["checks"]}
    assert doc["spot_from"] == "the running agent"
    for name in (
        "containerd",
        "nri-config",
        "nri-socket",
        "cgroup",
        "device-plugins",
        "pod-resources",
        VENDOR,
        "agent",
    ):
        assert status[name] == "ok", (name, doc)


@pytest.mark.parametrize("version", VERSIONS, ids=[f"containerd-{v}" for v in VERSIONS])
def test_nri_off(node: Node, version: str) -> None:
    """A real containerd whose config turns NRI off: no socket, and the config line to change is named."""
    with Containerd(find_install(version), nri=False, import_images=False) as broken:
        verdict = node.doctor(node.config(nri__socket=broken.nri_socket))
    assert verdict.code == 1
    config = verdict.check("nri-config")
    assert config["status"] == "fail", verdict.text
    assert f"NRI is disabled in {broken.config_path}" in config["summary"]
    assert "disable = false" in config["hint"]
    assert verdict.check("nri-socket")["status"] == "fail"
    # The version is read from the broken containerd's own binary (no NRI to ask).
    expected = "1.7.24" if version == "1.7.24" else "v2.4.2"
    assert expected in verdict.check("containerd")["summary"], verdict.text
    assert "FAIL  nri-config" in verdict.text and "NRI is disabled" in verdict.text


def test_nri_socket_missing(node: Node) -> None:
    missing = str(node.tmp / "nri" / "nri.sock")
    verdict = node.doctor(node.config(nri__socket=missing))
    assert verdict.code == 1
    assert verdict.failed() >= {"containerd", "nri-socket"}, verdict.text
    assert verdict.check("nri-socket")["summary"] == f"NRI socket {missing} does not exist"
    assert "no running containerd is configured with the NRI socket" in verdict.check("containerd")["summary"]
    assert str(node.cluster.nri_socket) in verdict.check("containerd")["summary"]  # the one that runs is named


def test_no_pod_resources_socket(node: Node) -> None:
    missing = str(node.tmp / "pod-resources" / "kubelet.sock")
    verdict = node.doctor(node.config(kubelet__podResourcesSocket=missing))
    assert verdict.code == 1
    check = verdict.check("pod-resources")
    assert check["status"] == "fail" and check["summary"] == f"PodResources socket {missing} does not exist"
    assert "kubelet.podResourcesSocket" in check["hint"]
    assert "FAIL  pod-resources" in verdict.text


def test_spot_off_turns_an_exporter_fault_into_a_warning(node: Node) -> None:
    config = node.config(metrics__source=str(node.tmp / "no-exporter.prom"))
    assert node.doctor(config).check("exporter")["status"] == "fail"
    verdict = node.doctor(config, "--no-spot")
    assert verdict.code == 0, verdict.text
    assert verdict.check("exporter")["status"] == "warn" and verdict.doc["spot_from"] == "flag"


def test_no_vendor_plugin(node: Node) -> None:
    """The fake vendor plugin uninstalled: its socket goes, the node cannot share; installed again after."""
    env = node.env
    env.gpus.stop()
    try:
        verdict = node.doctor(env.agent.config_path)
    finally:
        # The plugin's namespace (pod mode) must be gone, not terminating, before helm installs into it again.
        gone = lambda: node.cluster.kubectl("get", "namespace", FAKE_GPUS_NAMESPACE, check=False).returncode != 0  # noqa: E731
        env.wait(f"namespace {FAKE_GPUS_NAMESPACE} gone", gone, 120)
        env.gpus.start()
        env.wait(f"{FAKE_RESOURCE}=2 again", lambda: env.allocatable(FAKE_RESOURCE) == "2", 60)
    assert verdict.code == 1
    check = verdict.check(VENDOR)
    assert check["status"] == "fail", verdict.text
    assert "no vendor device plugin" in check["summary"] and "vendor device plugin" in check["hint"], check
    assert f"FAIL  {VENDOR}" in verdict.text
