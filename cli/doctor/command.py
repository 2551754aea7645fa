"""`gpushare doctor [--config FILE] [-o text|json] [--spot/--no-spot]`: can this node serve gpushare?

Reads the node (``cli.doctor.host_probe``, ``cli.doctor.socket_probe``), the exporter
(``controller.metrics``) and, when credentials are at hand, the node's allocatable from the
API; ``cli.doctor.diagnosis`` judges each fact. Paths come from the gpushare config, so the
same command runs on the host and in the agent pod (``kubectl exec ... -- gpushare doctor
--config /etc/gpushare/config.yaml``). Exit status: 0 when every feature that is on can be
served (warnings allowed), 1 when a check failed, 2 when the config itself is bad.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from cli.common import load_config_or_exit
from cli.doctor.diagnosis import CgroupFact, Check, ExporterFact, NodeFacts, Status, diagnose, exit_code
from cli.doctor.host_probe import probe_cgroup, probe_containerd, probe_kmod
from cli.doctor.socket_probe import probe_agent, probe_kubelet, probe_nri, probe_nvidia_plugin
from controller.errors import KubeError
from controller.io.exporter_pods import ExporterPods
from controller.io.kube_client import KubeClient
from gpumetrics.discovery import is_pod_source, parse_pod_source
from gpumetrics.errors import MetricsError
from gpumetrics.scrape import Scraper
from gpushare.config import Config, MetricsConfig
from podcgroups.cgroups import detect_layout

_MARK = {Status.OK: "ok", Status.WARN: "WARN", Status.FAIL: "FAIL"}


def probe_exporter(m: MetricsConfig, node: str = "", kubeconfig: str | None = None) -> ExporterFact:
    """One scrape of ``metrics.source`` through the same adapters the agent uses; a ``k8s://pods/``
    source finds this node's exporter pod through the API first, as the agent does."""
    if not m.source:
        return ExporterFact("", m.process_level)
    try:
        if not is_pod_source(m.source):
            result = Scraper.from_config(m).read()
        else:
            parse_pod_source(m.source)  # a malformed source is named before a client is opened
            with KubeClient.from_kubeconfig(kubeconfig, timeout_s=m.scrape_timeout_s + 3.0) as client:
                result = Scraper.from_config(m, node=node, list_pods=ExporterPods(client)).read()
    except (MetricsError, KubeError) as exc:
        return ExporterFact(m.source, m.process_level, error=str(exc))
    return ExporterFact(m.source, m.process_level, len(result.devices), ",".join(result.vendors) or None)


def probe_spot_cgroups(cfg: Config) -> CgroupFact:
    """The host's cgroups, with what the agent's own spot finds there (the same call, the same root)."""
    fact = probe_cgroup(cfg.spot.cgroup_root, cfg.kubelet.device_plugin_dir)
    layout = detect_layout(Path(cfg.spot.cgroup_root))
    if isinstance(layout, str):
        return dataclasses.replace(fact, spot_blocked=layout)
    return dataclasses.replace(fact, spot_layout=layout.describe(), layout_driver=str(layout.driver))


def api_allocatable(cfg: Config, kubeconfig: str | None) -> tuple[dict[str, int] | None, str | None]:
    """The node's allocatable count of each real resource, or (None, why) without credentials or answer."""
    if kubeconfig is None and not os.environ.get("KUBERNETES_SERVICE_HOST"):
        return None, "no kubeconfig and not in a pod"
    try:
        with KubeClient.from_kubeconfig(kubeconfig, timeout_s=3.0) as client:
            nodes = client.list_nodes()
    except KubeError as exc:
        return None, str(exc)
    names = [n["metadata"]["name"] for n in nodes]
    node = next((n for n in nodes if n["metadata"]["name"] == cfg.node_name), None)
    if node is None and len(nodes) == 1 and not cfg.node_name:
        node = nodes[0]
    if node is None:
        return None, f"node {cfg.node_name or '(nodeName unset)'} is not among {names}"
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    out: dict[str, int] = {}
    for resource in cfg.real_resources:
        try:
            out[resource] = int(allocatable.get(resource, 0))
        except (TypeError, ValueError):
            out[resource] = 0
    return out, None


