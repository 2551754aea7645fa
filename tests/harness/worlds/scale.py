"""A scale world: a localcluster, kwok's simulated GPU nodes, the real agent as leader, and the node side.

Used by ``bench/cluster_scale.py`` and ``tests/integration/scale``. The pieces:

- ``Kwok`` (``localcluster/kwok.py``) runs the simulated nodes, 8 fake GPUs each;
- ``gpushare agent`` runs unchanged as a host process for the real node; as the only agent it
  holds the Lease and plans shadows for the whole cluster. It talks to the API server as its
  own user (``AGENT_USER``), so the API server can count its requests (below);
- ``SimulatedNodeAgents`` (``tests/harness/worlds/sim_nodes.py``) does each simulated node's agent work;
  its one watch over every pod also feeds ``StageClock``, which notes when each pod of a phase
  reached each stage, so that timing a phase costs the API server nothing.

**Counting the agent's requests.** ``apiserver_request_total`` has no label for the client,
so it cannot tell the agent's requests from the scheduler's, kwok's or the test's. The API
server's flow control can: a FlowSchema (``FLOW_SCHEMA``) matches the agent's user only, and
``apiserver_flowcontrol_dispatched_requests_total{flow_schema=...}`` counts each request of
that user once, when it is let through (a watch counts once, when it starts).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import http.client
import json
import math
import os
import re
import ssl
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from bench.replay.outcome import recorded_shadow
from controller.core.pod_facts import PodRef
from controller.io.kube_client import KubeClient
from gpushare import keys
from gpushare.config import Config, load_config
from localcluster.agent import FAKE_RESOURCE, AgentProcess, AgentSettings, process_agent
from localcluster.cluster import Cluster
from localcluster.component_config import kubeconfig_doc
from localcluster.errors import ClusterError
from localcluster.host import run_command
from localcluster.images import PAUSE_IMAGE
from localcluster.kwok import Kwok, node_manifest, sim_node_names
from tests.harness.worlds.sim_nodes import SimulatedNodeAgents

AGENT_USER = "gpushare-scale-agent"
FLOW_SCHEMA = "gpushare-scale-agent"
NAMESPACE = "scale"
SHARE_N = 4
SHARE_RESOURCE = keys.share_resource(keys.KIND_SHARE, SHARE_N)
_IDENTITY_PATHS = (
    "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    "/apis/flowcontrol.apiserver.k8s.io/v1/flowschemas",
)
_DISPATCHED = re.compile(r"^apiserver_flowcontrol_dispatched_requests_total\{([^}]*)\} ([0-9.e+]+)$", re.M)


def agent_kubeconfig(cluster: Cluster, side: Path) -> Path:
    """A client certificate for ``AGENT_USER`` signed by the cluster's CA, and a kubeconfig naming it."""
    pki = cluster.layout.pki
    key, csr, crt, ext = (pki / f"{AGENT_USER}.{s}" for s in ("key", "csr", "crt", "ext"))
    ext.write_text("keyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run_command(["openssl", "req", "-new", *ec, "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={AGENT_USER}"])
    serial = str(int.from_bytes(os.urandom(8), "big"))
    run_command(
        [
            "openssl",
            "x509",
            "-req",
            "-in",
            str(csr),
            "-CA",
            str(pki / "ca.crt"),
            "-CAkey",
            str(pki / "ca.key"),
            "-set_serial",
            serial,
            "-days",
            "2",
            "-extfile",
            str(ext),
            "-out",
            str(crt),
        ]
    )
    path = side / "agent.kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig_doc(cluster.server, pki, AGENT_USER)))
    return path


def _apply_identity(cluster: Cluster) -> None:
    """Rights for the agent's user (cluster-admin: the chart's RBAC is tested elsewhere) and its FlowSchema."""
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": AGENT_USER},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": AGENT_USER}],
    }
    every = {"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"], "clusterScope": True, "namespaces": ["*"]}
    schema = {
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
        "kind": "FlowSchema",
        "metadata": {"name": FLOW_SCHEMA},
        "spec": {
            "matchingPrecedence": 100,
            "priorityLevelConfiguration": {"name": "global-default"},
            "distinguisherMethod": {"type": "ByUser"},
            "rules": [
                {
                    "subjects": [{"kind": "User", "user": {"name": AGENT_USER}}],
                    "resourceRules": [every],
                    "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
                }
            ],
        },
    }
    cluster.kubectl(
        "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [binding, schema]})
    )


