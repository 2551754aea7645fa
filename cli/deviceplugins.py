"""`gpushare deviceplugins ...` and `gpushare fake-gpus`: run the device plugins standalone.

`deviceplugins run` serves share-gpu-N, share-dev-gpu-N and spot-gpu with shadows given on
the command line instead of from the controller (testing and diagnosis); `deviceplugins
list` dials any plugin socket like kubelet would; `fake-gpus` is the fake vendor plugin.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Annotated

import typer

from cli.common import load_config_or_exit, parse_spot_from, stop_on_signals
from deviceplugins import (
    DevicePluginError,
    FakeGpuPlugin,
    PluginManager,
    create_fake_gpu_nodes,
    parse_static_shadow,
    read_plugin,
)
from gpushare.config import effective_config
from gpushare.errors import GpushareError
from gpushare.log import kv

log = logging.getLogger(__name__)

app = typer.Typer(no_args_is_help=True, help="Run or inspect the kubelet device plugins standalone.")

PluginDirOpt = Annotated[
    str | None,
    typer.Option("--plugin-dir", help="kubelet device-plugin directory (default: kubelet.devicePluginDir)"),
]
ConfigOpt = Annotated[Path | None, typer.Option("--config", help="YAML config file (version: v1)")]


def _serve_until_signal(mgr: PluginManager, stop: threading.Event, what: str) -> None:
    """Serve until SIGINT/SIGTERM; stopping removes the plugins' sockets."""
    mgr.start()
    try:
        stop_on_signals(stop, what, log)
        while not stop.wait(1.0):
            pass
    finally:
        mgr.stop()


def _fail(exc: GpushareError) -> typer.Exit:
    typer.echo(str(exc), err=True)
    return typer.Exit(1)


@app.command("run")
def run(
    *,
    shadow: Annotated[
        list[str] | None,
        typer.Option("--shadow", help="static shadow ns/name:N[:share|share-dev]; repeatable"),
    ] = None,
    spot_from: Annotated[
        list[str] | None,
        typer.Option("--spot-from", help="[RESOURCE=]SOCKET of a vendor device plugin spot learns from; repeatable"),
    ] = None,
    spot_resource: Annotated[
        str, typer.Option("--spot-resource", help="resource of a --spot-from given without RESOURCE=")
    ] = "example.com/gpu",
    spot_healthy: Annotated[
        list[str] | None, typer.Option("--spot-healthy", help="real device ID to mark lendable; repeatable")
    ] = None,
    plugin_dir: PluginDirOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Serve every gpushare device plugin until SIGINT/SIGTERM, with static shadows."""
    cfg = load_config_or_exit(config, exit_code=1)
    try:
        shadows = [parse_static_shadow(s) for s in shadow or []]
        sources = parse_spot_from(spot_from or [], spot_resource)
        stop = threading.Event()
        mgr = PluginManager.for_gpushare(
            plugin_dir or cfg.kubelet.device_plugin_dir,
            share_specs=cfg.share_specs,
            dev_share_specs=cfg.dev_share_specs,
            spot_sources=sources,
            stop=stop,
        )
        mgr.set_shadows(shadows)
        for resource, socket_path in sorted(sources.items()):
            # Standalone there are no kubelet rows to learn the GPUs from, so spot follows the
            # vendor's own stream; the agent never does (docs/deviceplugins.md, "Spot").
            log.warning(
                "following a vendor plugin's ListAndWatch beside kubelet's: NVIDIA's plugin hands each health "
                "change to one stream only, so kubelet may miss one; for tests and benchmarks only",
                extra=kv(resource=resource, socket=socket_path),
            )
        for rid in spot_healthy or []:
            mgr.set_spot_health(rid, True)
    except GpushareError as exc:
        raise _fail(exc) from exc
    log.info("effective config", extra=kv(config=json.dumps(effective_config(cfg))))
    _serve_until_signal(mgr, stop, "deviceplugins")


@app.command("list")
def list_devices(
    socket: Annotated[str, typer.Argument(help="a device plugin's unix socket")],
    timeout_s: Annotated[float, typer.Option("--timeout", help="seconds")] = 5.0,
) -> None:
    """Dial a device plugin like kubelet does; print its options and current device list as JSON."""
    try:
        snap = read_plugin(socket, timeout_s)
    except DevicePluginError as exc:
        raise _fail(exc) from exc
    doc = {
        "options": {
            "pre_start_required": snap.options.pre_start_required,
            "get_preferred_allocation_available": snap.options.get_preferred_allocation_available,
        },
        "devices": [{"ID": d.id, "health": d.health} for d in snap.devices],
    }
    typer.echo(json.dumps(doc, indent=2))


def fake_gpus(
    *,
    count: Annotated[int, typer.Option("--count", min=1, max=256, help="number of fake GPUs")],
    resource: Annotated[str, typer.Option("--resource", help="vendor resource name to advertise")] = "example.com/gpu",
    dev_dir: Annotated[str, typer.Option("--dev-dir", help="where the fakegpu<i> nodes are created")] = "/dev",
    plugin_dir: PluginDirOpt = None,
    major: Annotated[int, typer.Option("--major", help="device major number (1 = mem driver)")] = 1,
    minor: Annotated[int, typer.Option("--minor", help="device minor number (3 = null)")] = 3,
    config: ConfigOpt = None,
) -> None:
    """A fake vendor device plugin: N character nodes advertised and allocated like real GPUs."""
    cfg = load_config_or_exit(config, exit_code=1)
    try:
        paths = create_fake_gpu_nodes(dev_dir, count, major, minor)
        directory = plugin_dir or cfg.kubelet.device_plugin_dir
        stop = threading.Event()
        mgr = PluginManager([FakeGpuPlugin(resource, directory, dev_dir, count)], directory, stop=stop)
    except GpushareError as exc:
        raise _fail(exc) from exc
    log.info(
        "fake GPUs ready",
        extra=kv(resource=resource, nodes=",".join(paths), socket=mgr.plugin(resource).socket_path),
    )
    _serve_until_signal(mgr, stop, "fake-gpus")
