"""`gpushare status [-o json]`: what an operator asks first, from the agent or, failing that, the API.

The agent serves ``/status`` on loopback (its endpoint, ``metrics.listen``); that answer has
everything: NRI connection, advertised and allocated counts, each shadow with its GPU and
users, each sharer with its shadow, recent evictions. When the agent does not answer, the
command says so and shows what the API alone knows: shadows and sharers from their records
(annotations) and the node's allocatable counts; NRI and evictions are then unknown.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from cli.agent_endpoint import fetch_status
from cli.common import load_config_or_exit
from cli.status_text import render_text
from controller.core.mapping import MappingCache
from controller.core.model import build_snapshot
from controller.io.kube_client import KubeClient
from controller.report import describe_node
from controller.share.cluster_view import unschedulable_shadows
from gpushare.config import Config
from gpushare.errors import GpushareError
from gpushare.rules import is_gpushare_resource


def api_only_status(cfg: Config, kubeconfig: str | None, why: str) -> dict[str, Any]:
    """What the API alone says (no agent): records on shadows and sharers, node allocatable."""
    with KubeClient.from_kubeconfig(kubeconfig, timeout_s=10.0) as client:
        pods, _ = client.list_pods()
        nodes = client.list_nodes()
    snap = build_snapshot(pods, cfg)
    unschedulable = unschedulable_shadows(pods)
    shadows, sharers = describe_node(snap, MappingCache(), unschedulable, cfg.real_resources)
    advertised: dict[str, int] = {}
    for node in nodes:
        if cfg.node_name and node["metadata"]["name"] != cfg.node_name:
            continue
        for resource, qty in ((node.get("status") or {}).get("allocatable") or {}).items():
            if is_gpushare_resource(resource) or resource in cfg.real_resources:
                advertised[resource] = advertised.get(resource, 0) + int(qty)
    return {
        "source": "api-only",
        "warning": f"gpushare: the agent did not answer ({why}); showing what the API records say. NRI connection, "
        "allocations and evictions are unknown. Is the agent running (`gpushare agent`, the DaemonSet)?",
        "node": cfg.node_name,
        "nri": {"connected": None},
        "advertised": advertised,
        "allocated": {},
        "shadows": [s.__dict__ for s in shadows],
        "sharers": [s.__dict__ for s in sharers],
        "evictions": [],
        "evictions_total": {},
    }


def status(
    output: Annotated[str, typer.Option("-o", "--output", help="text or json")] = "text",
    config: Annotated[Path | None, typer.Option("--config", help="YAML config file (version: v1)")] = None,
    agent: Annotated[
        str | None, typer.Option("--agent", help="HOST:PORT of the agent's endpoint (default metrics.listen)")
    ] = None,
    kubeconfig: Annotated[
        str | None, typer.Option("--kubeconfig", envvar="KUBECONFIG", help="for the API-only view")
    ] = None,
) -> None:
    """Show NRI, device counts, shadows and their users, sharers and recent evictions."""
    if output not in ("text", "json"):
        raise typer.BadParameter(f"-o {output!r}: use text or json")
    cfg = load_config_or_exit(config)
    try:
        doc = fetch_status(agent or cfg.metrics.listen)
    except (OSError, ValueError) as exc:
        try:
            doc = api_only_status(cfg, kubeconfig, str(exc))
        except GpushareError as api_exc:
            typer.echo(f"gpushare: the agent did not answer ({exc}) and neither did the API: {api_exc}", err=True)
            raise typer.Exit(1) from api_exc
    typer.echo(json.dumps(doc, indent=2, sort_keys=True, default=str) if output == "json" else render_text(doc))
