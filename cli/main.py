"""The `gpushare` command: one typer app; each part's commands live in `cli.common`."""

from __future__ import annotations

from typing import Annotated

import typer

from cli import agent, config, deviceplugins, dra, install_check, kmod, metrics, nri, status, uninstall
from cli.doctor import command as doctor
from gpushare import log

app = typer.Typer(no_args_is_help=True, help="gpushare: GPU sharing and over-selling for Kubernetes.")
app.add_typer(nri.app, name="nri")
app.add_typer(deviceplugins.app, name="deviceplugins")
app.command("fake-gpus")(deviceplugins.fake_gpus)
app.add_typer(kmod.app, name="kmod")
app.add_typer(metrics.app, name="metrics")
app.add_typer(config.app, name="config")
app.add_typer(uninstall.app, name="uninstall")
app.command("agent")(agent.agent)
app.command("dra-plugin")(dra.dra_plugin)
app.command("status")(status.status)
app.command("doctor")(doctor.doctor)
app.command("install-check")(install_check.install_check)


@app.callback()
def _root(
    log_level: Annotated[str, typer.Option("--log-level", help="DEBUG, INFO, WARNING or ERROR")] = "INFO",
    log_format: Annotated[str, typer.Option("--log-format", help="text or json")] = "text",
) -> None:
    try:
        log.configure(log_level, log_format)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc


def main() -> None:
    app()


if __name__ == "__main__":
    main()
