"""A picture of gpushare's Grafana dashboard drawn from a real Prometheus's answers to its own queries.

No Grafana runs here: each panel of hack/dashboard.py is drawn on a static HTML page (inline SVG
and CSS) from the results of that panel's queries, in the dashboard's grid, and headless Chromium
takes the screenshot. Range panels (time series, heatmap) read ``query_range`` over
[start, end]; tables read the instant ``at`` (the scene at its fullest); stats the instant ``end``.

    # against a running Prometheus that scrapes gpushare's agents with the shipped rules
    python hack/dashboard_screenshot.py --prometheus http://127.0.0.1:9090 --minutes 15 --out docs/img/dashboard.png
    # from the data the e2e test saved (GPUSHARE_DASHBOARD_DATA=file, tests/integration/e2e/test_dashboard.py)
    python hack/dashboard_screenshot.py --data /tmp/dashboard-data.json --out docs/img/dashboard.png

Chromium: Debian's ``chromium`` package (``apt-get install chromium``), or --chromium PATH.
"""

from __future__ import annotations

import argparse
import html
import importlib.util
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[1]
COL_PX = 60  # one of Grafana's 24 grid columns
ROW_PX = 32  # one grid row
WIDTH_PX = 24 * COL_PX
RATE_WINDOW = "10s"
PALETTE = ("#73bf69", "#f2cc0c", "#8ab8ff", "#ff780a", "#f2495c", "#5794f2", "#b877d9", "#fade2a", "#37872d")


def _dashboard_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpushare_dashboard", REPO / "hack" / "dashboard.py")
    assert spec is not None and spec.loader is not None
    module = sys.modules.get(spec.name) or importlib.util.module_from_spec(spec)
    if spec.name not in sys.modules:
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return module


def _api(url: str, path: str, **params: str) -> Any:
    with urllib.request.urlopen(f"{url}/api/v1/{path}?{urllib.parse.urlencode(params)}", timeout=30) as resp:
        doc = json.loads(resp.read())
    if doc.get("status") != "success":
        raise RuntimeError(f"prometheus {path} {params}: {doc}")
    return doc["data"]


def collect(url: str, doc: Mapping[str, Any], start: float, at: float, end: float) -> dict[str, Any]:
    """Every panel's query results, keyed by panel id then refId, as the page draws them."""
    dash = _dashboard_module()
    window = f"{math.ceil(end - start) + 30}s"
    step = max(1.0, (end - start) / 240)
    panels: dict[str, dict[str, Any]] = {}
    for panel in dash.panels(doc):
        results: dict[str, Any] = {}
        for target in panel["targets"]:
            # $__rate_interval as Grafana sets it for a 1 s scrape and a short range; $__range: all of it.
            expr = dash.runnable(target["expr"].replace("$__rate_interval", RATE_WINDOW), window)
            if panel["type"] in ("timeseries", "heatmap"):
                data = _api(url, "query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step=f"{step}")
            else:
                data = _api(url, "query", query=expr, time=f"{at if panel['type'] == 'table' else end:.3f}")
            results[target["refId"]] = data
        panels[str(panel["id"])] = results
    return {"start": start, "at": at, "end": end, "dashboard": doc, "panels": panels}


def _fmt(value: float, unit: str) -> str:
    if math.isnan(value):
        return "-"
    if unit == "bytes":
        for div, suffix in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
            if abs(value) >= div:
                return f"{value / div:.1f} {suffix}"
        return f"{value:.0f} B"
    if unit == "percent":
        return f"{value:.0f} %"
    if unit == "s":
        return f"{value * 1000:.1f} ms" if abs(value) < 1 else f"{value:.2f} s"
    if unit == "ops":
        return f"{value:.2f}/s"
    return f"{value:.0f}" if value == int(value) else f"{value:.2f}"


def _legend(fmt: str, metric: Mapping[str, str]) -> str:
    out = fmt or "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(metric.items()) if k != "__name__") + "}"
    for key, value in metric.items():
        out = out.replace("{{" + key + "}}", value)
    return out


