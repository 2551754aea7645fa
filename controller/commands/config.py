"""`gpushare config ...`: validate and show the configuration offline."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from gpushare.config import effective_config, load_config
from gpushare.errors import ConfigError

app = typer.Typer(no_args_is_help=True, help="Check or show the configuration file.")


@app.command("check")
def check(file: Annotated[Path, typer.Argument(help="YAML config file (version: v1)")]) -> None:
    """Validate FILE without touching sockets, files or modules; exit 1 listing every problem."""
    try:
        load_config(file)
    except ConfigError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1) from exc
    typer.echo(f"{file}: ok")


@app.command("show")
def show(file: Annotated[Path | None, typer.Argument(help="YAML config file; defaults when omitted")] = None) -> None:
    """Print the effective configuration (file over defaults) as JSON."""
    try:
        cfg = load_config(file)
    except ConfigError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1) from exc
    typer.echo(json.dumps(effective_config(cfg), indent=2))
