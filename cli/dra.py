"""`gpushare dra-plugin`: gpushare's DRA kubelet plugin for one node, on its own (docs/dra.md).

The agent runs the same driver in its process on a DRA node (``dra.enabled``), where spot opens
and closes the spot devices; run alone, no GPU is lendable and every spot device stays closed.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from pathlib import Path
from typing import Annotated

import kubernetes
import typer

from cli.common import load_config_or_exit, stop_on_signals
from draplugin.plugin import DraPlugin, api_client, settings_from_config
from gpushare.errors import GpushareError

log = logging.getLogger(__name__)


def dra_plugin(
    *,
    node: Annotated[str, typer.Option("--node", envvar="NODE_NAME", help="this node's name (the pool's name)")],
    config: Annotated[Path | None, typer.Option("--config", help="YAML config file (version: v1)")] = None,
    vendor_kind: Annotated[
        str | None, typer.Option("--vendor-kind", help="the vendor's CDI kind (default: dra.vendorKind)")
    ] = None,
    kubeconfig: Annotated[
        str | None, typer.Option("--kubeconfig", help="kubeconfig file (default: in-cluster credentials)")
    ] = None,
) -> None:
    """Serve gpushare's DRA driver on this node until SIGINT/SIGTERM."""
    cfg = load_config_or_exit(config, exit_code=1)
    settings = settings_from_config(cfg, node=node)
    if vendor_kind:
        settings = dataclasses.replace(settings, vendor_kind=vendor_kind)
    try:
        plugin = DraPlugin(settings, api_client(kubeconfig))
    except (GpushareError, OSError, kubernetes.config.ConfigException) as exc:
        typer.echo(f"gpushare: dra-plugin cannot start: {exc}", err=True)
        raise typer.Exit(1) from exc
    stop = threading.Event()
    stop_on_signals(stop, "dra-plugin", log)
    plugin.run(stop)