def _series(panel: Mapping[str, Any], results: Mapping[str, Any]) -> list[tuple[str, list[tuple[float, float]]]]:
    out: list[tuple[str, list[tuple[float, float]]]] = []
    for target in panel["targets"]:
        for r in results[target["refId"]]["result"]:
            points = [(float(t), float(v)) for t, v in r.get("values", [])]
            out.append((_legend(target.get("legendFormat", ""), r["metric"]), points))
    return out


def _timeseries(panel: Mapping[str, Any], results: Mapping[str, Any], w: int, h: int, span: tuple[float, float]) -> str:
    unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
    series = _series(panel, results)
    values = [v for _, pts in series for _, v in pts if not math.isnan(v)]
    top = max([*values, 0.0]) * 1.1 or 1.0
    legend_rows = min(3, (len(series) + 2) // 3)
    left, right, chart_h = 64, w - 8, h - 28 - 36 - 16 * legend_rows
    t0, t1 = span

    def xy(t: float, v: float) -> str:
        return f"{left + (t - t0) / (t1 - t0) * (right - left):.1f},{8 + chart_h - v / top * chart_h:.1f}"

    parts = [f'<svg width="{w}" height="{h - 28}">']
    for i in range(5):
        v = top * i / 4
        y = 8 + chart_h - v / top * chart_h
        parts.append(f'<line x1="{left}" x2="{right}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" class="axis" text-anchor="end">{_fmt(v, unit)}</text>')
    for i in range(5):
        t = t0 + (t1 - t0) * i / 4
        x = left + (right - left) * i / 4
        label = time.strftime("%H:%M:%S", time.gmtime(t))
        parts.append(f'<text x="{x:.1f}" y="{chart_h + 24}" class="axis" text-anchor="middle">{label}</text>')
    for i, (name, pts) in enumerate(series):
        color = PALETTE[i % len(PALETTE)]
        line = " ".join(xy(t, v) for t, v in pts if not math.isnan(v))
        parts.append(f'<polyline points="{line}" fill="none" stroke="{color}" stroke-width="2"/>')
        if i >= 3 * legend_rows:
            continue
        lx, ly = 8 + (i % 3) * (w // 3), chart_h + 46 + (i // 3) * 16
        parts.append(f'<rect x="{lx}" y="{ly - 9}" width="12" height="4" fill="{color}"/>')
        parts.append(f'<text x="{lx + 18}" y="{ly - 4}" class="legend">{html.escape(name[:48])}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _heatmap(panel: Mapping[str, Any], results: Mapping[str, Any], w: int, h: int, span: tuple[float, float]) -> str:
    """Buckets' increases per step: bucket upper bounds up the side, time across, colour by count."""
    rows: dict[float, list[tuple[float, float]]] = {}
    for r in results["A"]["result"]:
        rows[float(r["metric"]["le"])] = [(float(t), float(v)) for t, v in r["values"]]
    bounds = sorted(rows)
    counts: dict[float, list[tuple[float, float]]] = {}
    for i, le in enumerate(bounds):  # cumulative buckets -> counts per bucket
        below = dict(rows[bounds[i - 1]]) if i else {}
        counts[le] = [(t, max(0.0, v - below.get(t, 0.0))) for t, v in rows[le]]
    peak = max([v for pts in counts.values() for _, v in pts] + [1e-9])
    left, chart_h = 64, h - 64
    cell_h = chart_h / max(1, len(bounds))
    t0, t1 = span
    parts = [f'<svg width="{w}" height="{h - 28}">']
    for i, le in enumerate(bounds):
        y = 8 + chart_h - (i + 1) * cell_h
        label = "+Inf" if math.isinf(le) else _fmt(le, "s")
        parts.append(f'<text x="{left - 6}" y="{y + cell_h / 2 + 4:.1f}" class="axis" text-anchor="end">{label}</text>')
        pts = counts[le]
        cw = (w - left - 8) / max(1, len(pts))
        for j, (t, v) in enumerate(pts):
            if v <= 0:
                continue
            x = left + (t - t0) / (t1 - t0) * (w - left - 8)
            alpha = 0.25 + 0.75 * v / peak
            rect = f'x="{x:.1f}" y="{y:.1f}" width="{max(cw, 3):.1f}" height="{cell_h - 1:.1f}"'
            parts.append(f'<rect {rect} fill="#ff780a" fill-opacity="{alpha:.2f}"/>')
            del j
    parts.append(f'<text x="{left}" y="{chart_h + 26}" class="legend">upper bound of the latency bucket;')
    parts.append(" colour: returns that took that long</text></svg>")
    return "".join(parts)


def _stat(panel: Mapping[str, Any], results: Mapping[str, Any]) -> str:
    unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
    cells: list[str] = []
    for i, target in enumerate(panel["targets"]):
        for r in results[target["refId"]]["result"]:
            value = float(r["value"][1])
            name = _legend(target.get("legendFormat", ""), r["metric"]) if target.get("legendFormat") else ""
            color = PALETTE[i % len(PALETTE)]
            cells.append(
                f'<div class="stat"><div class="big" style="color:{color}">{_fmt(value, unit)}</div>'
                f'<div class="small">{html.escape(name)}</div></div>'
            )
    return '<div class="stats">' + "".join(cells) + "</div>"


def _table(panel: Mapping[str, Any], results: Mapping[str, Any]) -> str:
    """The organize transformation's columns, one row per label set (queries merged on their labels)."""
    organize = next(t["options"] for t in panel.get("transformations", []) if t["id"] == "organize")
    order = sorted(organize["indexByName"], key=lambda k: organize["indexByName"][k])
    renames: Mapping[str, str] = organize["renameByName"]
    hidden = {k for k, v in organize["excludeByName"].items() if v}
    columns = [renames.get(c, c) for c in order if c not in hidden]
    label_cols = [c for c in order if c not in renames]
    rows: dict[tuple[str, ...], dict[str, str]] = {}
    for target in panel["targets"]:
        ref = target["refId"]
        value_col = renames.get("Value" if len(panel["targets"]) == 1 else f"Value #{ref}", "")
        for r in results[ref]["result"]:
            key = tuple(r["metric"].get(c, "") for c in label_cols)
            row = rows.setdefault(key, dict(zip(label_cols, key, strict=True)))
            if value_col:
                row[value_col] = _fmt(float(r["value"][1]), "")
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(rows[k].get(c, ''))}</td>" for c in columns) + "</tr>" for k in sorted(rows)
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


STYLE = """
body { margin: 0; background: #111217; color: #ccccdc; font: 13px Inter, 'DejaVu Sans', sans-serif; }
header { padding: 10px 14px; font-size: 17px; color: #fff; border-bottom: 1px solid #2c2e33; }
header span { color: #8e8e8e; font-size: 12px; margin-left: 14px; }
.grid-area { position: relative; margin: 6px; }
.panel { position: absolute; box-sizing: border-box; background: #181b1f; border: 1px solid #2c2e33;
  border-radius: 2px; overflow: hidden; }
.panel h3 { margin: 0; padding: 6px 8px; font-size: 13px; font-weight: 500; color: #fff; }
.row { position: absolute; color: #fff; font-size: 15px; font-weight: 500; padding-top: 6px; }
svg .grid { stroke: #2c2e33; } svg .axis { fill: #8e8e8e; font-size: 11px; }
svg .legend { fill: #ccccdc; font-size: 11px; }
table { border-collapse: collapse; width: 100%; font-size: 12px; }
th { text-align: left; color: #6e9fff; font-weight: 500; padding: 4px 8px; border-bottom: 1px solid #2c2e33; }
td { padding: 3px 8px; border-bottom: 1px solid #22252b; white-space: nowrap; }
.stats { display: flex; flex-wrap: wrap; height: calc(100% - 30px); align-items: center;
  justify-content: space-around; }
.stat { text-align: center; padding: 2px 6px; } .big { font-size: 30px; font-weight: 500; }
.small { font-size: 11px; color: #8e8e8e; }
"""


def page(data: Mapping[str, Any]) -> tuple[str, int]:
    """The static page: every row and panel at its grid position, drawn from ``data`` (``collect``)."""
    doc = data["dashboard"]
    span = (float(data["start"]), float(data["end"]))
    parts: list[str] = []
    bottom = 0
    for panel in doc["panels"]:
        g = panel["gridPos"]
        x, y, w, h = g["x"] * COL_PX, g["y"] * ROW_PX, g["w"] * COL_PX - 6, g["h"] * ROW_PX - 6
        bottom = max(bottom, y + h)
        if panel["type"] == "row":
            parts.append(f'<div class="row" style="left:{x}px;top:{y}px">{html.escape(panel["title"])}</div>')
            continue
        results = data["panels"][str(panel["id"])]
        if panel["type"] == "timeseries":
            body = _timeseries(panel, results, w, h, span)
        elif panel["type"] == "heatmap":
            body = _heatmap(panel, results, w, h, span)
        elif panel["type"] == "stat":
            body = _stat(panel, results)
        else:
            body = _table(panel, results)
        style = f"left:{x}px;top:{y}px;width:{w}px;height:{h}px"
        parts.append(f'<div class="panel" style="{style}"><h3>{html.escape(panel["title"])}</h3>{body}</div>')
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(span[1]))
    title = html.escape(doc["title"])
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><style>{STYLE}</style></head><body>"
        f"<header>{title}<span>data: the e2e's Prometheus, to {when}</span></header>"
        f'<div class="grid-area" style="height:{bottom + 8}px;width:{WIDTH_PX}px">{"".join(parts)}</div>'
        "</body></html>"
    ), bottom + 60


