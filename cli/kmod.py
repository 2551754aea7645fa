"""`gpushare kmod ...`: build, install, load, unload and watch the gpukmod kernel module (design §7).

Parameters come from flags, else the config file (``maxBlockMs``, ``netlinkProtocol``), else
the design's defaults (3000 ms, unit 31). Every failure prints the ``KmodError`` message,
which says what to do, and exits 1 -- except ``install --best-effort`` (the DaemonSet's init
container): a node that cannot have the module is a normal state there, so it prints one line
saying why and exits 0, and the agent's spot then sees owners return by utilization alone.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, TypeVar

import typer

from cli.common import load_config_or_exit
from gpukmod import KmodClient, KmodError, build_module, install, load, loaded_version, unload
from gpukmod.module import (
    OptionalStep,
    default_kernel_dir,
    default_ko_path,
    format_params,
    ko_version,
    plan_optional_install,
    read_kernel_facts,
    refusal_reason,
    source_version,
)

app = typer.Typer(no_args_is_help=True, help="Build, install, load, unload and watch the gpukmod kernel module.")

T = TypeVar("T")

ConfigOpt = Annotated[Path | None, typer.Option("--config", help="YAML config (maxBlockMs, netlinkProtocol)")]
MaxBlockOpt = Annotated[int | None, typer.Option("--max-block-ms", help="longest hold of a GPU ioctl (ms)")]
UnitOpt = Annotated[int | None, typer.Option("--unit", help="netlink protocol number (default 31)")]
KoOpt = Annotated[Path | None, typer.Option("--ko", help="a built gpukmod.ko (default: the installed one)")]


def _run(step: Callable[[], T]) -> T:
    """Run one step; a KmodError becomes its message on stderr and exit 1."""
    try:
        return step()
    except KmodError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1) from exc


def _params(config: Path | None, max_block_ms: int | None, unit: int | None) -> tuple[str, int]:
    cfg = load_config_or_exit(config, exit_code=1)
    unit = cfg.netlink_protocol if unit is None else unit
    block = cfg.max_block_ms if max_block_ms is None else max_block_ms
    return format_params(max_block_ms=block, unit=unit), unit


@app.command("install")
def install_cmd(  # noqa: PLR0917 - typer maps each parameter to a flag
    kernel_dir: Annotated[
        Path | None, typer.Option("--kernel-dir", help="kernel headers (default /lib/modules/$(uname -r)/build)")
    ] = None,
    ko: Annotated[Path | None, typer.Option("--ko", help="use this built .ko instead of building")] = None,
    out: Annotated[Path | None, typer.Option("--out", help="build dir (default /var/lib/gpushare/kmod/REL)")] = None,
    config: ConfigOpt = None,
    max_block_ms: MaxBlockOpt = None,
    unit: UnitOpt = None,
    best_effort: Annotated[
        bool,
        typer.Option(
            "--best-effort",
            help="where the module cannot be built or loaded (no headers, Secure Boot, no CAP_SYS_MODULE), "
            "print why in one line and exit 0",
        ),
    ] = False,
) -> None:
    """Build against the kernel's headers and load; the same loaded version is left alone, another replaced."""
    params, _ = _params(config, max_block_ms, unit)
    if best_effort:
        _install_best_effort(kernel_dir, ko, out, params)
        return
    if ko is None:
        target = out or default_ko_path().parent
        ko = _run(lambda: build_module(kernel_dir or default_kernel_dir(), target))
    built: Path = ko
    action = _run(lambda: install(built, params))
    typer.echo(f"gpukmod {ko_version(built)}: {action.value} ({built})")


def _install_best_effort(kernel_dir: Path | None, ko: Path | None, out: Path | None, params: str) -> None:
    """``install`` that never fails the node: every reason the module cannot be had is one line, exit 0."""
    kdir = kernel_dir or default_kernel_dir()
    facts = read_kernel_facts(kdir)
    try:
        candidate = ko_version(ko) if ko is not None else source_version()
        step, reason = plan_optional_install(facts, candidate, building=ko is None)
        if step is OptionalStep.KEEP:
            typer.echo(f"gpukmod {candidate}: keep ({reason})")
            return
        if step is OptionalStep.INSTALL:
            built = ko or build_module(kdir, out or default_ko_path().parent)
            action = install(built, params)
            typer.echo(f"gpukmod {candidate}: {action.value} ({built})")
            return
    except KmodError as exc:
        reason = refusal_reason(exc, facts)
    typer.echo(f"gpukmod not installed: {reason}; spot sees owners return by utilization alone")


@app.command("load")
def load_cmd(
    ko: KoOpt = None, config: ConfigOpt = None, max_block_ms: MaxBlockOpt = None, unit: UnitOpt = None
) -> None:
    """Load the module (fails with EEXIST if a version is already loaded; see install)."""
    params, _ = _params(config, max_block_ms, unit)
    path = ko or default_ko_path()
    _run(lambda: load(path, params))
    typer.echo(f"gpukmod {loaded_version()} loaded from {path} ({params})")


@app.command("unload")
def unload_cmd() -> None:
    """Unload the module; refuses while a netlink listener is open (close it first)."""
    before = _run(loaded_version)
    _run(unload)
    typer.echo(f"gpukmod {before} unloaded")


@app.command("status")
def status_cmd() -> None:
    """Show the loaded version, its parameters and the version this package would install."""
    loaded = _run(loaded_version)
    typer.echo(f"loaded: {loaded or 'not loaded'}")
    if loaded:
        params_dir = Path("/sys/module/gpukmod/parameters")
        for item in sorted(params_dir.iterdir()) if params_dir.is_dir() else []:
            typer.echo(f"  {item.name}={item.read_text().strip()}")
    typer.echo(f"package version: {source_version()}")
    installed = default_ko_path()
    typer.echo(f"installed .ko for {os.uname().release}: {installed if installed.exists() else 'none'}")


@app.command("watch")
def watch_cmd(
    ids: Annotated[list[int] | None, typer.Argument(help="pid-namespace inodes to add and detect first")] = None,
    release: Annotated[bool, typer.Option("--release", help="release each notice at once")] = False,
    timeout_s: Annotated[float | None, typer.Option("--timeout-s", help="stop after this long with no notice")] = None,
    unit: UnitOpt = None,
    backend: Annotated[str, typer.Option("--backend", help="auto, native or pyroute2")] = "auto",
) -> None:
    """Register as the listener and print each notice (one pid-namespace inode per line)."""
    client = _run(lambda: KmodClient(unit=31 if unit is None else unit, backend=backend))
    with client:
        _run(client.register)
        if ids:
            _run(lambda: client.watch(*ids))
        for inode in client.notices(timeout_s):
            typer.echo(str(inode))
            if release:
                _release(client, inode)


def _release(client: KmodClient, inode: int) -> None:
    _run(lambda: client.release(inode))