def agent_requests(cluster: Cluster) -> int:
    """Requests the API server has let through for the agent's user since it started."""
    text = cluster.request("GET", "/metrics")
    total = 0.0
    for labels, value in _DISPATCHED.findall(text):
        if f'flow_schema="{FLOW_SCHEMA}"' in labels:
            total += float(value)
    return int(total)


@dataclass(frozen=True)
class SchedulerCounts:
    """What the scheduler's own /metrics says about its work so far (counters; subtract two reads)."""

    scheduled: float  # scheduler_schedule_attempts_total{result="scheduled"}
    unschedulable: float  # ... result="unschedulable": no node fits (a sharer before its shadow)
    errors: float  # ... result="error"
    requests: float  # rest_client_requests_total: its calls to the API server
    throttled_s: float  # rest_client_rate_limiter_duration_seconds_sum: its client's wait for its QPS

    def __sub__(self, other: SchedulerCounts) -> SchedulerCounts:
        return SchedulerCounts(
            self.scheduled - other.scheduled,
            self.unschedulable - other.unschedulable,
            self.errors - other.errors,
            self.requests - other.requests,
            self.throttled_s - other.throttled_s,
        )


def _scheduler_get(cluster: Cluster, path: str) -> str:
    """GET one of the scheduler's always-allowed paths (loopback HTTPS, a self-signed certificate)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    conn = http.client.HTTPSConnection("127.0.0.1", cluster.ports.scheduler, context=ctx, timeout=30)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        text = resp.read().decode()
        if resp.status != 200:
            raise ClusterError(f"scheduler {path} answered {resp.status}: {text[:200]}")
    finally:
        conn.close()
    return text


@dataclass(frozen=True)
class ClientLimit:
    """A client's token bucket: ``qps`` requests a second once its ``burst`` is spent."""

    qps: float
    burst: float

    def least_s(self, requests: float) -> float:
        """The fewest seconds this bucket, full at the start, lets ``requests`` requests take."""
        return max(0.0, requests - self.burst) / self.qps


def _field(obj: Any, name: str) -> Any:
    """``name`` of a /configz object, whose keys are the Go field names (no JSON tags) or camelCase."""
    if not isinstance(obj, dict):
        raise ClusterError(f"/configz: expected an object holding {name}, got {type(obj).__name__}")
    for key, value in obj.items():
        if key.lower() == name.lower():
            return value
    raise ClusterError(f"/configz has no {name} (keys: {sorted(obj)[:12]})")


def client_limit_from_configz(text: str) -> ClientLimit:
    """``clientConnection``'s QPS and burst from a component's /configz answer."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ClusterError(f"/configz is not JSON: {exc}") from None
    conn = _field(_field(doc, "componentconfig"), "clientConnection")
    qps, burst = _field(conn, "qps"), _field(conn, "burst")
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in (qps, burst)):
        raise ClusterError(f"/configz: clientConnection qps {qps!r} and burst {burst!r} must be numbers")
    limit = ClientLimit(float(qps), float(burst))
    if limit.qps <= 0:
        raise ClusterError(f"/configz: clientConnection qps {limit.qps} is not a limit")
    return limit


def scheduler_client_limit(cluster: Cluster) -> ClientLimit:
    """The scheduler's own client QPS and burst, as it runs."""
    return client_limit_from_configz(_scheduler_get(cluster, "/configz"))


def scheduler_counts(cluster: Cluster) -> SchedulerCounts:
    """Read the scheduler's /metrics (loopback HTTPS, a self-signed certificate, no credentials)."""
    text = _scheduler_get(cluster, "/metrics")
    attempts: dict[str, float] = {}
    requests = throttled = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "scheduler_schedule_attempts_total":
                result = sample.labels.get("result", "")
                attempts[result] = attempts.get(result, 0.0) + sample.value
            elif sample.name == "rest_client_requests_total":
                requests += sample.value
            elif sample.name == "rest_client_rate_limiter_duration_seconds_sum":
                throttled += sample.value
    return SchedulerCounts(
        attempts.get("scheduled", 0.0),
        attempts.get("unschedulable", 0.0),
        attempts.get("error", 0.0),
        requests,
        throttled,
    )


_WRITE_VERBS = frozenset({"POST", "PUT", "PATCH", "DELETE", "APPLY"})


def api_writes(cluster: Cluster) -> dict[str, float]:
    """Writes the API server has served so far, everyone's, by ``"<VERB> <resource>[/<subresource>]"``.

    The API server's own ``apiserver_request_total``: the work a phase asks of the control
    plane (and of etcd), whoever asked, which is what a busy control plane is short of.
    """
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(cluster.request("GET", "/metrics")):
        for sample in family.samples:
            if sample.name != "apiserver_request_total" or sample.labels.get("verb") not in _WRITE_VERBS:
                continue
            what = "/".join(filter(None, (sample.labels.get("resource"), sample.labels.get("subresource"))))
            key = f"{sample.labels['verb']} {what}"
            out[key] = out.get(key, 0.0) + sample.value
    return out


