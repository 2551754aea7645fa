"""The harness's install of gpushare, offline: the chart values it passes give the agent the same
config a host-process agent gets, and the two things it reads back from the cluster (container
log files, a pod watch) are read right. The install itself runs in the e2e and spot tiers."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml

from gpushare.config import load_config
from localcluster.agent import AgentSettings, config_doc
from localcluster.cluster import Cluster
from localcluster.containerd_config import ContainerdInstall
from localcluster.layout import Binaries
from tests.harness.worlds.agent_pod import _exit_code, agent_values, cri_log_text
from tests.unit.test_manifests_rendered import CHART, _helm, _one


def _cluster(root: Path) -> Cluster:
    fake = root / "bin"
    binaries = Binaries(*(fake / n for n in ("apiserver", "cm", "scheduler", "kubelet", "kubectl", "etcd")))
    return Cluster(root, binaries, ContainerdInstall("2.x", fake))


def test_chart_values_give_the_pod_the_host_process_config(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path / "gs-k")
    side = tmp_path / "side"
    settings = AgentSettings(
        idle_s=3.0,
        config={"metrics": {"source": str(side / "m" / "dcgm.prom"), "processLevel": True}, "idleWindow": "2.0s"},
        args=("--period", "1", "--no-lease"),
    )
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(agent_values(cluster, side, 4242, settings)))
    proc = subprocess.run(
        [str(_helm()), "template", "gpushare", str(CHART), "-n", "gpushare-system", "--values", str(values)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    from_chart = load_config(text=_one(docs, "ConfigMap")["data"]["config.yaml"])
    as_process = load_config(text=yaml.safe_dump({"nodeName": "", **config_doc(cluster, side, 4242, settings)}))
    assert from_chart == as_process
    agent = _one(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    assert agent["command"][-4:] == ["--no-kmod", "--period", "1", "--no-lease"]
    env = {e["name"]: e.get("value") for e in agent["env"]}
    assert env["KUBERNETES_SERVICE_HOST"] == "127.0.0.1"
    assert env["KUBERNETES_SERVICE_PORT"] == str(cluster.ports.apiserver)


def test_cri_log_lines_become_the_programs_output() -> None:
    raw = (
        "2026-01-01T00:00:00.1Z stderr F first line\n"
        "2026-01-01T00:00:00.2Z stdout P half \n"
        "2026-01-01T00:00:00.3Z stdout F and the rest\n"
        "2026-01-01T00:00:00.4Z stdout F \n"
    )
    assert cri_log_text(raw) == "first line\nhalf and the rest\n\n"


def test_exit_code_is_the_last_one_a_pod_watch_reported() -> None:
    def event(kind: str, state: dict[str, object]) -> str:
        status = {"containerStatuses": [{"name": "agent", "state": state}, {"name": "x", "state": {}}]}
        return json.dumps({"type": kind, "object": {"status": status}}, indent=2)

    stream = "\n".join(
        [
            event("ADDED", {"running": {}}),
            event("MODIFIED", {"terminated": {"exitCode": 0}}),
            event("DELETED", {"terminated": {"exitCode": 0}}),
        ]
    )
    assert _exit_code(stream, "agent") == 0
    assert _exit_code(event("ADDED", {"running": {}}), "agent") is None
    assert _exit_code(stream + '\n{"type": "MODIF', "agent") == 0  # a watch cut off mid-object
