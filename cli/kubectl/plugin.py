"""``kubectl gpushare``: the operator's view of gpushare from any machine with a kubeconfig.

kubectl runs any ``kubectl-<name>`` on PATH as ``kubectl <name>``; the ``kubectl-gpushare``
distribution (hack/kubectl_dist.py) and the full package install it, with the completion
executable ``kubectl_complete-gpushare`` (``complete_main``). Subcommands: ``status [NODE]``,
``who [GPU|POD]``, ``why POD`` and ``completion bash`` (docs/kubectl-gpushare.md), each taking
kubectl's own flags. What they read and how: ``cli.kubectl.source``.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
import time
from collections.abc import Iterable, Mapping
from typing import Annotated, Any

import typer

from cli.kubectl import complete, flags, view
from cli.kubectl import output as out
from cli.kubectl.explain import explain
from cli.kubectl.source import ClusterNames, Flags, Source, connect, labels_of, pod_key
from cli.status_text import render_text
from controller.errors import KubeError
from gpushare import keys, rules

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    help="gpushare for operators: which pod uses which GPU, and why a pod is Pending, evicted or refused.",
)

# The flags every subcommand takes: kubectl's own (as `kubectl get` reads them), then the plugin's.
Output = Annotated[str, typer.Option("-o", "--output", help="'' (table), wide, json or yaml")]
Namespace = Annotated[
    str | None, typer.Option("-n", "--namespace", help="the namespace of pods (default: the context's, else default)")
]
AllNamespaces = Annotated[
    bool, typer.Option("-A", "--all-namespaces", help="pods in every namespace; NAME is then looked up in all")
]
Selector = Annotated[
    str | None, typer.Option("-l", "--selector", help="a label selector, as kubectl's -l (e.g. app=x,tier!=db)")
]
Kubeconfig = Annotated[
    str | None,
    typer.Option("--kubeconfig", help="as kubectl: else $KUBECONFIG, ~/.kube/config"),
]
Context = Annotated[str | None, typer.Option("--context", help="the kubeconfig context to use")]
RequestTimeout = Annotated[
    str | None,
    typer.Option("--request-timeout", help="per API request, as kubectl: 0 (none), 30 (seconds), 30s, 1m; default 15s"),
]
AgentNamespace = Annotated[str, typer.Option("--agent-namespace", help="where the agent DaemonSet runs")]
ApiOnly = Annotated[bool, typer.Option("--api-only", help="read the API only; do not exec into the agents")]


def check_flags(  # noqa: PLR0917 - one argument per flag, as the commands receive them
    output: str,
    namespace: str | None,
    all_namespaces: bool,
    selector: str | None,
    kubeconfig: str | None,
    context: str | None,
    request_timeout: str | None,
    agent_namespace: str,
    api_only: bool,
) -> Flags:
    if output not in out.OUTPUTS:
        raise typer.BadParameter(f"{output!r}: use wide, json or yaml (or leave it out for a table)", param_hint="-o")
    try:
        timeout_s = None if request_timeout is None else flags.parse_request_timeout(request_timeout)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--request-timeout") from exc
    try:
        parsed = flags.parse_selector(selector or "")
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="-l") from exc
    return Flags(
        output=output,
        namespace=namespace,
        all_namespaces=all_namespaces,
        selector=parsed,
        selector_text=selector or "",
        kubeconfig=kubeconfig,
        context=context,
        request_timeout=request_timeout,
        timeout_s=timeout_s,
        agent_namespace=agent_namespace,
        api_only=api_only,
    )


def plugin_version() -> str:
    """The installed distribution's version: the plugin's own (``kubectl-gpushare``, also inside the
    zipapp) or, in a full install, gpushare's; both take pyproject's version."""
    for dist in ("kubectl-gpushare", "gpushare"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown (not installed: run it from an installed package)"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"kubectl-gpushare {plugin_version()}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", is_eager=True, callback=_print_version, help="print the version and exit")
    ] = False,
) -> None:
    """gpushare for operators: which pod uses which GPU, and why a pod is Pending, evicted or refused."""


def _emit(text: str) -> None:
    typer.echo(text)


def _colour() -> bool:
    return out.use_colour(sys.stdout.isatty(), os.environ)


def _fail(exc: KubeError | str) -> typer.Exit:
    typer.echo(f"kubectl gpushare: {exc}", err=True)
    return typer.Exit(1)


def _none_found(scope: str | None) -> None:
    """kubectl's words for an empty answer, on stderr so a pipe reads nothing."""
    typer.echo("No resources found" + (f" in {scope} namespace." if scope else "."), err=True)


