"""``gpushare agent`` as the pod of the chart's DaemonSet on a local cluster's one node, behind the
handle the tests also have for a host process (``localcluster.agent.AgentHandle``); ``node_agent``
picks one of the two.

It lives with the tests, not in localcluster/, because ``kill9`` finds the container's process
through the product's own cgroup code (``podcgroups``): the generic cluster harness stays free of
the product's internals.

- ``start``: the first time, import the image and ``helm install`` manifests/chart; later, label
  the node again (``gpushare.k8s.io/enabled=true``, the chart's node selector) so the DaemonSet
  runs its pod there.
- ``stop``: take the label away: the DaemonSet controller deletes the pod and kubelet sends the
  agent SIGTERM. The exit code is the one kubelet reports in the pod's last status, which a
  watch sees before the pod object goes.
- ``kill9``: SIGKILL to the container's first process, found on the host through its cgroup;
  kubelet restarts the container in the same pod, as after a crash.
- the log text: each agent container's log file, which kubelet has containerd write under the
  cluster's pod-logs directory, hard-linked into the side directory when first seen, so the log
  of a container kubelet has removed (a deleted pod, a rolling update) stays readable.
- ``upgrade``: ``helm upgrade`` with new settings; a changed config rolls the DaemonSet.
- ``close``: ``helm uninstall`` (no hooks), delete the namespace and wait until it is gone.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from localcluster.agent import AgentEndpoint, AgentHandle, AgentSettings, agent_mode, config_doc, process_agent
from localcluster.cluster import Cluster
from localcluster.errors import ClusterError
from localcluster.helm import RELEASE_NAMESPACE, Helm, daemonset_ready, import_image, pods, write_values
from localcluster.host import free_port, is_alive
from localcluster.layout import NODE_NAME
from localcluster.paths import REPO
from podcgroups.cgroups import CgroupIndex

CHART = REPO / "manifests" / "chart"
RELEASE = "gpushare"
NAMESPACE = "gpushare-system"
DAEMONSET = "gpushare-agent"
SELECTOR = "app.kubernetes.io/name=gpushare"
# On a DRA node the chart's other DaemonSet runs the agent (docs/dra.md).
DRA_DAEMONSET = "gpushare-agent-dra"
DRA_SELECTOR = "app.kubernetes.io/name=gpushare-dra"
DRA_NODE_LABEL = "gpushare.k8s.io/dra"
CONTAINER = "agent"
NODE_LABEL = "gpushare.k8s.io/enabled"
# Config keys the chart writes from values of their own; any other goes through config.extra.
_CHART_CONFIG_KEYS = frozenset(
    {"shareSpecs", "devShareSpecs", "realResources", "shadowImage", "warmShadows", "shadowIdleTimeout"}
    | {"idleWindow", "maxBlockMs", "stateDir", "nri", "metrics"}
)
# A container waiting for one of these reasons will not start without someone changing something.
_STUCK = frozenset(
    {"ErrImageNeverPull", "ErrImagePull", "ImagePullBackOff", "InvalidImageName"}
    | {"CreateContainerConfigError", "CreateContainerError", "RunContainerError"}
)


def agent_values(cluster: Cluster, side: Path, port: int, settings: AgentSettings) -> dict[str, Any]:
    """The chart's values for this cluster: the same config a host-process agent gets."""
    doc = config_doc(cluster, side, port, settings)
    root = str(cluster.kubelet_root)
    derived = {
        "devicePluginDir": f"{root}/device-plugins/",
        "podResourcesSocket": f"{root}/pod-resources/kubelet.sock",
        "rootDir": root,
    }
    if doc.pop("kubelet") != derived:
        raise ClusterError(f"the chart derives kubelet's paths from kubelet.rootDir ({root}); settings override them")
    doc.pop("version")
    config = {k: v for k, v in doc.items() if k in _CHART_CONFIG_KEYS}
    # The chart's default source is an exporter on the node; the harness names its own or none.
    config["metrics"] = {"source": "", "vendor": "auto", **doc["metrics"]}
    dra = doc.pop("dra", {})
    config["extra"] = {k: v for k, v in doc.items() if k not in _CHART_CONFIG_KEYS}
    return {
        # DRA mode: the chart's DRA DaemonSet on the node labelled for it, with the driver on.
        "dra": {"enabled": bool(dra.get("enabled")), **{k: v for k, v in dra.items() if k != "enabled"}},
        "logFormat": "text",  # the tests read decisions as key=value lines
        "extraArgs": list(settings.args),
        # The node has no kube-proxy: the agent dials the API server's own address.
        "apiServer": {"host": "127.0.0.1", "port": str(cluster.ports.apiserver)},
        "kubelet": {"rootDir": root},
        # Pods here have a network namespace that reaches nothing (docs/cluster.md): the hooks'
        # pods dial the API server from the node's network, as the agent does.
        "hooks": {"hostNetwork": True},
        "kmod": {"enabled": settings.kmod},
        "spot": {"enabled": settings.spot},
        "config": config,
        **settings.chart,
    }