def writes_between(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """The writes of each kind between two reads of ``api_writes``; kinds with none left out."""
    return {k: d for k, v in after.items() if (d := v - before.get(k, 0.0)) > 0}


def sharer(name: str) -> dict[str, Any]:
    return _pod(name, {SHARE_RESOURCE: "1"})


def plain(name: str) -> dict[str, Any]:
    return _pod(name, {FAKE_RESOURCE: "1"})


def _pod(name: str, limits: Mapping[str, str]) -> dict[str, Any]:
    container = {"name": "main", "image": PAUSE_IMAGE, "resources": {"limits": dict(limits)}}
    spec = {"containers": [container], "terminationGracePeriodSeconds": 0}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec}


SHADOW_STAGES = ("shadows created", "shadows bound", "shadows Running")


class StageClock:
    """When each pod of a phase first reached each stage, as the node side's watch saw it.

    ``pod_seen`` and ``capacity_published`` are the node side's ``PodObserver``: called from its
    watch thread and its node passes with ``time.monotonic()`` at the moment each event was
    handled, so a stage's time is when it happened (give or take the watch's delay), however
    rarely anyone looks. A test pod (namespace ``NAMESPACE``) is bound the first time it is seen
    with ``spec.nodeName``; a shadow is created, bound and Running the first time it is seen at
    all, with ``spec.nodeName``, with ``status.phase`` Running. ``reset()`` starts a phase: what
    was seen before it (by uid) no longer counts, so a late event of the last phase's pods
    cannot pass for this one's.
    """

    def __init__(self, resource: str = SHARE_RESOURCE) -> None:
        self.resource = resource
        self._lock = threading.Lock()
        self._known: set[str] = set()  # uids seen since the last reset
        self._ignored: set[str] = set()  # uids seen before it
        self._bound: dict[str, float] = {}  # test pod name -> first seen bound
        self._shadows: dict[str, dict[str, float]] = {s: {} for s in SHADOW_STAGES}  # stage -> uid -> time
        self._published: dict[str, int] = {}  # node -> its count of ``resource``
        self._slots: list[tuple[float, int]] = []  # (time, all nodes' count) at each change since the reset

    def reset(self) -> None:
        with self._lock:
            self._ignored |= self._known
            self._known = set()
            self._bound = {}
            self._shadows = {s: {} for s in SHADOW_STAGES}
            self._slots = []

    def pod_seen(self, event: str, pod: Mapping[str, Any], at: float) -> None:
        if event == "DELETED":
            return
        meta = pod.get("metadata") or {}
        namespace, uid = meta.get("namespace"), str(meta.get("uid", ""))
        role = (meta.get("labels") or {}).get(keys.LABEL_ROLE)
        shadow = namespace == keys.DEFAULT_NAMESPACE and role == keys.ROLE_SHADOW
        if not (shadow or namespace == NAMESPACE):
            return
        node = (pod.get("spec") or {}).get("nodeName")
        with self._lock:
            if uid in self._ignored:
                return
            self._known.add(uid)
            if not shadow:
                if node:
                    self._bound.setdefault(str(meta.get("name", "")), at)
                return
            reached = (True, bool(node), (pod.get("status") or {}).get("phase") == "Running")
            for stage, now in zip(SHADOW_STAGES, reached, strict=True):
                if now:
                    self._shadows[stage].setdefault(uid, at)

    def capacity_published(self, node: str, resource: str, count: int, at: float) -> None:
        if resource != self.resource:
            return
        with self._lock:
            self._published[node] = count
            self._slots.append((at, sum(self._published.values())))

    def bound(self) -> dict[str, float]:
        """Test pod name -> when it was first seen bound, since the reset."""
        with self._lock:
            return dict(self._bound)

    def shadow_times(self) -> dict[str, list[float]]:
        """Each shadow stage's times since the reset, one per shadow that reached it, in order."""
        with self._lock:
            return {stage: sorted(times.values()) for stage, times in self._shadows.items()}

    def slots(self) -> list[tuple[float, int]]:
        """(time, all nodes' published count of ``resource``) at each change since the reset."""
        with self._lock:
            return list(self._slots)


def reached_at(times: list[float], fraction: float) -> float | None:
    """When a count fed by these (sorted) times reached ``fraction`` of its final value."""
    if not times:
        return None
    return times[max(1, math.ceil(fraction * len(times))) - 1]


