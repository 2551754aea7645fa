"""``kubectl gpushare``: the operator's view of gpushare from any machine with a kubeconfig.

kubectl runs any ``kubectl-<name>`` on PATH as ``kubectl <name>``; the package installs
``kubectl-gpushare`` (pyproject ``[project.scripts]``). Subcommands: ``status [NODE]``,
``who [GPU|POD]``, ``why POD`` (docs/kubectl-gpushare.md).

Two sources, read as the operator running it:

- the API (get/list pods, nodes, events; get the Lease): roles, phases, records, Events;
- each node's agent, through ``kubectl exec`` into its DaemonSet pod running ``gpushare status
  -o json`` (what docs/install.md already has operators run; needs ``create pods/exec`` in the
  agent's namespace). Only the agent knows which real GPU each container holds (kubelet's
  PodResources), whether NRI is connected and what it evicted lately. ``/status`` itself is
  served on the node's loopback only, so the API server's node or pod proxy cannot reach it.

Without exec (``--api-only``, or refused) every GPU reads as ``?`` and the reason is printed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from cli.kubectl import output as out
from cli.kubectl import view
from cli.kubectl.explain import explain
from cli.status import render_text
from controller.errors import KubeError
from controller.io.kube_client import KubeClient
from gpushare import installation, keys, rules

AGENT_CONTAINER = "agent"
AGENT_CONFIG = "/etc/gpushare/config.yaml"
EXEC_TIMEOUT_S = 30.0
NO_KUBECTL = "kubectl is not on PATH"

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="gpushare for operators: which pod uses which GPU, and why a pod is Pending, evicted or refused.",
)

Output = Annotated[str, typer.Option("-o", "--output", help="'' (table), wide, json or yaml")]
Kubeconfig = Annotated[str | None, typer.Option("--kubeconfig", help="as kubectl: else $KUBECONFIG, ~/.kube/config")]
Context = Annotated[str | None, typer.Option("--context", help="the kubeconfig context to use")]
Namespace = Annotated[str | None, typer.Option("-n", "--namespace", help="the pod's namespace (default: context's)")]
AgentNamespace = Annotated[str, typer.Option("--agent-namespace", help="where the agent DaemonSet runs")]
ApiOnly = Annotated[bool, typer.Option("--api-only", help="read the API only; do not exec into the agents")]


@dataclass
class Source:
    """What one invocation reads: the API client, and the agents' documents by node."""

    client: KubeClient
    kubeconfig: str | None
    context: str | None
    agent_namespace: str
    api_only: bool
    agent_pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    docs: dict[str, dict[str, Any]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

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
        try:
            res = subprocess.run(argv, capture_output=True, text=True, timeout=EXEC_TIMEOUT_S, check=False)
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
        flags = ["--kubeconfig", self.kubeconfig] if self.kubeconfig else []
        return flags + (["--context", self.context] if self.context else [])

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


def _connect(kubeconfig: str | None, context: str | None, agent_ns: str, api_only: bool) -> Source:
    # A shadow is one only in the agents' namespace: the views read shadows by the same rule.
    try:
        installation.use_namespace(agent_ns)
    except ValueError as exc:
        raise KubeError(f"gpushare: --agent-namespace: {exc}") from exc
    paths = [p for p in kubeconfig_paths(kubeconfig, os.environ) if p.exists()]
    if not paths and kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        client = KubeClient.from_kubeconfig(None)  # in a pod, as kubectl: the service account
    elif not paths:
        raise KubeError("gpushare: no kubeconfig found (--kubeconfig, $KUBECONFIG or ~/.kube/config)")
    else:
        client = KubeClient.from_kubeconfig(os.pathsep.join(str(p) for p in paths), context=context, timeout_s=15.0)
    return Source(client, kubeconfig, context, agent_ns, api_only)


def _emit(text: str) -> None:
    typer.echo(text)


def _check_output(output: str) -> None:
    if output not in out.OUTPUTS:
        raise typer.BadParameter(f"-o {output!r}: use wide, json or yaml (or leave it out for a table)")


def _colour() -> bool:
    return out.use_colour(sys.stdout.isatty(), os.environ)


def _fail(exc: KubeError) -> typer.Exit:
    typer.echo(f"kubectl gpushare: {exc}", err=True)
    return typer.Exit(1)


@app.command("status")
def status(  # noqa: PLR0917 - typer maps each parameter to a flag or argument
    node: Annotated[str | None, typer.Argument(help="one node; default every node")] = None,
    output: Output = "",
    kubeconfig: Kubeconfig = None,
    context: Context = None,
    agent_namespace: AgentNamespace = keys.DEFAULT_NAMESPACE,
    api_only: ApiOnly = False,
) -> None:
    """Every node's agent: ready, leader, NRI, GPUs, shadows, sharers, borrowers and problems."""
    _check_output(output)
    try:
        src = _connect(kubeconfig, context, agent_namespace, api_only)
        with src.client:
            nodes = src.client.list_nodes()
            if node is not None:
                nodes = [n for n in nodes if n["metadata"]["name"] == node]
                if not nodes:
                    raise KubeError(f"gpushare: no node named {node!r}")
            pods, _ = src.client.list_pods()
            src.read_agents([node] if node else None)
            rows = view.node_rows(
                nodes,
                pods,
                agent_pods=src.agent_pods,
                docs=src.docs,
                errors=src.errors,
                leader=src.leader(),
                now=time.time(),
            )
    except KubeError as exc:
        raise _fail(exc) from exc
    if output in ("json", "yaml"):
        doc: dict[str, Any] = {"nodes": [out.as_dict(r) for r in rows]}
        if node is not None:
            doc["agentStatus"] = src.docs.get(node)
        _emit(out.serialise(doc, output))
        return
    text = out.status_table(rows, output == "wide", _colour())
    if node is not None and node in src.docs:
        text += "\n\n" + render_text(src.docs[node])
    _emit(text)


def _split_target(target: str, namespace: str) -> tuple[str, str]:
    """``pod/NAME``, ``gpu/ID``, ``NS/NAME`` or ``NAME`` -> (kind, value); kind "" is decided by lookup."""
    kind, _, rest = target.partition("/")
    if kind in ("pod", "pods", "po") and rest:
        return "pod", rest if "/" in rest else f"{namespace}/{rest}"
    if kind == "gpu" and rest:
        return "gpu", rest
    return "", target


@app.command("who")
def who(  # noqa: PLR0917 - typer maps each parameter to a flag or argument
    target: Annotated[str | None, typer.Argument(help="a GPU ID (or prefix), or a pod; default every GPU")] = None,
    output: Output = "",
    namespace: Namespace = None,
    kubeconfig: Kubeconfig = None,
    context: Context = None,
    agent_namespace: AgentNamespace = keys.DEFAULT_NAMESPACE,
    api_only: ApiOnly = False,
) -> None:
    """Which pods use a GPU and as what (owner, shadow, sharer, dind, borrower), or which GPU a pod sees."""
    _check_output(output)
    ns = namespace or context_namespace(kubeconfig_paths(kubeconfig, os.environ), context)
    try:
        src = _connect(kubeconfig, context, agent_namespace, api_only)
        with src.client:
            pods, _ = src.client.list_pods()
            src.read_agents()
    except KubeError as exc:
        raise _fail(exc) from exc
    uses = view.gpu_uses(pods, src.docs)
    if target is not None:
        uses = _select(uses, target, ns, {f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in pods})
    if output in ("json", "yaml"):
        _emit(out.serialise({"uses": [out.as_dict(u) for u in uses], "unknownGpus": src.errors}, output))
        return
    text = out.who_table(uses, output == "wide", _colour())
    notes = [f"{n}: {e}" for n, e in sorted(src.errors.items())]
    if notes:
        typer.echo("GPU IDs unknown (?) on some nodes:\n" + "\n".join(notes), err=True)
    _emit(text)


def _select(uses: list[view.GpuUse], target: str, namespace: str, pods: set[str]) -> list[view.GpuUse]:
    kind, value = _split_target(target, namespace)
    if kind == "pod" or (not kind and (f"{namespace}/{value}" in pods or value in pods)):
        key = value if value in pods or kind == "pod" else f"{namespace}/{value}"
        if key not in pods:
            typer.echo(f"kubectl gpushare: no pod {key}", err=True)
            raise typer.Exit(1)
        return view.uses_of_pod(uses, key)
    found = view.uses_of_gpu(uses, value)
    if not found:
        typer.echo(f"kubectl gpushare: no pod {namespace}/{value} and no GPU {value!r} in use", err=True)
        raise typer.Exit(1)
    return found


@app.command("why")
def why(  # noqa: PLR0917 - typer maps each parameter to a flag or argument
    pod: Annotated[str, typer.Argument(help="NAME or NS/NAME (a ReplicaSet or Job name finds admission refusals)")],
    output: Output = "",
    namespace: Namespace = None,
    kubeconfig: Kubeconfig = None,
    context: Context = None,
    agent_namespace: AgentNamespace = keys.DEFAULT_NAMESPACE,
    api_only: ApiOnly = False,
) -> None:
    """Why a pod is Pending, was evicted or was refused, in one paragraph with the fix."""
    _check_output(output)
    ns = namespace or context_namespace(kubeconfig_paths(kubeconfig, os.environ), context)
    ns, _, name = pod.rpartition("/") if "/" in pod else (ns, "/", pod)
    try:
        src = _connect(kubeconfig, context, agent_namespace, api_only)
        with src.client:
            found, _ = src.client.list_pods(namespace=ns, field_selector=f"metadata.name={name}")
            raw = found[0] if found else None
            events = src.client.list_events(ns, involved_name=name)
            shadows, _ = src.client.list_pods(namespace=agent_namespace, label_selector=rules.SHADOW_SELECTOR)
            node = str(((raw or {}).get("spec") or {}).get("nodeName") or "")
            src.read_agents([node] if node else None)
    except KubeError as exc:
        raise _fail(exc) from exc
    explanation = explain(f"{ns}/{name}", raw, events, shadows, src.docs)
    if output in ("json", "yaml"):
        _emit(out.serialise({**out.as_dict(explanation), "paragraph": explanation.paragraph}, output))
        return
    _emit(out.why_text(explanation, _colour()))


def main() -> None:
    app(prog_name="kubectl gpushare")


__all__ = ["app", "context_namespace", "kubeconfig_paths", "main"]
