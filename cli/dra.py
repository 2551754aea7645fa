"""`gpushare dra-plugin`: gpushare's DRA kubelet plugin for one node (docs/dra.md)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Annotated

import kubernetes
import typer

from cli.common import load_config_or_exit, stop_on_signals
from draplugin.plugin import DraPlugin, PluginSettings
from draplugin.pool import PoolShape

log = logging.getLogger(__name__)


def dra_plugin(
    *,
    node: Annotated[str, typer.Option("--node", envvar="NODE_NAME", help="this node's name (the pool's name)")],
    vendor_kind: Annotated[
        str, typer.Option("--vendor-kind", help="the vendor's CDI kind whose devices are the GPUs, e.g. nvidia.com/gpu")
    ],
    kubelet_root: Annotated[Path, typer.Option("--kubelet-root", help="kubelet's --root-dir")] = Path(
        "/var/lib/kubelet"
    ),
    cdi_root: Annotated[Path, typer.Option("--cdi-root", help="where claims' CDI specs are written")] = Path(
        "/var/run/cdi"
    ),
    kubeconfig: Annotated[
        str | None, typer.Option("--kubeconfig", help="kubeconfig file (default: in-cluster credentials)")
    ] = None,
    no_spot: Annotated[bool, typer.Option("--no-spot", help="publish no spot devices")] = False,
    config: Annotated[Path | None, typer.Option("--config", help="YAML config file (version: v1)")] = None,
) -> None:
    """Serve gpushare's DRA driver on this node until SIGINT/SIGTERM."""
    cfg = load_config_or_exit(config, exit_code=1)
    if kubeconfig:
        api = kubernetes.config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    else:
        kubernetes.config.load_incluster_config()  # type: ignore[no-untyped-call]
        api = kubernetes.client.ApiClient()
    settings = PluginSettings(
        node=node,
        vendor_kind=vendor_kind,
        kubelet_root=kubelet_root,
        cdi_root=cdi_root,
        cdi_spec_dirs=tuple(cfg.cdi_spec_dirs),
        shape=PoolShape(share_specs=cfg.share_specs, dev_share_specs=cfg.dev_share_specs, spot=not no_spot),
    )
    plugin = DraPlugin(settings, api)
    stop = threading.Event()
    stop_on_signals(stop, "dra-plugin", log)
    plugin.run(stop)