def cri_log_text(raw: str) -> str:
    """A CRI log file (``<time> <stream> <P|F> <text>`` per line) as the text the program wrote."""
    out = []
    for line in raw.splitlines():
        parts = line.split(" ", 3)
        if len(parts) < 3:
            continue
        text = parts[3] if len(parts) == 4 else ""
        out.append(text if parts[2].split(":")[0] == "P" else text + "\n")
    return "".join(out)


class PodLogs:
    """Every log file of one container of a workload's pods, kept (hard-linked) once seen."""

    def __init__(self, pod_logs: Path, keep: Path, namespace: str, pod_prefix: str, container: str) -> None:
        self.pattern = f"{namespace}_{pod_prefix}*/{container}/*.log"
        self.pod_logs = pod_logs
        self.keep = keep
        self._seen: set[tuple[int, int]] = set()
        self._files: list[Path] = []

    def refresh(self) -> None:
        found = []
        for path in self.pod_logs.glob(self.pattern):
            with contextlib.suppress(OSError, ValueError):
                st = path.stat()
                if (st.st_dev, st.st_ino) not in self._seen:
                    found.append((path.parent.parent.stat().st_ctime, int(path.stem), path, st))
        self.keep.mkdir(parents=True, exist_ok=True)
        for _, _, path, st in sorted(found):
            kept = self.keep / f"{len(self._files):03d}-{path.parent.parent.name}-{path.name}"
            try:
                os.link(path, kept)
            except FileNotFoundError:
                continue
            except OSError:
                kept = path  # another filesystem: read it in place while it lasts
            self._seen.add((st.st_dev, st.st_ino))
            self._files.append(kept)

    def text(self) -> str:
        self.refresh()
        parts = []
        for path in self._files:
            with contextlib.suppress(OSError):
                parts.append(cri_log_text(path.read_text(errors="replace")))
        return "".join(parts)


