"""`gpushare config ...`: validate and show the configuration offline."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from cli.common import load_config_or_exit
from gpushare.config import effective_config

app = typer.Typer(no_args_is_help=True, help="Check or show the configuration file.")


@app.command("check")
def check(file: Annotated[Path, typer.Argument(help="YAML config file (version: v1)")]) -> None:
    """Validate FILE without touching sockets, files or modules; exit 1 listing every problem."""
    load_config_or_exit(file, exit_code=1)
    typer.echo(f"{file}: ok")


@app.command("show")
def show(file: Annotated[Path | None, typer.Argument(help="YAML config file; defaults when omitted")] = None) -> None:
    """Print the effective configuration (file over defaults) as JSON."""
    cfg = load_config_or_exit(file, exit_code=1)
    typer.echo(json.dumps(effective_config(cfg), indent=2))