def gather(cfg: Config, spot: bool | None, kubeconfig: str | None) -> tuple[NodeFacts, str]:
    """Every probe, once; returns the facts and where the spot setting came from."""
    agent = probe_agent(cfg.metrics.listen)
    if spot is not None:
        spot_source = "flag"
    elif agent.spot is not None:
        spot, spot_source = agent.spot, "the running agent"
    else:
        spot, spot_source = True, "default: the agent's own default"
    kubelet = probe_kubelet(cfg.kubelet.device_plugin_dir, cfg.kubelet.pod_resources_socket)
    allocatable, api_error = api_allocatable(cfg, kubeconfig)
    kubelet = dataclasses.replace(kubelet, api_allocatable=allocatable, api_error=api_error)
    facts = NodeFacts(
        containerd=probe_containerd(cfg.nri.socket),
        nri=probe_nri(cfg.nri.socket),
        cgroup=probe_spot_cgroups(cfg),
        kubelet=kubelet,
        real_resources=cfg.real_resources,
        exporter=probe_exporter(cfg.metrics, cfg.node_name, kubeconfig),
        kmod=probe_kmod(),
        agent=agent,
        spot=spot,
        nvidia=probe_nvidia_plugin(kubelet, cfg.device_list_dirs),
    )
    return facts, spot_source


def render_text(doc: dict[str, Any]) -> str:
    spot = "on" if doc["spot"] else "off"
    lines = [f"gpushare doctor: node {doc['node'] or '?'}, spot {spot} ({doc['spot_from']})"]
    width = max((len(c["name"]) for c in doc["checks"]), default=0)
    for c in doc["checks"]:
        lines.append(f"  {_MARK[Status(c['status'])]:4}  {c['name']:{width}}  {c['summary']}")
        if c["hint"]:
            lines.append(f"  {'':4}  {'':{width}}  fix: {c['hint']}")
    failed = sum(c["status"] == Status.FAIL for c in doc["checks"])
    warned = sum(c["status"] == Status.WARN for c in doc["checks"])
    verdict = (
        "every feature that is on can be served" if not failed else "this node cannot serve every feature that is on"
    )
    lines.append(f"{failed} failed, {warned} warning{'' if warned == 1 else 's'}: {verdict}")
    return "\n".join(lines)


def report(cfg: Config, checks: list[Check], spot: bool, spot_from: str) -> dict[str, Any]:
    return {
        "node": cfg.node_name,
        "spot": spot,
        "spot_from": spot_from,
        "ok": exit_code(checks) == 0,
        "checks": [{"name": c.name, "status": str(c.status), "summary": c.summary, "hint": c.hint} for c in checks],
    }


def doctor(
    config: Annotated[Path | None, typer.Option("--config", help="YAML config file (version: v1)")] = None,
    output: Annotated[str, typer.Option("-o", "--output", help="text or json")] = "text",
    spot: Annotated[
        bool | None,
        typer.Option("--spot/--no-spot", help="whether spot lending is on (default: ask the running agent, else on)"),
    ] = None,
    kubeconfig: Annotated[
        str | None, typer.Option("--kubeconfig", envvar="KUBECONFIG", help="for the node's allocatable counts")
    ] = None,
) -> None:
    """Check the node for everything gpushare needs; exit 0 only if every feature that is on can work."""
    if output not in ("text", "json"):
        raise typer.BadParameter(f"-o {output!r}: use text or json")
    cfg = load_config_or_exit(config)
    facts, spot_from = gather(cfg, spot, kubeconfig)
    checks = diagnose(facts, cfg.nri.socket)
    doc = report(cfg, checks, facts.spot, spot_from)
    typer.echo(json.dumps(doc, indent=2) if output == "json" else render_text(doc))
    raise typer.Exit(exit_code(checks))
