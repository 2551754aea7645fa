"""End-to-end tier: the real one-node cluster (kubelet, containerd with NRI), the fake vendor
device plugin for 2 GPUs, and ``gpushare agent`` — one of each per session, installed as an
operator does: the image `make image` builds, imported into the node's containerd, and
``helm install`` of manifests/chart, so the agent is the DaemonSet's pod; the fake plugin is a
DaemonSet too (tests/charts/fake-gpus). ``GPUSHARE_AGENT_MODE=process`` runs both as host
processes instead (development); the tests that are about the install then skip.

Skips (with the build command) when the cluster binaries or helm are not built or not root,
like the cluster tier.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpumetrics.fake_exporter import FakeGpu, render_dcgm
from localcluster.agent import FAKE_RESOURCE, GPUSHARE, AgentHandle, AgentSettings, GpuPlugin
from localcluster.cluster import Cluster
from localcluster.deploy import fake_gpus
from localcluster.errors import ClusterUnavailable
from localcluster.paths import REPO
from localcluster.prometheus import (
    AGENT_JOB,
    CHART_JOB_VALUES,
    EXPORTER_JOB,
    ExporterServer,
    PrometheusServer,
    chart_configmap_file,
)
from tests.harness.cluster_fixture import cluster  # noqa: F401
from tests.harness.worlds.agent_pod import NAMESPACE, AgentPod, node_agent

IDLE_TIMEOUT_S = 3.0
IDLE_WINDOW = "2s"  # a lendable owner's GPU idle this long is lent
FAKE_GPU_IDS = ("fakegpu0", "fakegpu1")  # what `gpushare fake-gpus` advertises for 2 GPUs


@dataclass
class Env:
    cluster: Cluster
    agent: AgentHandle
    gpus: GpuPlugin
    root: Path
    # The fake vendor exporter the agent scrapes (dcgm-exporter's text; a test sets what it serves).
    exporter: ExporterServer

    def apply(self, manifest: dict[str, Any]) -> None:
        self.cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))

    def start_pods(self, manifests: list[dict[str, Any]], timeout_s: float = 90.0) -> None:
        """Create the pods and wait until all run; a pod that fails (admission included) fails the test.

        Nothing is re-created: a shadow's slots stop being offered before the shadow goes
        (docs/scale.md, "Shadow removal order"), so no sharer is bound on capacity kubelet refuses.
        """
        for m in manifests:
            self.apply(m)
        deadline = time.monotonic() + timeout_s
        while True:
            pods = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in self.pods()}
            waiting = False
            for m in manifests:
                key = (m["metadata"]["namespace"], m["metadata"]["name"])
                status = (pods.get(key) or {}).get("status") or {}
                if status.get("phase") == "Failed":
                    raise AssertionError(f"{key[0]}/{key[1]} failed: {status.get('reason')}: {status.get('message')}")
                if status.get("phase") != "Running":
                    waiting = True
            if not waiting:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"pods not Running after {timeout_s}s; {self.diagnosis()}")
            time.sleep(0.3)

    def pods(self, namespace: str | None = None, selector: str | None = None) -> list[dict[str, Any]]:
        args = ["get", "pods", "-o", "json"]
        args += ["-n", namespace] if namespace else ["-A"]
        args += ["-l", selector] if selector else []
        items: list[dict[str, Any]] = json.loads(self.cluster.kubectl(*args).stdout)["items"]
        return items

    def shadows(self) -> list[dict[str, Any]]:
        return self.pods("gpushare-system", "gpushare.k8s.io/role=shadow")

    def wait(self, what: str, ok: Callable[[], bool], timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not ok():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout_s}s waiting for {what}; {self.diagnosis()}")
            time.sleep(0.3)

    def diagnosis(self) -> str:
        """What a failed wait shows: the agent's last pass, its log before the stack dump, then the stacks.

        The log is read before the dump: the stacks of a dozen threads would push every line of
        the agent's own out of a tail.
        """
        before = self.agent.log_text()
        self.agent.dump_stacks()
        stacks = self.agent.log_text()[len(before) :]
        try:
            doc = self.agent.status()
            brief = ("passes", "synced", "is_leader", "pod_resources_ok", "error", "demand", "problems")
            report = json.dumps({k: doc.get(k) for k in brief}, default=str)[:2000]
        except Exception as exc:  # the agent may be what is broken; the rest still helps
            report = f"(no /status: {exc})"
        tail = "\n".join(before.splitlines()[-60:])
        return f"agent's last pass: {report}\nagent log tail:\n{tail}\nthread stacks:\n{stacks[-6000:]}"

    def exec(self, pod: str, container: str, script: str, namespace: str = "default") -> str:
        return self.cluster.kubectl("exec", "-n", namespace, pod, "-c", container, "--", "sh", "-c", script).stdout

    def events(self, pod: str, namespace: str = "default") -> list[dict[str, Any]]:
        out = self.cluster.kubectl(
            "get", "events", "-n", namespace, "--field-selector", f"involvedObject.name={pod}", "-o", "json"
        ).stdout
        items: list[dict[str, Any]] = json.loads(out)["items"]
        return items

    def allocatable(self) -> dict[str, str]:
        node = self.cluster.node()
        return {k: v for k, v in node["status"]["allocatable"].items() if "/" in k}

    def chart_file(self, template: str, configmap: str, key: str) -> str:
        """A file the chart ships in a ConfigMap (the rules, the dashboard): the installed one, or
        with a host-process agent the one ``helm template`` gives for the same values."""
        if isinstance(self.agent, AgentPod):
            out = self.cluster.kubectl("get", "configmap", configmap, "-n", NAMESPACE, "-o", "json").stdout
            return str(json.loads(out)["data"][key])
        return chart_configmap_file(template, configmap, key, CHART_JOB_VALUES)

    def gpushare(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = [GPUSHARE, *args]
        env = {**os.environ, "KUBECONFIG": str(self.cluster.kubeconfig)}
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False, cwd=REPO, env=env)
        if check and res.returncode != 0:
            raise AssertionError(f"gpushare {' '.join(args)} exited {res.returncode}: {res.stderr}")
        return res


# Package scope (the folder has an __init__.py for it): the agent and its fake GPUs must be gone
# before later tiers register their own plugins on the same shared cluster.
@pytest.fixture(scope="package")
def env(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[Env]:  # noqa: F811
    root = Path(tempfile.mkdtemp(prefix="gs-e2e", dir="/tmp"))
    # Every GPU unknown (a DCGM blank) until a test says otherwise: nothing reads as idle.
    exporter = ExporterServer(render_dcgm([FakeGpu(g, None) for g in FAKE_GPU_IDS]))
    try:
        gpus = fake_gpus(cluster, root)
        agent = node_agent(cluster, root, _settings(cluster, exporter))
    except ClusterUnavailable as exc:
        exporter.close()
        pytest.skip(str(exc))
    e = Env(cluster, agent, gpus, root, exporter)
    try:
        gpus.start()
        e.wait(f"{FAKE_RESOURCE}=2 allocatable", lambda: e.allocatable().get(FAKE_RESOURCE) == "2", 30)
        agent.start()
        agent.wait_healthy()
        e.wait("share-gpu-4 registered", lambda: "gpushare/share-gpu-4" in e.allocatable(), 30)
        report_timings(request, agent)
        yield e
    finally:
        _clean(cluster)
        agent.close()
        gpus.stop()
        exporter.close()
        if not os.environ.get("GPUSHARE_KEEP_CLUSTER"):  # keep the agent's logs for a post-mortem on request
            shutil.rmtree(root, ignore_errors=True)


def _settings(c: Cluster, exporter: ExporterServer) -> AgentSettings:
    """The agent scrapes the fake exporter as it would dcgm-exporter on the node (hostNetwork: loopback is
    the node's). Its pod labels name the pods whose processes use a GPU, so spot can lend without gpukmod:
    an idle lendable owner's GPU goes to gpushare/spot-gpu after IDLE_WINDOW."""
    metrics = {"source": exporter.url, "vendor": "nvidia", "processLevel": True}
    metrics |= {"scrapeInterval": "1s", "scrapeTimeout": "900ms"}
    plugin_socket = f"{str(c.device_plugin_dir).rstrip('/')}/{FAKE_RESOURCE.replace('/', '-')}.sock"
    return AgentSettings(
        idle_s=IDLE_TIMEOUT_S,
        config={"metrics": metrics, "idleWindow": IDLE_WINDOW},
        args=("--period", "1", "--spot-from", f"{FAKE_RESOURCE}={plugin_socket}"),
        # The job a PodMonitor would give: the installed rules and dashboard must select it.
        chart=CHART_JOB_VALUES,
    )


def report_timings(request: pytest.FixtureRequest, agent: AgentHandle) -> None:
    """How long the image import and the install took, on the terminal (not captured)."""
    timings: dict[str, float] = getattr(agent, "timings", {})
    if not timings:
        return
    line = ", ".join(f"{what} {took:.1f} s" for what, took in timings.items())
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        print(f"\n{request.node.nodeid or 'e2e'}: gpushare agent as the DaemonSet's pod: {line}")


def _clean(c: Cluster) -> None:
    # Sharers first (a shadow removed under its sharers would evict them), then shadows; the agent's
    # own pod in gpushare-system stays.
    c.kubectl("delete", "pods", "-A", "-l", "gpushare-e2e=1", "--wait=true", "--timeout=60s", check=False)
    shadows = "gpushare.k8s.io/role=shadow"
    c.kubectl("delete", "pods", "-n", "gpushare-system", "-l", shadows, "--wait=true", "--timeout=60s", check=False)

    # The next test starts from a node that offers no slot: until the node's allocatable says the
    # deleted shadows' slots are gone, the scheduler may bind a new sharer on them and kubelet then
    # refuses it ("no healthy devices"), which is the node catching up, not what a test is about.
    def no_slots() -> bool:
        allocatable = (c.node().get("status") or {}).get("allocatable") or {}
        return all(
            v in ("0", 0)
            for k, v in allocatable.items()
            if k.startswith(("gpushare/share-gpu-", "gpushare/share-dev-gpu-"))
        )

    c.wait_for("no share slot left on the node after the test's shadows went", no_slots, 60)


@pytest.fixture(scope="package")
def prometheus(env: Env) -> Iterator[PrometheusServer]:
    """A real Prometheus on 127.0.0.1 with the rules the chart installed, scraping the agent (job
    AGENT_JOB, the chart's prometheus.jobLabel) and the fake exporter."""
    rules = env.root / "gpushare.rules.yaml"
    rules.write_text(env.chart_file("60-prometheus-rules.yaml", "gpushare-prometheus-rules", "gpushare.rules.yaml"))
    server = PrometheusServer(
        {AGENT_JOB: [f"127.0.0.1:{env.agent.port}"], EXPORTER_JOB: [f"127.0.0.1:{env.exporter.port}"]},
        rule_files=[rules],
    )
    try:
        server.start()
        server.wait("both targets up", lambda: set(server.targets_up().values()) == {"up"}, 60)
        yield server
    finally:
        server.close()


@pytest.fixture
def e2e(env: Env) -> Iterator[Env]:
    """The session's environment, with the agent running and no test pod left afterwards."""
    if not env.agent.alive():
        env.agent.start()
    env.agent.wait_healthy()
    yield env
    _clean(env.cluster)
