"""``gpushare uninstall prepare|finish``: the chart's uninstall hooks, so that an uninstall strands nobody.

``helm uninstall`` deletes the agents, and the shadows live on in the namespace, which Helm does
not own. A sharer would keep device nodes of a GPU no pod holds (kubelet gives it to the next
pod), and a borrower would stay when its owner returns. So:

- ``prepare`` (pre-delete hook) lists the pods that depend on gpushare
  (``controller.core.dependents``). None: the uninstall goes on. Some: it refuses, naming each,
  unless ``--evict`` or the namespace's ``gpushare.k8s.io/uninstall: evict`` annotation (Helm
  cannot upgrade a release whose uninstall was refused, so the choice must be possible then),
  which evicts them through the Eviction API (PodDisruptionBudgets are honoured, as by
  ``kubectl drain``) and waits until they are gone. From the hook's start the chart's
  ``gpushare-uninstalling`` admission policy refuses new pods asking gpushare's resources, so
  neither an eviction nor a refusal can be undone by a Deployment making them again.
- ``finish`` (post-delete hook), once the agents are gone: deletes the shadows, the leader Lease
  and that admission policy. What stays on the nodes is listed in docs/install.md.
"""

from __future__ import annotations

import logging
import time
from typing import Annotated

import typer

from controller.core.dependents import Dependent, dependents
from controller.core.pod_facts import PodRef
from controller.errors import KubeError
from controller.io.kube_client import KubeClient
from gpushare import installation, keys, rules
from gpushare.config import parse_duration_s

log = logging.getLogger(__name__)

app = typer.Typer(no_args_is_help=True, help="The chart's uninstall hooks: strand no sharer or borrower.")

# The admission policy the chart creates for the uninstall's duration (templates/90-uninstall.yaml).
UNINSTALLING_POLICY = "gpushare-uninstalling"
EXIT_REFUSED = 1

Namespace = Annotated[str, typer.Option("--namespace", "-n", help="the installation's namespace")]
Kubeconfig = Annotated[str | None, typer.Option("--kubeconfig", help="default: in-cluster, else ~/.kube/config")]


def _find(client: KubeClient) -> list[Dependent]:
    pods, _ = client.list_pods()
    return dependents(pods, client.list_resource_claims())


def _client(kubeconfig: str | None) -> KubeClient:
    try:
        return KubeClient.from_kubeconfig(kubeconfig, timeout_s=15.0)
    except KubeError as exc:
        typer.echo(f"gpushare uninstall: {exc}", err=True)
        raise typer.Exit(EXIT_REFUSED) from exc


def _use(namespace: str) -> None:
    try:
        installation.use_namespace(namespace)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--namespace") from exc


@app.command("prepare")
def prepare(
    namespace: Namespace = keys.DEFAULT_NAMESPACE,
    evict: Annotated[bool, typer.Option("--evict", help="evict the pods that depend on gpushare, then go on")] = False,
    timeout: Annotated[str, typer.Option("--timeout", help="how long --evict waits for them to go")] = "10m",
    poll: Annotated[str, typer.Option("--poll", help="how often it looks again")] = "2s",
    kubeconfig: Kubeconfig = None,
) -> None:
    """Exit 0 when no pod depends on gpushare (after evicting them with --evict); else list them and exit 1."""
    _use(namespace)
    try:
        timeout_s, poll_s = parse_duration_s(timeout), max(parse_duration_s(poll), 0.1)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    with _client(kubeconfig) as client:
        try:
            asked = client.get_namespace_annotations(namespace).get(keys.ANNOTATION_UNINSTALL)
            if asked is not None and asked != keys.UNINSTALL_EVICT:
                # A misspelt choice must not evict, and must not pass unseen either.
                typer.echo(
                    f"gpushare uninstall: namespace {namespace}: {keys.ANNOTATION_UNINSTALL}={asked!r} is not "
                    f"{keys.UNINSTALL_EVICT!r}; nothing is evicted",
                    err=True,
                )
            evict = evict or asked == keys.UNINSTALL_EVICT
            found = _find(client)
            if found and evict:
                found = _evict_all(client, found, time.monotonic() + timeout_s, poll_s)
        except KubeError as exc:
            typer.echo(
                f"gpushare uninstall: cannot tell which pods use gpushare, so the uninstall stops: {exc}", err=True
            )
            raise typer.Exit(EXIT_REFUSED) from exc
    if not found:
        typer.echo("gpushare uninstall: no pod uses a GPU through gpushare; going on")
        return
    verb = "are still there after evicting" if evict else "still use GPUs through gpushare"
    lines = [f"gpushare uninstall refused: {len(found)} pod(s) {verb}:"]
    lines += [f"  {d}" for d in found]
    lines.append(
        "No new one can start meanwhile (admission policy gpushare-uninstalling). Delete them (or scale "
        "down what makes them) and uninstall again, or have the uninstall evict them: "
        f"kubectl annotate namespace {namespace} {keys.ANNOTATION_UNINSTALL}={keys.UNINSTALL_EVICT} "
        "(docs/install.md, 'Uninstall')."
    )
    typer.echo("\n".join(lines), err=True)
    raise typer.Exit(EXIT_REFUSED)


def _evict_all(client: KubeClient, found: list[Dependent], deadline: float, poll_s: float) -> list[Dependent]:
    """Evict until none is left or the deadline passes; what is left."""
    asked: set[str] = set()
    while found:
        for d in found:
            accepted = client.evict_pod(d.ref)
            if d.ref.uid not in asked:
                note = "evicting" if accepted is not False else "gone"
                if accepted is None:
                    note = "waiting for its PodDisruptionBudget"
                typer.echo(f"gpushare uninstall: {note}: {d}")
                asked.add(d.ref.uid)
        if time.monotonic() >= deadline:
            return found
        time.sleep(poll_s)
        found = _find(client)
    return found


@app.command("finish")
def finish(namespace: Namespace = keys.DEFAULT_NAMESPACE, kubeconfig: Kubeconfig = None) -> None:
    """Delete what the agents made and Helm does not own: the shadows, the Lease, the uninstall's policy."""
    _use(namespace)
    try:
        _finish(_client(kubeconfig))
    except KubeError as exc:
        typer.echo(f"gpushare uninstall: {exc}", err=True)
        raise typer.Exit(EXIT_REFUSED) from exc


def _finish(client: KubeClient) -> None:
    with client:
        shadows, _ = client.list_pods(namespace=installation.namespace(), label_selector=rules.SHADOW_SELECTOR)
        for pod in shadows:
            meta = pod.get("metadata") or {}
            ref_ns, name, uid = str(meta.get("namespace", "")), str(meta.get("name", "")), str(meta.get("uid", ""))
            if rules.is_shadow(ref_ns, meta.get("labels") or {}):
                client.delete_pod(PodRef(ref_ns, name, uid), grace_period_s=0)
                typer.echo(f"gpushare uninstall: deleted shadow {ref_ns}/{name}")
        if client.delete_lease(installation.namespace(), keys.LEASE_NAME):
            typer.echo(f"gpushare uninstall: deleted Lease {installation.namespace()}/{keys.LEASE_NAME}")
        if client.delete_admission_policy(UNINSTALLING_POLICY):
            typer.echo(f"gpushare uninstall: deleted the admission policy {UNINSTALLING_POLICY} and its binding")
