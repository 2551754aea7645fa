"""Sub-commands of the one `gpushare` CLI, one module per part; `controller.cli` mounts them."""

from __future__ import annotations

import os

import typer

from gpushare.config import Config, load_config
from gpushare.errors import ConfigError


def load_config_or_exit(path: str | os.PathLike[str] | None, exit_code: int = 2) -> Config:
    """Load the config, or print every problem to stderr and exit: nothing has been touched yet."""
    try:
        return load_config(path)
    except ConfigError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(exit_code) from exc