def level_reached_at(series: list[tuple[float, int]], fraction: float) -> float | None:
    """When a level reported at each change first stood at ``fraction`` of its highest (above 0)."""
    if not series:
        return None
    goal = fraction * max(n for _, n in series)
    return next((at for at, n in series if n >= goal and n > 0), None)


def cpu_seconds(pid: int) -> float | None:
    """CPU seconds (user + system) of a process so far; None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


THIS_PROCESS = "this process"


def cpu_by_process(pids: Mapping[str, int]) -> dict[str, float]:
    """CPU seconds so far of each named process (those gone left out) and of this process (``THIS_PROCESS``)."""
    out = {name: cpu for name, pid in pids.items() if pid > 0 and (cpu := cpu_seconds(pid)) is not None}
    own = os.times()
    out[THIS_PROCESS] = own.user + own.system
    return out


def cpu_between(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """Each process's CPU seconds between two reads of ``cpu_by_process`` (those in both)."""
    return {name: after[name] - before[name] for name in after if name in before}


@dataclass(frozen=True)
class ProcessUsage:
    cpu_s: float
    peak_rss_mib: float


def process_usage(pid: int) -> ProcessUsage:
    """CPU seconds (user + system) and peak resident memory (VmHWM) of a live process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / ticks
    hwm = 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            hwm = int(line.split()[1]) / 1024
    return ProcessUsage(cpu, hwm)


class ScaleWorld:
    """kwok, simulated nodes, the agent and the node side over one running cluster; ``close()`` undoes all."""

    def __init__(
        self,
        cluster: Cluster,
        side: Path,
        *,
        idle_s: float = 5.0,
        node_manifest: Callable[[str], dict[str, Any]] = node_manifest,
    ) -> None:
        """``node_manifest``: each simulated node's Node object by name (8 fake GPUs by default)."""
        self.cluster = cluster
        self._node_manifest = node_manifest
        self.side = side
        side.mkdir(parents=True, exist_ok=True)
        self.kwok = Kwok(cluster, side)
        self.client = KubeClient.from_kubeconfig(str(cluster.kubeconfig))
        settings = AgentSettings(idle_s=idle_s, spot=False, args=("--period", "2"))
        self.agent: AgentProcess = process_agent(cluster, side, settings)
        self.cfg: Config = load_config(path=str(self.agent.config_path))
        self.nodes: list[str] = []
        self.node_side: SimulatedNodeAgents | None = None
        self.stages = StageClock()  # fed by every node side this world starts
        self._agent_kubeconfig = agent_kubeconfig(cluster, side)

    def start(self, nodes: int) -> None:
        _apply_identity(self.cluster)
        with contextlib.suppress(ClusterError):
            self.cluster.request("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
        self.kwok.start()
        self.grow(nodes)
        argv = self.agent.argv
        argv[argv.index("--kubeconfig") + 1] = str(self._agent_kubeconfig)
        self.agent.start()
        self.agent.wait_healthy(120)

    def grow(self, nodes: int) -> None:
        """Up to ``nodes`` simulated nodes; the node side is restarted to take the new ones in."""
        names = sim_node_names(nodes)
        self.kwok.create_nodes([self._node_manifest(n) for n in names[len(self.nodes) :]])
        self.nodes = names
        if self.node_side is not None:
            self.node_side.stop()
        self.node_side = SimulatedNodeAgents(self.cluster, self.cfg, self.nodes, observer=self.stages)
        self.node_side.start()

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far of the control plane's processes, kwok, the agent and this process."""
        pids = {**self.cluster.pids, "kwok": self.kwok.process.pid, "leader agent": self.agent.pid}
        return cpu_by_process(pids)

    def close(self) -> None:
        """Undo everything, simulated nodes last but one: nothing of this world may outlive it."""
        with contextlib.suppress(Exception):
            self.delete_all(timeout_s=120)
        self.agent.stop()
        if self.node_side is not None:
            self.node_side.stop()
        try:
            with contextlib.suppress(Exception):
                self.delete_pods(self.shadows())
            try:
                self.kwok.delete_nodes()
            finally:
                self.kwok.stop()
        finally:
            for path in _IDENTITY_PATHS:
                with contextlib.suppress(Exception):
                    self.cluster.request("DELETE", f"{path}/{AGENT_USER}")
            self.client.close()

    # -- pods ---------------------------------------------------------------------------------

    def create(self, manifests: list[dict[str, Any]], workers: int = 8) -> None:
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            for done in [pool.submit(self.client.create_pod, m) for m in manifests]:
                done.result()

    def pods(self, namespace: str = NAMESPACE, label_selector: str | None = None) -> list[dict[str, Any]]:
        return self.client.list_pods(namespace=namespace, label_selector=label_selector)[0]

    def shadows(self) -> list[dict[str, Any]]:
        return self.pods(keys.DEFAULT_NAMESPACE, f"{keys.LABEL_ROLE}={keys.ROLE_SHADOW}")

    def wait(self, what: str, ok: Callable[[], bool], timeout_s: float, poll_s: float = 1.0) -> float:
        """Poll ``ok``; the seconds it took, or ClusterError naming ``what`` and the agent's log tail."""
        t0 = time.monotonic()
        while not ok():
            if not self.agent.alive():
                raise ClusterError(f"the agent exited while waiting for {what}:\n{self.agent.log_text()[-3000:]}")
            if time.monotonic() - t0 > timeout_s:
                raise ClusterError(f"timed out after {timeout_s:.0f}s waiting for {what}")
            time.sleep(poll_s)
        return time.monotonic() - t0

    def wait_bound(self, count: int, timeout_s: float) -> float:
        def bound() -> bool:
            pods = self.pods()
            return len(pods) == count and all((p.get("spec") or {}).get("nodeName") for p in pods)

        return self.wait(f"{count} pods bound", bound, timeout_s)

    def delete_pods(self, pods: list[dict[str, Any]], workers: int = 8) -> None:
        """Delete each pod by uid, as many at once as ``workers`` (one DELETE of a whole
        collection of thousands of pods outlasts any sensible request timeout)."""
        refs = [PodRef(p["metadata"]["namespace"], p["metadata"]["name"], p["metadata"]["uid"]) for p in pods]
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            for done in [pool.submit(self.client.delete_pod, r) for r in refs]:
                done.result()

    def delete_all(self, timeout_s: float) -> float:
        """Delete every pod of the test namespace; the seconds until they are gone."""
        self.delete_pods(self.pods())
        return self.wait("the test pods gone", lambda: not self.pods(), timeout_s)

    def records_written(self, count: int) -> bool:
        """Every sharer carries an owner record (the node side wrote it), except the ones the node
        side refused: bound where no slot was free, they never get one, as kubelet would refuse
        them. They are counted and reported; waiting for them would only run into the timeout."""
        pods = self.pods()
        refused = self.node_side.refused if self.node_side is not None else set()
        return len(pods) == count and all(
            keys.ANNOTATION_SHADOW_OWNER in _annotations(p) or _key(p) in refused for p in pods
        )


def _key(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


def _annotations(pod: Mapping[str, Any]) -> Mapping[str, str]:
    return (pod.get("metadata") or {}).get("annotations") or {}


def check_sharers(sharers: list[dict[str, Any]], shadows: list[dict[str, Any]], n: int = SHARE_N) -> list[str]:
    """What is wrong with a settled world: a sharer not on its shadow's node, a shadow over its N, duplicates."""
    problems: list[str] = []
    by_key = {f"{s['metadata']['namespace']}/{s['metadata']['name']}": s for s in shadows}
    if len(by_key) != len(shadows):
        problems.append(f"{len(shadows) - len(by_key)} shadows share a name")
    users: dict[str, int] = {}
    for p in sharers:
        key, shadow, problem = recorded_shadow(p, by_key)
        if problem:
            problems.append(problem)
        if shadow is not None:
            users[key] = users.get(key, 0) + 1
    problems += [f"shadow {k} has {u} sharers, over its {n}" for k, u in sorted(users.items()) if u > n]
    need = -(-len(sharers) // n)
    if len(shadows) > need:
        problems.append(f"{len(shadows)} shadows for {len(sharers)} sharers of {n}: at most {need} needed")
    return problems


@contextlib.contextmanager
def scale_world(cluster: Cluster, side: Path, nodes: int, *, idle_s: float = 5.0) -> Iterator[ScaleWorld]:
    world = ScaleWorld(cluster, side, idle_s=idle_s)
    try:
        world.start(nodes)
        yield world
    finally:
        world.close()


__all__ = [
    "AGENT_USER",
    "FLOW_SCHEMA",
    "NAMESPACE",
    "SHADOW_STAGES",
    "SHARE_RESOURCE",
    "THIS_PROCESS",
    "ProcessUsage",
    "ScaleWorld",
    "StageClock",
    "agent_kubeconfig",
    "agent_requests",
    "api_writes",
    "check_sharers",
    "cpu_between",
    "cpu_by_process",
    "cpu_seconds",
    "level_reached_at",
    "plain",
    "process_usage",
    "reached_at",
    "scale_world",
    "sharer",
    "writes_between",
]
