"""Sub-commands of the one `gpushare` CLI, one module per part; `cli.main` mounts them.

What every command shares lives here: loading the config (or exiting with every problem),
turning SIGTERM/SIGINT into the process's one stop ``Event`` (only the CLI handles signals,
so library code never races it for them), and reading ``--spot-from`` values.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from types import FrameType

import typer

from gpushare import installation
from gpushare.config import Config, load_config
from gpushare.errors import ConfigError


def load_config_or_exit(path: str | os.PathLike[str] | None, exit_code: int = 2) -> Config:
    """Load the config, or print every problem to stderr and exit: nothing has been touched yet."""
    try:
        cfg = load_config(path)
    except ConfigError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(exit_code) from exc
    # Every command that reads the config runs in one installation: its namespace is fixed now,
    # before any thread starts (gpushare.installation).
    installation.use_namespace(cfg.namespace)
    return cfg


def stop_on_signals(stop: threading.Event, what: str, logger: logging.Logger) -> None:
    """Set ``stop`` on SIGTERM or SIGINT, logging ``<what>: signal <NAME>, stopping`` on ``logger``.

    The caller's logger names the command in the line, as if it had logged it itself.
    """

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        logger.info("%s: signal %s, stopping", what, signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)


def parse_spot_from(values: list[str], default_resource: str) -> dict[str, str]:
    """``--spot-from [RESOURCE=]SOCKET`` values → vendor resource → its device plugin's socket."""
    out: dict[str, str] = {}
    for v in values:
        resource, sep, path = v.partition("=")
        if not sep:
            resource, path = default_resource, v
        if "/" not in resource or not path:
            raise typer.BadParameter(f"--spot-from {v!r}: expected [RESOURCE=]SOCKET, e.g. nvidia.com/gpu=/path.sock")
        if resource in out:
            raise typer.BadParameter(f"--spot-from: {resource} given twice")
        out[resource] = path
    return out