class AgentPod(AgentEndpoint):
    """The agent as the DaemonSet's pod on the cluster's node; see the module docstring."""

    def __init__(self, cluster: Cluster, side: Path, settings: AgentSettings, port: int) -> None:
        self.cluster = cluster
        self.side = side
        self.settings = settings
        self.port = port
        self.config_path = side / "agent.yaml"  # the ConfigMap's config plus nodeName, for `gpushare status`
        self.values_path = side / "gpushare-values.yaml"
        self.helm = Helm(cluster)
        self.dra = bool(dict(settings.config.get("dra") or {}).get("enabled"))
        self.daemonset = DRA_DAEMONSET if self.dra else DAEMONSET
        self.selector = DRA_SELECTOR if self.dra else SELECTOR
        self.logs = PodLogs(cluster.layout.pod_logs, side / "agent-logs", NAMESPACE, f"{self.daemonset}-", CONTAINER)
        self.installed = False
        self.timings: dict[str, float] = {}

    # -- install, upgrade, uninstall ---------------------------------------------------------------
    def install(self, timeout_s: float = 180.0) -> None:
        """Import the image, ``helm install`` the chart, and wait until the agent answers /healthz."""
        self.timings["image import"] = import_image(self.cluster)
        if self.settings.kmod:
            self.timings["kmod image import"] = import_image(self.cluster, "kmod")
        started = time.monotonic()
        write_values(self.values_path, agent_values(self.cluster, self.side, self.port, self.settings))
        self._label(True)
        self.helm.install(RELEASE, CHART, RELEASE_NAMESPACE, self.values_path)
        self.installed = True
        self._wait_rolled_out(timeout_s)
        self.timings["helm install"] = time.monotonic() - started

    def upgrade(self, settings: AgentSettings, timeout_s: float = 180.0) -> None:
        """``helm upgrade`` with ``settings``; when that changed the pod template (a changed config
        does, through its checksum), wait until the new pod runs and answers /healthz."""
        before = self._generation()
        self.settings = settings
        write_values(self.values_path, agent_values(self.cluster, self.side, self.port, settings))
        self.helm.upgrade(RELEASE, CHART, RELEASE_NAMESPACE, self.values_path)
        if self._generation() > before:  # helm has written the DaemonSet when it returns
            self._wait_rolled_out(timeout_s)

    def close(self) -> None:
        """``helm uninstall`` without its hooks, then the namespace: the agent, its RBAC, PriorityClasses,
        shadows and Lease go, whatever a test left behind. The hooks themselves are the uninstall
        tier's subject (tests/integration/e2e/test_uninstall.py), not every teardown's."""
        if self.installed:
            self.logs.refresh()
            self.helm.uninstall(RELEASE, RELEASE_NAMESPACE, "--no-hooks")
            self.installed = False
            self.cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)

            def gone() -> bool:
                return self.cluster.kubectl("get", "namespace", NAMESPACE, check=False).returncode != 0

            # Later tiers on the same cluster may create the namespace again; a terminating one refuses.
            self.cluster.wait_for(f"namespace {NAMESPACE} gone", self._polling(gone), 120)
        self._label(False)

    # -- the AgentHandle surface ---------------------------------------------------------------------
    def start(self) -> None:
        if not self.installed:
            self.install()
        else:
            self._label(True)

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """The node loses the label: the pod is deleted, the agent gets SIGTERM. Its exit code, or None
        when it did not end within ``timeout_s`` (then the pod is removed by force)."""
        pod = self._pod()
        if pod is None:
            self._label(False)
            return None
        name = pod["metadata"]["name"]
        events = self.side / f"watch-{name}.json"
        watch = self._watch(name, events)
        try:
            self._label(False)
            deadline = time.monotonic() + timeout_s
            while self.cluster.pod(name, NAMESPACE) is not None:
                self.logs.refresh()
                if time.monotonic() > deadline:
                    self.cluster.kubectl("delete", "pod", "-n", NAMESPACE, name, "--grace-period=0", "--force")
                    return None
                time.sleep(0.1)
        finally:
            watch.terminate()
            watch.wait(5)
        self.logs.refresh()
        return _exit_code(events.read_text(errors="replace"), CONTAINER)

    def kill9(self) -> None:
        """SIGKILL the agent's process, as a crash would; kubelet restarts the container."""
        pid = self.pid
        if pid is None:
            return
        self.logs.refresh()
        os.kill(pid, signal.SIGKILL)
        self.cluster.wait_for(f"agent process {pid} gone", lambda: not is_alive(pid), 10)

    @property
    def pid(self) -> int | None:
        """The host PID of the agent container's first process, None while it does not run."""
        cid = self._container_id()
        cg = CgroupIndex().locate([cid]).get(cid) if cid else None
        return cg.first_pid() if cg else None

    def alive(self) -> bool:
        pid = self.pid
        return pid is not None and is_alive(pid)

    def log_text(self) -> str:
        return self.logs.text()

    def mark(self) -> int:
        return len(self.log_text())

    def dump_stacks(self) -> None:
        """SIGUSR1: the agent writes every thread's stack to its log (faulthandler)."""
        pid = self.pid
        if pid is not None:
            os.kill(pid, signal.SIGUSR1)
            time.sleep(0.5)

    def not_running(self) -> str:
        pod = self._pod()
        if pod is None:
            return "" if self._labelled() else f"not scheduled: node {NODE_NAME} lacks the label {NODE_LABEL}=true"
        status = pod.get("status") or {}
        for st in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
            waiting = (st.get("state") or {}).get("waiting") or {}
            last = ((st.get("lastState") or {}).get("terminated") or {}).get("exitCode")
            crashing = waiting.get("reason") == "CrashLoopBackOff" and last != 128 + signal.SIGKILL
            if waiting.get("reason") in _STUCK or crashing:
                where = f"container {st['name']} of pod {pod['metadata']['name']}"
                return f"{where}: {waiting['reason']}: {waiting.get('message', '')}"
        return ""

    # -- internals -----------------------------------------------------------------------------------
    def _pod(self) -> dict[str, Any] | None:
        """The DaemonSet's newest pod that is not being deleted."""
        live = [p for p in pods(self.cluster, NAMESPACE, self.selector) if not p["metadata"].get("deletionTimestamp")]
        return max(live, key=lambda p: p["metadata"]["creationTimestamp"]) if live else None

    def _container_id(self) -> str:
        pod = self._pod()
        for st in ((pod or {}).get("status") or {}).get("containerStatuses") or []:
            if st["name"] == CONTAINER and "running" in (st.get("state") or {}) and st.get("containerID"):
                return str(st["containerID"]).split("://", 1)[1]
        return ""

    def _generation(self) -> int:
        path = "jsonpath={.metadata.generation}"
        return int(self.cluster.kubectl("get", "daemonset", "-n", NAMESPACE, self.daemonset, "-o", path).stdout or 0)

    def _label(self, on: bool) -> None:
        labels = [NODE_LABEL, DRA_NODE_LABEL] if self.dra else [NODE_LABEL]
        args = [f"{k}=true" if on else f"{k}-" for k in labels]
        self.cluster.kubectl("label", "node", NODE_NAME, *args, "--overwrite")

    def _labelled(self) -> bool:
        labels = self.cluster.node()["metadata"].get("labels") or {}
        return labels.get(NODE_LABEL) == "true"

    def _polling(self, ok: Any) -> Any:
        """``ok`` that also keeps the logs of pods that may be going away."""

        def check() -> bool:
            self.logs.refresh()
            return bool(ok())

        return check

    def _wait_rolled_out(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s

        def ready() -> bool:
            if why := self.not_running():
                raise ClusterError(f"the agent cannot start: {why}\n{self.log_text()[-3000:]}")
            return daemonset_ready(self.cluster, NAMESPACE, self.daemonset) and self._container_id() != ""

        self.cluster.wait_for(f"DaemonSet {NAMESPACE}/{self.daemonset} rolled out", self._polling(ready), timeout_s)
        self._write_host_config()
        self.wait_healthy(max(5.0, deadline - time.monotonic()))

    def _write_host_config(self) -> None:
        """The agent's config from its ConfigMap, with this node's name: what `gpushare status` reads on the host."""
        cm = self.cluster.kubectl("get", "configmap", "-n", NAMESPACE, "gpushare-config", "-o", "json").stdout
        text = json.loads(cm)["data"]["config.yaml"]
        self.config_path.write_text(f"nodeName: {json.dumps(NODE_NAME)}\n{text}")

    def _watch(self, name: str, out: Path) -> subprocess.Popen[bytes]:
        """``kubectl get -w`` of one pod into ``out``, returned once its first event is there."""
        argv = [str(self.cluster.binaries.kubectl), f"--kubeconfig={self.cluster.kubeconfig}", "get", "pod", name]
        argv += ["-n", NAMESPACE, "--watch", "--output-watch-events", "-o", "json"]
        with open(out, "wb") as sink:
            proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        try:
            self.cluster.wait_for(f"a watch on pod {name}", lambda: out.stat().st_size > 0, 15)
        except BaseException:
            proc.kill()
            raise
        return proc


def _exit_code(stream: str, container: str) -> int | None:
    """The last exit code of ``container`` in a ``kubectl get -w -o json`` stream of one pod."""
    decoder = json.JSONDecoder()
    pos, code = 0, None
    while (start := stream.find("{", pos)) != -1:
        try:
            event, pos = decoder.raw_decode(stream, start)
        except ValueError:
            break
        statuses = ((event.get("object") or {}).get("status") or {}).get("containerStatuses") or []
        for st in statuses:
            terminated = (st.get("state") or {}).get("terminated")
            if st.get("name") == container and terminated:
                code = int(terminated["exitCode"])
    return code


def node_agent(cluster: Cluster, side: Path, settings: AgentSettings, mode: str | None = None) -> AgentHandle:
    """The (not yet started) agent of a harness cluster: the DaemonSet's pod, or a host process."""
    side.mkdir(parents=True, exist_ok=True)
    if (mode or agent_mode()) == "process":
        return process_agent(cluster, side, settings)
    return AgentPod(cluster, side, settings, free_port())
