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

import kubernetes
import typer

from cli.common import load_config_or_exit, parse_spot_from, stop_on_signals
from controller.agent import Agent
from controller.spot.notice_socket import notice_socket_factory
from controller.spot.runtime import SpotRuntime
from gpushare.config import Config, effective_config, with_overrides
from gpushare.errors import GpushareError
from gpushare.log import kv

log = logging.getLogger(__name__)


KmodSocketOption = Annotated[
    str | None,
    typer.Option(
        "--kmod-socket",
        envvar="GPUSHARE_KMOD_SOCKET",
        help="benchmark/test seam, never for production: take kernel notices from, and send gpukmod "
        "commands to, a peer listening on this unix socket instead of gpukmod (docs/spot.md)",
    ),
]


def agent(
    *,
    config: Annotated[Path | None, typer.Option("--config", help="YAML config file (version: v1)")] = None,
    kubeconfig: Annotated[
        str | None,
        typer.Option("--kubeconfig", envvar="KUBECONFIG", help="kubeconfig (default: the in-cluster service account)"),
    ] = None,
    spot_from: Annotated[
        list[str] | None,
        typer.Option(
            "--spot-from", help="RESOURCE=SOCKET of the vendor device plugin a borrower's GPU is asked of; repeatable"
        ),
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
    kmod_socket: KmodSocketOption = None,
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
        spot_runtime = _spot_runtime(cfg, spot=spot, kmod=kmod, kmod_socket=kmod_socket, kubeconfig=kubeconfig)
        runner = Agent(
            cfg,
            kubeconfig=kubeconfig,
            spot_sources=sources,
            spot_runtime=spot_runtime,
            period_s=period,
            use_lease=lease,
            stop=stop,
        )
    except (GpushareError, OSError, kubernetes.config.ConfigException) as exc:
        typer.echo(f"gpushare: agent cannot start: {exc}", err=True)
        raise typer.Exit(1) from exc
    log.info("effective config", extra=kv(config=json.dumps(effective_config(cfg), sort_keys=True)))
    stop_on_signals(stop, "agent", log)
    # `kill -USR1 <pid>`: every thread's stack to stderr, for a loop that stopped passing (/healthz 503).
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    runner.run()


def _spot_runtime(
    cfg: Config, *, spot: bool, kmod: bool, kmod_socket: str | None, kubeconfig: str | None = None
) -> SpotRuntime | None:
    """The spot runtime the flags ask for (None with --no-spot); exits 2 on flags that contradict."""
    if kmod_socket is not None and not (spot and kmod):
        typer.echo("gpushare: --kmod-socket stands in for gpukmod: it needs --spot and --kmod", err=True)
        raise typer.Exit(2)
    if not spot:
        return None
    runtime = SpotRuntime.from_config(cfg, use_kmod=kmod, kubeconfig=kubeconfig)
    if kmod_socket is not None:
        where = f"the test socket {kmod_socket} (--kmod-socket; not gpukmod)"
        runtime.bridge.use_client_factory(notice_socket_factory(kmod_socket), where=where)
        log.warning("gpukmod replaced by a test socket: for benchmarks and tests only", extra=kv(path=kmod_socket))
    return runtime
