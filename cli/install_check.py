"""``gpushare install-check``: is this installation serving? What the chart's ``helm test`` runs.

An install is serving when every agent DaemonSet of the namespace has rolled out (every node it
should run on has an up-to-date, ready agent) and every node with an agent offers gpushare's
GPUs: a ``gpushare/`` extended resource in its allocatable (device-plugin nodes) or a
ResourceSlice of gpushare's DRA driver (DRA nodes). It runs anywhere with API access and reads
only; the verdict is plain functions over the objects read (``verdict``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

import typer

from controller.errors import KubeError
from controller.io.kube_client import KubeClient
from gpushare import installation, keys, rules
from gpushare.config import parse_duration_s

# The chart's labels on the agents' DaemonSets and pods (templates/40-daemonset.yaml).
AGENT_SELECTOR = "app.kubernetes.io/part-of=gpushare,app.kubernetes.io/component in (agent,agent-dra)"
DRA_DRIVER = keys.DOMAIN


@dataclass
class Verdict:
    ok: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _rolled_out(ds: Mapping[str, Any]) -> str | None:
    """None when the DaemonSet is fully rolled out, else what is missing."""
    name = (ds.get("metadata") or {}).get("name", "?")
    status = ds.get("status") or {}
    desired = int(status.get("desiredNumberScheduled") or 0)
    ready = int(status.get("numberReady") or 0)
    updated = int(status.get("updatedNumberScheduled") or 0)
    if int(status.get("observedGeneration") or 0) < int((ds.get("metadata") or {}).get("generation") or 0):
        return f"DaemonSet {name}: its controller has not seen the latest spec yet"
    if ready < desired or updated < desired:
        return f"DaemonSet {name}: {ready} of {desired} agents ready, {updated} up to date"
    return None


def verdict(
    daemonsets: Iterable[Mapping[str, Any]],
    agent_pods: Iterable[Mapping[str, Any]],
    nodes: Iterable[Mapping[str, Any]],
    slices: Iterable[Mapping[str, Any]],
) -> Verdict:
    """What is serving and what is not, from the objects as the API returned them."""
    v = Verdict()
    daemonsets = list(daemonsets)
    if not daemonsets:
        v.problems.append(f"no agent DaemonSet in namespace {installation.namespace()}: is gpushare installed there?")
    for ds in daemonsets:
        missing = _rolled_out(ds)
        if missing:
            v.problems.append(missing)
    agent_nodes = sorted({str((p.get("spec") or {}).get("nodeName") or "") for p in agent_pods} - {""})
    if daemonsets and not agent_nodes:
        v.problems.append(
            "no node runs the agent: label the GPU nodes gpushare.k8s.io/enabled=true (or what nodeSelector says)"
        )
    allocatable = {
        str((n.get("metadata") or {}).get("name")): sorted(
            r for r, q in ((n.get("status") or {}).get("allocatable") or {}).items() if rules.is_gpushare_resource(r)
        )
        for n in nodes
    }
    sliced = {str((s.get("spec") or {}).get("nodeName") or "") for s in slices}
    for node in agent_nodes:
        if allocatable.get(node):
            v.ok.append(f"node {node}: serves {', '.join(allocatable[node])}")
        elif node in sliced:
            v.ok.append(f"node {node}: serves GPUs through the DRA driver {DRA_DRIVER}")
        else:
            v.problems.append(
                f"node {node}: its agent runs but the node offers no gpushare resource yet "
                "(`gpushare doctor` in its agent pod says why)"
            )
    return v


def install_check(
    namespace: Annotated[str, typer.Option("--namespace", "-n", help="the installation's namespace")] = (
        keys.DEFAULT_NAMESPACE
    ),
    timeout: Annotated[str, typer.Option("--timeout", help="how long to wait for the install to serve")] = "2m",
    kubeconfig: Annotated[str | None, typer.Option("--kubeconfig", help="default: in-cluster")] = None,
) -> None:
    """Exit 0 once every agent is rolled out and every agent's node offers gpushare's GPUs; else say what is not."""
    try:
        installation.use_namespace(namespace)
        deadline = time.monotonic() + parse_duration_s(timeout)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    try:
        client = KubeClient.from_kubeconfig(kubeconfig, timeout_s=15.0)
    except KubeError as exc:
        typer.echo(f"FAIL: {exc}", err=True)
        raise typer.Exit(1) from exc
    with client:
        while True:
            try:
                v = verdict(
                    client.list_daemonsets(namespace, AGENT_SELECTOR),
                    client.list_pods(namespace=namespace, label_selector=AGENT_SELECTOR)[0],
                    client.list_nodes(),
                    client.list_resource_slices(DRA_DRIVER),
                )
            except KubeError as exc:
                v = Verdict(problems=[str(exc)])
            if not v.problems or time.monotonic() >= deadline:
                break
            time.sleep(2.0)
    for line in v.ok:
        typer.echo(f"ok: {line}")
    for line in v.problems:
        typer.echo(f"FAIL: {line}", err=True)
    if v.problems:
        raise typer.Exit(1)
    typer.echo(f"gpushare in {namespace} is serving")