def screenshot(html_text: str, height: int, out: Path, chromium: str) -> None:
    with tempfile.TemporaryDirectory(prefix="gs-dashboard-") as tmp:
        src = Path(tmp) / "dashboard.html"
        src.write_text(html_text)
        argv = [
            chromium,
            "--headless",
            "--no-sandbox",  # root in a container: Chromium's sandbox needs user namespaces
            "--disable-gpu",
            "--hide-scrollbars",
            f"--user-data-dir={tmp}/profile",
            f"--window-size={WIDTH_PX + 12},{height}",
            f"--screenshot={out.resolve()}",
            src.as_uri(),
        ]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=180, check=False)
        if proc.returncode != 0 or not out.is_file():
            raise RuntimeError(f"chromium exited {proc.returncode}:\n{proc.stderr[-3000:]}")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prometheus", help="a Prometheus URL that scrapes the agents with the shipped rules")
    src.add_argument("--data", type=Path, help="panel data saved by the e2e test (GPUSHARE_DASHBOARD_DATA)")
    p.add_argument("--minutes", type=float, default=15.0, help="with --prometheus: the time range drawn")
    p.add_argument("--out", type=Path, default=REPO / "docs" / "img" / "dashboard.png")
    p.add_argument("--html", type=Path, help="also keep the page here")
    p.add_argument("--chromium", default=shutil.which("chromium") or shutil.which("chromium-browser") or "")
    args = p.parse_args(argv)
    if not args.chromium:
        print("no chromium: apt-get install chromium, or pass --chromium PATH", file=sys.stderr)
        return 2
    if args.data:
        data = json.loads(args.data.read_text())
    else:
        end = time.time()
        data = collect(args.prometheus.rstrip("/"), _dashboard_module().build(), end - args.minutes * 60, end, end)
    text, height = page(data)
    if args.html:
        args.html.write_text(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    screenshot(text, height, args.out, args.chromium)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
