"""What one ``kubectl gpushare`` invocation reads, and with which flags.

Two sources, read as the operator running it:

- the API (get/list pods, nodes, events; get the Lease): roles, phases, records, Events;
- each node's agent, through ``kubectl exec`` into its DaemonSet pod running ``gpushare status
  -o json`` (what docs/install.md already has operators run; needs ``create pods/exec`` in the
  agent's namespace). Only the agent knows which real GPU each container holds (kubelet's
  PodResources), whether NRI is connected and what it evicted lately. ``/status`` itself is
  served on the node's loopback only, so the API server's node or pod proxy cannot reach it.

Without exec (``--api-only``, or refused) every GPU reads as ``?`` and the reason is printed.
Shell completion reads the names it offers (``ClusterNames``) the same way, with a short deadline.

    Flags          one invocation's checked flags (plugin.check_flags makes them)
    Source         the API client and the agents' documents, by node
    connect        the client for the kubeconfig and context kubectl would use
    ClusterNames   nodes, pods, namespaces and contexts for completion
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cli.kubectl import flags, view
from controller.errors import KubeError
from controller.io.kube_client import KubeClient
from gpushare import installation, keys

AGENT_CONTAINER = "agent"
AGENT_CONFIG = "/etc/gpushare/config.yaml"
EXEC_TIMEOUT_S = 30.0
# Without --request-timeout: a cluster that does not answer is named in seconds, not awaited forever.
API_TIMEOUT_S = 15.0
COMPLETION_TIMEOUT_S = 5.0
NO_KUBECTL = "kubectl is not on PATH"


@dataclass(frozen=True)
class Flags:
    """One invocation's flags, checked: a bad value is refused before anything is read."""

    output: str
    namespace: str | None
    all_namespaces: bool
    selector: tuple[flags.Requirement, ...]
    selector_text: str
    kubeconfig: str | None
    context: str | None
    request_timeout: str | None
    timeout_s: float | None  # None: the plugin's own deadlines; 0.0: none at all (kubectl's "0")
    agent_namespace: str
    api_only: bool

    def scope(self) -> str | None:
        """The namespace pods are listed in; None with -A."""
        if self.all_namespaces:
            return None
        return self.namespace or context_namespace(kubeconfig_paths(self.kubeconfig, os.environ), self.context)