@app.command(
    "status",
    help="Every node's agent: ready, leader, NRI, GPUs, shadows, sharers, borrowers and problems.\n\n"
    "-l selects nodes by their labels. Nodes belong to no namespace: -n and -A are accepted, as kubectl accepts"
    " them for nodes, and change nothing (the counts cover every namespace).",
)
def status(  # noqa: PLR0917 - typer maps each parameter to a flag or argument
    node: Annotated[str | None, typer.Argument(help="one node; default every node")] = None,
    output: Output = "",
    namespace: Namespace = None,
    all_namespaces: AllNamespaces = False,
    selector: Selector = None,
    kubeconfig: Kubeconfig = None,
    context: Context = None,
    request_timeout: RequestTimeout = None,
    agent_namespace: AgentNamespace = keys.DEFAULT_NAMESPACE,
    api_only: ApiOnly = False,
) -> None:
    """``kubectl gpushare status [NODE]``."""
    f = check_flags(
        output, namespace, all_namespaces, selector, kubeconfig, context, request_timeout, agent_namespace, api_only
    )
    if node is not None and f.selector_text:
        raise typer.BadParameter("name one NODE or select nodes with -l, not both", param_hint="NODE")
    try:
        src = connect(f)
        with src.client:
            nodes = [n for n in src.client.list_nodes() if flags.matches(f.selector, labels_of(n))]
            if node is not None:
                nodes = [n for n in nodes if n["metadata"]["name"] == node]
                if not nodes:
                    raise KubeError(f"gpushare: no node named {node!r}")
            pods, _ = src.client.list_pods()
            names = [str(n["metadata"]["name"]) for n in nodes]
            src.read_agents(names if node or f.selector_text else None)
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
    if not rows:
        _none_found(None)
        return
    text = out.status_table(rows, output == "wide", _colour())
    if node is not None and node in src.docs:
        text += "\n\n" + render_text(src.docs[node])
    _emit(text)


def _split_target(target: str) -> tuple[str, str]:
    """``pod/NAME``, ``pod/NS/NAME``, ``gpu/ID``, ``NS/NAME`` or ``NAME`` -> (kind, rest); kind "": by lookup."""
    kind, _, rest = target.partition("/")
    if kind in ("pod", "pods", "po") and rest:
        return "pod", rest
    if kind == "gpu" and rest:
        return "gpu", rest
    return "", target


def find_pod(name: str, scope: str | None, pods: Iterable[str]) -> str | None:
    """The ``ns/name`` key that ``NAME`` or ``NS/NAME`` means: in ``scope``, or (``scope`` None: -A)
    in whichever namespace holds it. None when no pod has that name; ValueError when several do."""
    keys_ = set(pods)
    if "/" in name:
        return name if name in keys_ else None
    if scope is not None:
        return f"{scope}/{name}" if f"{scope}/{name}" in keys_ else None
    found = sorted(k for k in keys_ if k.rpartition("/")[2] == name)
    if len(found) > 1:
        raise ValueError(f"pods named {name!r} are in several namespaces ({', '.join(found)}): give NS/NAME or -n NS")
    return found[0] if found else None


@app.command(
    "who",
    help="Which pods use a GPU and as what (owner, shadow, sharer, dind, borrower), or which GPU a pod sees.\n\n"
    "Without an argument: the GPU users among the pods of -n (default: the context's namespace), or of every"
    " namespace with -A. A GPU belongs to no namespace: `who GPU` lists all its users. -l keeps the pods whose"
    " labels match.",
)
def who(  # noqa: PLR0917 - typer maps each parameter to a flag or argument
    target: Annotated[str | None, typer.Argument(help="a GPU ID (or prefix), or a pod; default every GPU")] = None,
    output: Output = "",
    namespace: Namespace = None,
    all_namespaces: AllNamespaces = False,
    selector: Selector = None,
    kubeconfig: Kubeconfig = None,
    context: Context = None,
    request_timeout: RequestTimeout = None,
    agent_namespace: AgentNamespace = keys.DEFAULT_NAMESPACE,
    api_only: ApiOnly = False,
) -> None:
    """``kubectl gpushare who [GPU|POD]``."""
    f = check_flags(
        output, namespace, all_namespaces, selector, kubeconfig, context, request_timeout, agent_namespace, api_only
    )
    scope = f.scope()
    try:
        src = connect(f)
        with src.client:
            pods, _ = src.client.list_pods()
            src.read_agents()
    except KubeError as exc:
        raise _fail(exc) from exc
    labels = {pod_key(p): labels_of(p) for p in pods}
    uses = view.gpu_uses(pods, src.docs)
    if target is not None:
        uses = _select(uses, target, scope, labels, f)
    elif scope is not None:
        uses = [u for u in uses if u.pod.startswith(f"{scope}/")]
    uses = [u for u in uses if flags.matches(f.selector, labels.get(u.pod))]
    if output in ("json", "yaml"):
        _emit(out.serialise({"uses": [out.as_dict(u) for u in uses], "unknownGpus": src.errors}, output))
        return
    notes = [f"{n}: {e}" for n, e in sorted(src.errors.items())]
    if notes:
        typer.echo("GPU IDs unknown (?) on some nodes:\n" + "\n".join(notes), err=True)
    if not uses:
        _none_found(scope if target is None else None)
        return
    _emit(out.who_table(uses, output == "wide", _colour()))


