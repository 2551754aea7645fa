"""`gpushare metrics ...`: read vendor exporter output into the common per-device model.

    gpushare metrics parse FILE... [--vendor NAME] [--prefix P] [-o json|table]
    gpushare metrics scrape URL... [--vendor NAME] [--prefix P] [--timeout 2s] [-o json|table]
    gpushare metrics vendors

JSON is a list of objects with the keys ``vendor index device_id uuid utilization_pct
memory_used_bytes memory_total_bytes power_w pods`` (pods: ``{namespace, pod, container}``),
unknowns as ``null``. Skipped lines and warnings go to stderr. Exit status: 0; 1 when a
source could not be read, the vendor is unknown, or a source gave no device (nothing
recognised, or a vendor without a known exporter) -- stdout still lists what was found.
"""

from __future__ import annotations

import json
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from gpumetrics import AUTO, DeviceMetrics, ParseResult, adapter_names, get_adapter, parse_metrics
from gpumetrics.errors import MetricsError
from gpumetrics.scrape import read_source
from gpushare.config import parse_duration_s

app = typer.Typer(no_args_is_help=True, help="Read GPU exporter metrics into the common per-device model.")


class Output(StrEnum):
    JSON = "json"
    TABLE = "table"


VendorOpt = Annotated[
    str, typer.Option("--vendor", help=f"auto (detect from metric names) or one of: {', '.join(adapter_names())}")
]
PrefixOpt = Annotated[
    str | None, typer.Option("--prefix", help="metric-name prefix for exporters that take one (amd, cambricon)")
]
OutputOpt = Annotated[Output, typer.Option("-o", "--output", help="json or table")]


def _fail(message: str) -> typer.Exit:
    typer.echo(message, err=True)
    return typer.Exit(1)


def _report(source: str, result: ParseResult) -> bool:
    """Say on stderr what was skipped; True when this source gave a usable answer."""
    if result.bad_lines:
        typer.echo(f"{source}: {result.bad_lines} bad line(s) skipped", err=True)
        for example in result.bad_line_examples:
            typer.echo(f"  {example}", err=True)
    if result.unattributed_samples:
        typer.echo(f"{source}: {result.unattributed_samples} sample(s) name no device and were ignored", err=True)
    for warning in result.warnings:
        typer.echo(f"{source}: {warning}", err=True)
    return bool(result.devices)


def _size(value: int | None) -> str:
    if value is None:
        return "-"
    if value >= 1 << 30:
        return f"{value / (1 << 30):.1f}GiB"
    return f"{value / (1 << 20):.0f}MiB"


def _num(value: float | int | None) -> str:
    return "-" if value is None else f"{value:g}"


def _table(devices: list[DeviceMetrics]) -> str:
    header = ("VENDOR", "IDX", "DEVICE_ID", "UTIL%", "MEM_USED", "MEM_TOTAL", "POWER_W", "PODS")
    rows = [header]
    for d in devices:
        pods = ",".join(f"{w.namespace}/{w.pod}" + (f"/{w.container}" if w.container else "") for w in d.workloads)
        rows.append(
            (
                d.vendor,
                _num(d.index),
                d.device_id,
                _num(d.utilization_pct),
                _size(d.memory_used_bytes),
                _size(d.memory_total_bytes),
                _num(d.power_watts),
                pods or "-",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows)


def _run(sources: list[str], vendor: str, prefix: str | None, output: Output, timeout_s: float) -> None:
    try:
        if vendor != AUTO:
            get_adapter(vendor, prefix=prefix)  # unknown vendor or a prefix it cannot take: say so first
        devices: list[DeviceMetrics] = []
        complete = True
        for source in sources:
            text = sys.stdin.read() if source == "-" else read_source(source, timeout_s)
            result = parse_metrics(text, vendor=vendor, prefix=prefix)
            complete = _report(source, result) and complete
            devices.extend(result.devices)
    except MetricsError as exc:
        raise _fail(str(exc)) from exc
    if output is Output.JSON:
        typer.echo(json.dumps([d.to_json() for d in devices], indent=2))
    else:
        typer.echo(_table(devices))
    if not complete:
        raise typer.Exit(1)


@app.command("parse")
def parse(
    files: Annotated[list[str], typer.Argument(help="exporter output files ('-' reads stdin)")],
    vendor: VendorOpt = AUTO,
    prefix: PrefixOpt = None,
    output: OutputOpt = Output.JSON,
) -> None:
    """Parse saved exporter output (Prometheus text) and print one record per device."""
    for name in files:
        if name != "-" and not Path(name).is_file():
            raise _fail(f"gpushare: {name}: no such file")
    _run(files, vendor, prefix, output, timeout_s=1.0)


@app.command("scrape")
def scrape(
    urls: Annotated[list[str], typer.Argument(help="exporter URLs, e.g. http://127.0.0.1:9400/metrics")],
    vendor: VendorOpt = AUTO,
    prefix: PrefixOpt = None,
    timeout: Annotated[str, typer.Option("--timeout", help="per-URL deadline, e.g. 2s or 500ms")] = "2s",
    output: OutputOpt = Output.JSON,
) -> None:
    """Scrape live exporters and print one record per device."""
    try:
        timeout_s = parse_duration_s(timeout)
    except ValueError as exc:
        raise _fail(f"gpushare: --timeout {timeout!r}: {exc}") from exc
    _run(urls, vendor, prefix, output, timeout_s)


@app.command("vendors")
def vendors() -> None:
    """List the vendor adapters, their exporters, and which take a metric prefix."""
    for name in adapter_names():
        adapter = get_adapter(name)
        flags = [] if adapter.has_exporter else ["no known exporter"]
        if adapter.prefixable:
            flags.append("--prefix")
        extra = f"  [{', '.join(flags)}]" if flags else ""
        typer.echo(f"{name:<10} {adapter.exporter}{extra}")
