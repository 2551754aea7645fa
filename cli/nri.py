"""`gpushare nri ...`: run the NRI plugin alone (design §5), e.g. on a node without the agent or
in tests against a real containerd."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import os
import threading
from typing import Annotated

import typer

from cli.common import load_config_or_exit, stop_on_signals
from controller.io.podresources import PodResourcesClient
from gpushare.config import Config, effective_config
from gpushare.log import kv
from nri_plugin import Injector, NriError, Stub
from nri_plugin.stub import ENV_PLUGIN_SOCKET

app = typer.Typer(no_args_is_help=True, help="The containerd NRI plugin (device sync at CreateContainer).")
log = logging.getLogger(__name__)


@app.command("run")
def run(
    socket_path: Annotated[
        str | None,
        typer.Option("--socket", help="NRI socket to dial (default: config nri.socket, /var/run/nri/nri.sock)"),
    ] = None,
    pod_resources_socket: Annotated[
        str | None,
        typer.Option(
            "--pod-resources-socket",
            help="kubelet pod-resources socket; without it cross-pod instructions are refused (design §8)",
        ),
    ] = None,
    config_file: Annotated[str | None, typer.Option("--config", help="gpushare config file (YAML, version v1)")] = None,
    preconnected: Annotated[
        bool,
        typer.Option(
            "--preconnected/--no-preconnected",
            help=f"use the socket containerd passed as fd ${ENV_PLUGIN_SOCKET} (automatic when that is set "
            "and --socket is not given)",
        ),
    ] = False,
) -> None:
    """Run the plugin until SIGTERM/SIGINT; one INFO line per decision."""
    cfg = _with_flags(load_config_or_exit(config_file), socket_path, pod_resources_socket)
    use_fd = preconnected or (socket_path is None and ENV_PLUGIN_SOCKET in os.environ)
    log.info("effective config", extra=kv(**{"nri": effective_config(cfg)["nri"]}))

    stop = threading.Event()
    stop_on_signals(stop, "nri", log)

    with contextlib.ExitStack() as stack:
        oracle = None
        if pod_resources_socket is not None:
            oracle = stack.enter_context(PodResourcesClient(cfg.kubelet.pod_resources_socket))
        stub = _stub_or_exit(Injector(cfg, oracle=oracle), cfg, use_fd)
        stack.callback(stub.close)
        # Everything imported so far lives for the whole process: move it out of the collector's
        # reach so a full collection (~35 ms over these objects) never lands inside a handler.
        gc.collect()
        gc.freeze()
        log.info(
            "nri: starting",
            extra=kv(
                mode="pre-connected" if use_fd else "external",
                socket=cfg.nri.socket if not use_fd else f"fd:{os.environ.get(ENV_PLUGIN_SOCKET)}",
                pod_resources=pod_resources_socket or "none (cross-pod refused)",
            ),
        )
        stub.run(stop)
        if use_fd and stub.connections == 0:
            # containerd kills a pre-connected plugin that fails its handshake; say why first.
            log.error("nri: the pre-connected handshake never completed")
            raise typer.Exit(1)
    log.info("nri: stopped")


def _with_flags(cfg: Config, socket_path: str | None, pod_resources_socket: str | None) -> Config:
    """The flags over the file: each given flag replaces its config key."""
    if socket_path is not None:
        cfg = dataclasses.replace(cfg, nri=dataclasses.replace(cfg.nri, socket=socket_path))
    if pod_resources_socket is not None:
        cfg = dataclasses.replace(
            cfg, kubelet=dataclasses.replace(cfg.kubelet, pod_resources_socket=pod_resources_socket)
        )
    return cfg


def _stub_or_exit(injector: Injector, cfg: Config, use_fd: bool) -> Stub:
    """The stub for the inherited socket or the configured one; a misconfigured one exits 2."""
    try:
        if use_fd:
            return Stub.from_environment(injector, name=cfg.nri.plugin_name, index=cfg.nri.plugin_index)
        return Stub(injector, socket_path=cfg.nri.socket, name=cfg.nri.plugin_name, index=cfg.nri.plugin_index)
    except NriError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from exc