@dataclass
class Source:
    """What one invocation reads: the API client, and the agents' documents by node."""

    client: KubeClient
    flags: Flags
    agent_pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    docs: dict[str, dict[str, Any]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def agent_namespace(self) -> str:
        return self.flags.agent_namespace

    @property
    def api_only(self) -> bool:
        return self.flags.api_only

    def read_agents(self, nodes: Sequence[str] | None = None) -> None:
        """Find the agent pods, and unless ``api_only`` read each one's ``/status`` (on ``nodes`` only if given)."""
        pods, _ = self.client.list_pods(namespace=self.agent_namespace, label_selector=view.AGENT_LABEL)
        for p in pods:
            node = str((p.get("spec") or {}).get("nodeName") or "")
            if node and (nodes is None or node in nodes):
                self.agent_pods[node] = p
        if self.api_only:
            for node in self.agent_pods:
                self.errors[node] = "--api-only: GPU IDs, NRI and evictions are known only to the agent"
            return
        with ThreadPoolExecutor(max_workers=8, thread_name_prefix="gpushare-kubectl-exec") as pool:
            results = pool.map(self._exec_status, sorted(self.agent_pods))
            for node, (doc, error) in zip(sorted(self.agent_pods), results, strict=True):
                if doc is not None:
                    self.docs[node] = doc
                else:
                    self.errors[node] = error

    def _exec_status(self, node: str) -> tuple[dict[str, Any] | None, str]:
        doc, error = self._exec_status_once(node)
        if doc is None and not error.startswith(NO_KUBECTL):
            # A busy node can miss one deadline (the exec, or the agent's own 3 s for /status): ask again.
            doc, error = self._exec_status_once(node)
        return doc, error

    def _exec_status_once(self, node: str) -> tuple[dict[str, Any] | None, str]:
        kubectl = shutil.which("kubectl")
        if kubectl is None:
            return None, f"{NO_KUBECTL}, so the agent's status cannot be read (exec)"
        name = str(self.agent_pods[node]["metadata"]["name"])
        argv = [kubectl, *self.kubectl_flags(), "exec", "-n", self.agent_namespace, name, "-c", AGENT_CONTAINER]
        argv += ["--", "gpushare", "status", "-o", "json", "--config", AGENT_CONFIG]
        timeout = self.flags.timeout_s
        try:
            res = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=EXEC_TIMEOUT_S if timeout is None else timeout or None,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return None, f"kubectl exec {name}: {exc}"
        if res.returncode != 0:
            last = (res.stderr.strip().splitlines() or [f"exit status {res.returncode}"])[-1]
            return None, f"kubectl exec {name}: {last}"
        try:
            doc = json.loads(res.stdout)
        except ValueError as exc:
            return None, f"kubectl exec {name}: `gpushare status -o json` printed no JSON ({exc})"
        if not isinstance(doc, dict) or doc.get("source") != "agent":
            why = doc.get("warning") if isinstance(doc, dict) else "not a JSON object"
            return None, f"the agent in {name} does not answer: {why}"
        return doc, ""

    def kubectl_flags(self) -> list[str]:
        """The same cluster, user and deadline for the ``kubectl exec`` as for the plugin's own calls."""
        f = self.flags
        argv = ["--kubeconfig", f.kubeconfig] if f.kubeconfig else []
        argv += ["--context", f.context] if f.context else []
        return argv + (["--request-timeout", f.request_timeout] if f.request_timeout is not None else [])

    def leader(self) -> str:
        try:
            lease = self.client.get_lease(self.agent_namespace, keys.LEASE_NAME)
        except KubeError:
            return ""  # not allowed to read the Lease: the LEADER column stays empty
        return str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")


def kubeconfig_paths(flag: str | None, env: Mapping[str, str]) -> list[Path]:
    """kubectl's order: --kubeconfig, else every file in $KUBECONFIG, else ~/.kube/config."""
    if flag:
        return [Path(flag)]
    if env.get("KUBECONFIG"):
        return [Path(p) for p in env["KUBECONFIG"].split(os.pathsep) if p]
    return [Path.home() / ".kube" / "config"]


def context_namespace(paths: Sequence[Path], context: str | None) -> str:
    """The namespace of the context in use (kubectl's default for -n), else ``default``."""
    docs = []
    for p in paths:
        try:
            doc = yaml.safe_load(p.read_text())
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(doc, dict):
            docs.append(doc)
    current = context or next((str(d["current-context"]) for d in docs if d.get("current-context")), "")
    for d in docs:
        for c in d.get("contexts") or ():
            if isinstance(c, dict) and c.get("name") == current:
                return str((c.get("context") or {}).get("namespace") or "default")
    return "default"


def connect(f: Flags) -> Source:
    # A shadow is one only in the agents' namespace: the views read shadows by the same rule.
    try:
        installation.use_namespace(f.agent_namespace)
    except ValueError as exc:
        raise KubeError(f"gpushare: --agent-namespace: {exc}") from exc
    # kubectl's "0" is no deadline at all, which the API client spells None.
    timeout = API_TIMEOUT_S if f.timeout_s is None else f.timeout_s or None
    paths = [p for p in kubeconfig_paths(f.kubeconfig, os.environ) if p.exists()]
    if not paths and f.kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        client = KubeClient.from_kubeconfig(None, timeout_s=timeout)  # in a pod, as kubectl: the service account
    elif not paths:
        raise KubeError("gpushare: no kubeconfig found (--kubeconfig, $KUBECONFIG or ~/.kube/config)")
    else:
        client = KubeClient.from_kubeconfig(
            os.pathsep.join(str(p) for p in paths), context=f.context, timeout_s=timeout
        )
    return Source(client, f)


def labels_of(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("labels") or {})


def pod_key(pod: Mapping[str, Any]) -> str:
    return f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"


class ClusterNames:
    """The names completion offers, read with the flags typed so far; any failure offers nothing.

    A completion runs on every TAB, so the API gets a short deadline; kubectl prints what its
    completion executable writes to stderr onto the user's prompt, so errors stay silent.
    """

    def __init__(self, values: Mapping[str, Any]) -> None:
        self.values = values

    def _client(self) -> KubeClient:
        given = self.values.get("request_timeout")
        try:
            timeout = COMPLETION_TIMEOUT_S if given is None else flags.parse_request_timeout(str(given))
        except ValueError:
            timeout = COMPLETION_TIMEOUT_S
        kubeconfig, context = self.values.get("kubeconfig"), self.values.get("context")
        paths = [p for p in kubeconfig_paths(kubeconfig, os.environ) if p.exists()]
        if not paths:
            raise KubeError("no kubeconfig")
        merged = os.pathsep.join(str(p) for p in paths)
        return KubeClient.from_kubeconfig(merged, context=context, timeout_s=timeout or COMPLETION_TIMEOUT_S)

    def _names(self, read: Any) -> list[str]:
        try:
            with self._client() as client:
                return sorted(str(n) for n in read(client))
        except KubeError:
            return []

    def nodes(self) -> list[str]:
        return self._names(lambda c: (n["metadata"]["name"] for n in c.list_nodes()))

    def namespaces(self) -> list[str]:
        return self._names(lambda c: (n["metadata"]["name"] for n in c.list_namespaces()[0]))

    def pods(self, namespace: str | None) -> list[str]:
        if namespace is None:
            return self._names(lambda c: (pod_key(p) for p in c.list_pods()[0]))
        paths = kubeconfig_paths(self.values.get("kubeconfig"), os.environ)
        ns = namespace or context_namespace(paths, self.values.get("context"))
        return self._names(lambda c: (p["metadata"]["name"] for p in c.list_pods(namespace=ns)[0]))

    def contexts(self) -> list[str]:
        found = []
        for path in kubeconfig_paths(self.values.get("kubeconfig"), os.environ):
            try:
                doc = yaml.safe_load(path.read_text())
            except (OSError, yaml.YAMLError):
                continue
            if isinstance(doc, dict):
                found += [str(c["name"]) for c in doc.get("contexts") or () if isinstance(c, dict) and c.get("name")]
        return sorted(set(found))


__all__ = [
    "API_TIMEOUT_S",
    "ClusterNames",
    "Flags",
    "Source",
    "connect",
    "context_namespace",
    "kubeconfig_paths",
    "labels_of",
    "pod_key",
]