def _select(
    uses: list[view.GpuUse], target: str, scope: str | None, labels: Mapping[str, Any], f: Flags
) -> list[view.GpuUse]:
    kind, value = _split_target(target)
    try:
        pod = find_pod(value, scope, labels) if kind != "gpu" else None
    except ValueError as exc:
        raise _fail(str(exc)) from exc
    if pod is not None or kind == "pod":
        if f.selector_text:
            raise typer.BadParameter("name one POD or select pods with -l, not both", param_hint="TARGET")
        if pod is None:
            where = value if "/" in value or scope is None else f"{scope}/{value}"
            raise _fail(f"no pod {where}" + ("" if "/" in value or scope else " in any namespace"))
        return view.uses_of_pod(uses, pod)
    found = view.uses_of_gpu(uses, value)
    if not found:
        where = f"{scope}/{value}" if scope else f"{value} in any namespace"
        raise _fail(f"no pod {where} and no GPU {value!r} in use")
    return found


@app.command(
    "why",
    help="Why a pod is Pending, was evicted or was refused, in one paragraph with the fix.\n\n"
    "With -l, one paragraph for each pod of -n (or of every namespace with -A) whose labels match. With -A, a"
    " NAME is found in whichever namespace holds it.",
)
def why(  # noqa: PLR0917 - typer maps each parameter to a flag or argument
    pod: Annotated[
        str | None,
        typer.Argument(help="NAME or NS/NAME (a ReplicaSet or Job name finds admission refusals); or use -l"),
    ] = None,
    output: Output = "",
    namespace: Namespace = None,
    all_namespaces: AllNamespaces = False,
    selector: Selector = None,
    kubeconfig: Kubeconfig = None,
    context: Context = None,
    request_timeout: RequestTimeout = None,
    agent_namespace: AgentNamespace = keys.DEFAULT_NAMESPACE,
    api_only: ApiOnly = False,
) -> None:
    """``kubectl gpushare why POD`` or ``why -l SELECTOR``."""
    f = check_flags(
        output, namespace, all_namespaces, selector, kubeconfig, context, request_timeout, agent_namespace, api_only
    )
    if (pod is None) == (not f.selector_text):
        raise typer.BadParameter("name one POD, or select pods with -l (not both)", param_hint="POD")
    scope = f.scope()
    try:
        src = connect(f)
        with src.client:
            targets = _why_targets(src, pod, scope)
            shadows, _ = src.client.list_pods(namespace=f.agent_namespace, label_selector=rules.SHADOW_SELECTOR)
            events = {
                key: src.client.list_events(key.split("/")[0], involved_name=key.split("/")[1]) for key in targets
            }
            nodes = {str(((raw or {}).get("spec") or {}).get("nodeName") or "") for raw in targets.values()}
            # A pod on no node (Pending) may wait for any node's spot lending: ask every agent then.
            src.read_agents(None if "" in nodes else sorted(nodes))
    except KubeError as exc:
        raise _fail(exc) from exc
    explanations = [explain(key, raw, events[key], shadows, src.docs) for key, raw in targets.items()]
    if not explanations:
        _none_found(scope)
        return
    docs = [{**out.as_dict(e), "paragraph": e.paragraph} for e in explanations]
    if output in ("json", "yaml"):
        _emit(out.serialise(docs[0] if pod is not None else {"items": docs}, output))
        return
    _emit("\n\n".join(out.why_text(e, _colour()) for e in explanations))


def _why_targets(src: Source, pod: str | None, scope: str | None) -> dict[str, dict[str, Any] | None]:
    """``ns/name`` -> the pod (None: no such pod, whose Events may still tell an admission refusal)."""
    if pod is None:
        pods, _ = src.client.list_pods(namespace=scope)
        return {pod_key(p): p for p in pods if flags.matches(src.flags.selector, labels_of(p))}
    if "/" in pod:
        ns, _, name = pod.rpartition("/")
    elif scope is not None:
        ns, name = scope, pod
    else:
        found, _ = src.client.list_pods(field_selector=f"metadata.name={pod}")
        if len(found) != 1:
            where = ", ".join(sorted(pod_key(p) for p in found))
            raise KubeError(
                f"pods named {pod!r} are in several namespaces ({where}): give NS/NAME or -n NS"
                if found
                else f"no pod named {pod!r} in any namespace (for a ReplicaSet or Job refused at admission, name its"
                " namespace with -n)"
            )
        return {pod_key(found[0]): found[0]}
    found, _ = src.client.list_pods(namespace=ns, field_selector=f"metadata.name={name}")
    return {f"{ns}/{name}": found[0] if found else None}


@app.command("completion")
def completion(shell: Annotated[str, typer.Argument(help="bash")]) -> None:
    """Print the shell completion script for kubectl-gpushare typed directly (see docs/kubectl-gpushare.md)."""
    try:
        _emit(complete.script(shell))
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="SHELL") from exc


def complete_main() -> None:
    """``kubectl_complete-gpushare``: kubectl runs it with the words after ``kubectl gpushare``."""
    tree = complete.tree_of(typer.main.get_command(app))
    words = sys.argv[1:]
    names = ClusterNames(complete.resolve(words, tree).values)
    sys.stdout.write("".join(f"{line}\n" for line in complete.complete(words, tree, names)))


def main() -> None:
    app(prog_name="kubectl gpushare")


__all__ = ["app", "check_flags", "complete_main", "find_pod", "main", "plugin_version"]
