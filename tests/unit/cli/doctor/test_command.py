"""`gpushare doctor` wiring: where the spot setting comes from, the exit status, text and JSON output."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from cli.doctor import command as cmd
from cli.doctor.diagnosis import AgentFact, CgroupFact, ExporterFact, NodeFacts, SocketFact
from cli.main import app
from gpumetrics.discovery import GPU_OPERATOR_SOURCE
from gpumetrics.fake_exporter import FakeGpu, render_dcgm, write_dcgm
from gpushare.config import Config, MetricsConfig, SpotConfig
from tests.unit.cli.doctor.test_diagnosis import healthy, with_
from tests.unit.gpumetrics.test_discovery import NODE, exporter_pod
from tests.unit.gpumetrics.test_scrape_pods import Page


@pytest.fixture
def facts(monkeypatch: pytest.MonkeyPatch) -> list[NodeFacts]:
    """What the probes will report (the test sets it); every call of gather is recorded."""
    box = [healthy()]
    seen: list[tuple[bool | None, str | None]] = []

    def gather(cfg: Config, spot: bool | None, kubeconfig: str | None) -> tuple[NodeFacts, str]:
        seen.append((spot, kubeconfig))
        f = box[0] if spot is None else with_(box[0], spot=spot)
        return f, "flag" if spot is not None else "the running agent"

    monkeypatch.setattr(cmd, "gather", gather)
    return box


def run(*args: str) -> Any:
    return CliRunner().invoke(app, ["doctor", *args])


def test_a_healthy_node_exits_0(facts: list[NodeFacts]) -> None:
    result = run()
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0] == "gpushare doctor: node ?, spot on (the running agent)"
    assert "0 failed, 0 warnings: every feature that is on can be served" in result.output


def test_a_fault_exits_1_and_names_it_with_its_fix(facts: list[NodeFacts]) -> None:
    facts[0] = with_(facts[0], kubelet__pod_resources=SocketFact("/x.sock", "missing"))
    result = run()
    assert result.exit_code == 1
    line = next(x for x in result.output.splitlines() if "pod-resources" in x)
    assert line.split()[0] == "FAIL" and "PodResources socket /x.sock does not exist" in line
    assert "fix: set kubelet.podResourcesSocket" in result.output
    assert "1 failed, 0 warnings: this node cannot serve every feature that is on" in result.output


def test_no_spot_turns_a_spot_failure_into_a_warning(facts: list[NodeFacts]) -> None:
    facts[0] = with_(facts[0], exporter__error="refused", exporter__devices=None)
    assert run().exit_code == 1
    result = run("--no-spot")
    assert result.exit_code == 0, result.output
    assert "spot off (flag)" in result.output and "1 warning: " in result.output


def test_json_output(facts: list[NodeFacts]) -> None:
    facts[0] = with_(facts[0], kmod__loaded=None, exporter__process_level=True)
    result = run("-o", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["ok"] is True and doc["spot"] is True
    kmod = next(c for c in doc["checks"] if c["name"] == "kmod")
    assert kmod["status"] == "warn" and "can be built" in kmod["summary"] and kmod["hint"]


def test_bad_output_and_bad_config(facts: list[NodeFacts], tmp_path: Path) -> None:
    assert run("-o", "yaml").exit_code == 2
    bad = tmp_path / "c.yaml"
    bad.write_text("version: v1\nkubelet: {podResourceSocket: /x}\n")
    result = run("--config", str(bad))
    assert result.exit_code == 2 and "did you mean kubelet.podResourcesSocket" in result.output


def _stub_probes(monkeypatch: pytest.MonkeyPatch, agent: AgentFact) -> None:
    base = healthy()
    monkeypatch.setattr(cmd, "probe_agent", lambda listen: agent)
    monkeypatch.setattr(cmd, "probe_kubelet", lambda dp, pr: base.kubelet)
    monkeypatch.setattr(cmd, "probe_containerd", lambda sock: base.containerd)
    monkeypatch.setattr(cmd, "probe_nri", lambda sock: base.nri)
    monkeypatch.setattr(cmd, "probe_spot_cgroups", lambda cfg: base.cgroup)
    monkeypatch.setattr(cmd, "probe_kmod", lambda: base.kmod)
    monkeypatch.setattr(cmd, "probe_exporter", lambda *_a: base.exporter)


@pytest.mark.parametrize(
    ("flag", "agent", "spot", "source"),
    [
        (None, AgentFact("l", 200, spot=False), False, "the running agent"),
        (None, AgentFact("l", 200, spot=True), True, "the running agent"),
        (None, AgentFact("l", error="refused"), True, "default: the agent's own default"),
        (False, AgentFact("l", 200, spot=True), False, "flag"),
    ],
)
def test_gather_takes_spot_from_the_flag_then_the_agent(
    monkeypatch: pytest.MonkeyPatch, flag: bool | None, agent: AgentFact, spot: bool, source: str
) -> None:
    _stub_probes(monkeypatch, agent)
    facts, where = cmd.gather(Config(), flag, None)
    assert (facts.spot, where) == (spot, source)
    assert facts.kubelet.api_allocatable is None and facts.kubelet.api_error == "no kubeconfig and not in a pod"


def test_probe_exporter_reads_a_file_source(tmp_path: Path) -> None:
    page = tmp_path / "dcgm.prom"
    write_dcgm(page, [FakeGpu("fakegpu0", 10.0, ()), FakeGpu("fakegpu1", 0.0, ())])
    fact = cmd.probe_exporter(MetricsConfig(source=str(page), vendor="nvidia", process_level=True))
    assert fact == ExporterFact(str(page), True, 2, "nvidia")
    missing = cmd.probe_exporter(MetricsConfig(source=str(tmp_path / "none.prom")))
    assert missing.devices is None and missing.error and "none.prom" in missing.error
    assert cmd.probe_exporter(MetricsConfig()) == ExporterFact("", False)


def test_probe_spot_cgroups_says_why_spot_finds_no_pods(tmp_path: Path) -> None:
    fact = cmd.probe_spot_cgroups(Config(spot=SpotConfig(cgroup_root=str(tmp_path))))
    assert isinstance(fact, CgroupFact) and fact.spot_blocked and fact.spot_layout is None


def test_probe_exporter_finds_a_pod_source_through_the_api_as_the_agent_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    page = Page(render_dcgm([FakeGpu("fakegpu0", 10.0, ())]))
    listed: list[list[dict[str, object]]] = [[]]

    class Client:
        def __enter__(self) -> Client:
            return self

        def __exit__(self, *exc: object) -> None: ...

    monkeypatch.setattr(cmd.KubeClient, "from_kubeconfig", classmethod(lambda cls, *_a, **_kw: Client()))
    monkeypatch.setattr(cmd, "ExporterPods", lambda _client: lambda _spec, _node: listed[0])
    try:
        source = GPU_OPERATOR_SOURCE.replace("port=metrics", f"port={page.port}")
        none = cmd.probe_exporter(MetricsConfig(source=source), NODE)
        assert none.devices is None and none.error and "gpu-operator" in none.error, none
        listed[0] = [exporter_pod(ip="127.0.0.1", ports=[{"name": "metrics", "containerPort": page.port}])]
        fact = cmd.probe_exporter(MetricsConfig(source=source, vendor="nvidia"), NODE)
        assert (fact.devices, fact.vendor, fact.error) == (1, "nvidia", None), fact
        bad = cmd.probe_exporter(MetricsConfig(source="k8s://pods/"), NODE)
        assert bad.error and "k8s://pods/" in bad.error
    finally:
        page.close()
