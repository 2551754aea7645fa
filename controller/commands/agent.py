"""`gpushare agent`: the node agent (loop + device plugins + NRI plugin + /metrics) in one process."""

from __future__ import annotations

import dataclasses
import faulthandler
import json
import logging
import signal
import threading
from pathlib import Path
from typing import Annotated

import typer

from controller.agent import Agent
from controller.commands import load_config_or_exit, parse_spot_from, stop_on_signals
from controller.spot.runtime import SpotRuntime
from gpushare.config import effective_config, with_overrides
from gpushare.errors import GpushareError
from gpushare.log import kv

log = logging.getLogger(__name__)


def agent(
    *,
    config: Annotated[Path | None, typer.Option("--config", help="YAML config file (version: v1)")] = None,
    kubeconfig: Annotated[
        str | None,
        typer.Option("--kubeconfig", envvar="KUBECONFIG", help="kubeconfig (default: the in-cluster service account)"),
    ] = None,
    spot_from: Annotated[
        list[str] | None,
        typer.Option("--spot-from", help="RESOURCE=SOCKET of a vendor device plugin spot-gpu follows; repeatable"),
    ] = None,
    listen: Annotated[
        str | None, typer.Option("--listen", help="HOST:PORT of /metrics, /healthz, /status (default metrics.listen)")
    ] = None,
    period: Annotated[float, typer.Option("--period", help="seconds between reconcile passes without events")] = 2.0,
    lease: Annotated[
        bool, typer.Option("--lease/--no-lease", help="hold the gpushare-controller Lease for cluster-wide work")
    ] = True,
    spot: Annotated[
        bool, typer.Option("--spot/--no-spot", help="lend idle lendable owners' GPUs (docs/spot.md)")
    ] = True,
    kmod: Annotated[
        bool, typer.Option("--kmod/--no-kmod", help="use gpukmod for owner returns when it is loaded")
    ] = True,
) -> None:
    """Run the node agent until SIGTERM/SIGINT; one log line per decision."""
    cfg = load_config_or_exit(config)
    if not cfg.node_name:
        typer.echo("gpushare: nodeName is empty: set it in the config or the NODE_NAME variable", err=True)
        raise typer.Exit(2)
    stop = threading.Event()
    try:
        sources = parse_spot_from(spot_from or [], cfg.real_resources[0])
        if listen is not None:
            cfg = with_overrides(cfg, metrics=dataclasses.replace(cfg.metrics, listen=listen))
        spot_runtime = SpotRuntime.from_config(cfg, use_kmod=kmod) if spot else None
        runner = Agent(
            cfg,
            kubeconfig=kubeconfig,
            spot_sources=sources,
            spot_runtime=spot_runtime,
            period_s=period,
            use_lease=lease,
            stop=stop,
        )
    except (GpushareError, OSError) as exc:
        typer.echo(f"gpushare: agent cannot start: {exc}", err=True)
        raise typer.Exit(1) from exc
    log.info("effective config", extra=kv(config=json.dumps(effective_config(cfg), sort_keys=True)))
    stop_on_signals(stop, "agent", log)
    # `kill -USR1 <pid>`: every thread's stack to stderr, for a loop that stopped passing (/healthz 503).
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    runner.run()
