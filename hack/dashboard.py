"""gpushare's Grafana dashboard, generated from code with grafana-foundation-sdk.

The JSON is committed twice, byte for byte the same: manifests/grafana/gpushare.json (to import
by hand) and manifests/chart/files/grafana/gpushare.json (the chart ships it in a ConfigMap for
Grafana's dashboard sidecar; helm reads files inside the chart only), made for the default job
name; the chart sets its prometheus.jobLabel in the one job matcher as it renders the ConfigMap.
tests/unit/test_dashboard.py fails when either differs from what this module generates.

    python hack/dashboard.py            # rewrite both files
    python hack/dashboard.py --check    # exit 1 and show the diff if they are stale

Every panel reads the dashboard's ``datasource`` variable (type prometheus) and only series the
agent exports or the shipped recording rules write (docs/observability.md); the e2e tier runs
every query against a real Prometheus (tests/integration/e2e/test_dashboard.py).
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import heatmap, prometheus, stat, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef, DataTransformerConfig, GridPos
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

REPO = Path(__file__).resolve().parents[1]
OUTPUTS = (
    REPO / "manifests" / "grafana" / "gpushare.json",
    REPO / "manifests" / "chart" / "files" / "grafana" / "gpushare.json",
)
UID = "gpushare"
DATASOURCE_VAR = "datasource"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${" + DATASOURCE_VAR + "}")
# The agents' job: the chart's default prometheus.jobLabel. The chart writes the configured job
# into this matcher (its gpushare.withJob), so the JSON is generated for the default only.
AGENT_JOB = "gpushare-agent"
SPOT = "gpushare/spot-gpu"
# Grafana's own interval variables the queries use; a caller outside Grafana puts a window in.
GRAFANA_WINDOWS = ("$__rate_interval", "$__range")


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""
    # "table": one row per series at the dashboard's end time; "heatmap": histogram buckets.
    format: str = "time_series"


@dataclass(frozen=True)
class PanelSpec:
    kind: str  # table, timeseries, stat, heatmap
    title: str
    description: str
    pos: tuple[int, int, int, int]  # x, y, w, h on Grafana's 24-column grid
    queries: tuple[Query, ...]
    unit: str = ""
    # table: label columns in this order; every other column but the values is hidden.
    columns: tuple[str, ...] = ()
    # table with several queries: the value column of each, by refId.
    value_names: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RowSpec:
    title: str
    y: int
    panels: tuple[PanelSpec, ...]


def _t(expr: str) -> Query:
    return Query(expr, format="table")


USER_COLUMNS = ("node", "device_id", "role", "namespace", "pod", "container", "source", "resource")
SHADOW_KEYS = "node, shadow, device_id"

ROWS: tuple[RowSpec, ...] = (
    RowSpec(
        "GPU map: which pod uses which GPU",
        0,
        (
            PanelSpec(
                "table",
                "GPU map: node → GPU → holder and users",
                "One row per container and real GPU it holds or sees (gpushare_gpu_user). role: owner (kubelet "
                "gave it the GPU), shadow (holds it for sharers), sharer (source: its shadow), dind (source: the "
                "container it sees through), borrower (source: the lending owner).",
                (0, 1, 24, 9),
                (_t(f"max by ({', '.join(USER_COLUMNS)}) (gpushare_gpu_user)"),),
                columns=USER_COLUMNS,
            ),
            PanelSpec(
                "timeseries",
                "GPU utilization per pod",
                "From the vendor exporter's device series and the attribution (gpushare:pod_gpu_utilization:percent). "
                "A sharer reads the device's value divided by its shadow's sharers: an estimate, the device cannot "
                "tell sharers apart.",
                (0, 10, 12, 8),
                (Query("gpushare:pod_gpu_utilization:percent", "{{namespace}}/{{pod}} ({{role}})"),),
                unit="percent",
            ),
            PanelSpec(
                "timeseries",
                "GPU memory per pod",
                "gpushare:pod_gpu_memory_used:bytes: the exporter's per-process value where it has one, else the "
                "device's memory divided like utilization.",
                (12, 10, 12, 8),
                (Query("gpushare:pod_gpu_memory_used:bytes", "{{namespace}}/{{pod}} ({{role}})"),),
                unit="bytes",
            ),
        ),
    ),
    RowSpec(
        "Sharing: shadows, sharers, slots",
        18,
        (
            PanelSpec(
                "table",
                "Shadows: slots, used, sharers, free",
                "Each shadow holding a GPU: its N slots, the slots its sharers hold, the sharer containers, and "
                "the slots still free.",
                (0, 19, 12, 8),
                (
                    _t(f"max by ({SHADOW_KEYS}) (gpushare_shadow_slots)"),
                    _t(f"max by ({SHADOW_KEYS}) (gpushare_shadow_slots_used)"),
                    _t(f"max by ({SHADOW_KEYS}) (gpushare_shadow_sharers)"),
                    _t(f"max by ({SHADOW_KEYS}) (gpushare_shadow_slots - gpushare_shadow_slots_used)"),
                ),
                columns=("node", "shadow", "device_id"),
                value_names={"A": "slots", "B": "used", "C": "sharers", "D": "free"},
            ),
            PanelSpec(
                "timeseries",
                "Sharers per shadow",
                "Sharer containers holding slots of each shadow: the divisor of a sharer's share.",
                (12, 19, 6, 8),
                (Query("max by (shadow) (gpushare_shadow_sharers)", "{{shadow}}"),),
            ),
            PanelSpec(
                "stat",
                "Slots free",
                "Slots of running shadows no sharer holds, over all nodes.",
                (18, 19, 6, 4),
                (Query("sum(gpushare_shadow_slots - gpushare_shadow_slots_used)"),),
            ),
            PanelSpec(
                "stat",
                "Shadow and sharer pods by phase",
                "As the Lease holder sees them (it sees every shadow, Pending ones too).",
                (18, 23, 6, 4),
                (
                    Query("max by (phase) (gpushare_shadows)", "shadows {{phase}}"),
                    Query("max by (phase) (gpushare_sharers)", "sharers {{phase}}"),
                ),
            ),
        ),
    ),
    RowSpec(
        "Spot: lending idle GPUs",
        27,
        (
            PanelSpec(
                "timeseries",
                "Spot timeline: lent, borrowed, returned",
                "lent: idle owners' GPUs offered as gpushare/spot-gpu; borrowers: spot containers on them; "
                "returned: owners back, their borrowers killed; killed: borrower pods, by reason.",
                (0, 28, 10, 8),
                (
                    Query(f'sum(gpushare_devices_healthy{{resource="{SPOT}"}})', "lent"),
                    Query('count(gpushare_gpu_user{role="borrower"})', "borrowers"),
                    Query("sum(increase(gpushare_spot_return_seconds_count[$__rate_interval]))", "returned"),
                    Query(
                        "sum by (reason) (increase(gpushare_spot_kills_total[$__rate_interval]))", "killed: {{reason}}"
                    ),
                ),
            ),
            PanelSpec(
                "heatmap",
                "Reclaim latency: owner back → borrowers dead",
                "gpushare_spot_return_seconds: from the owner's return signal to every task of its borrowers dead.",
                (10, 28, 8, 8),
                (
                    Query(
                        "sum by (le) (increase(gpushare_spot_return_seconds_bucket[$__rate_interval]))",
                        "{{le}}",
                        "heatmap",
                    ),
                ),
                unit="s",
            ),
            PanelSpec(
                "stat",
                "Reclaim latency p99",
                "Over the dashboard's time range.",
                (18, 28, 6, 4),
                (
                    Query(
                        "histogram_quantile(0.99, sum by (le) "
                        "(increase(gpushare_spot_return_seconds_bucket[$__range])))"
                    ),
                ),
                unit="s",
            ),
            PanelSpec(
                "stat",
                "Kill bound exceeded, lending blocked",
                "Kills whose tasks outlived the bound (the owner was released anyway), and agents lending nothing "
                "because pod cgroups are not found.",
                (18, 32, 6, 4),
                (
                    Query("sum(gpushare_spot_kill_bound_exceeded_total)", "bound exceeded"),
                    Query("sum(gpushare_spot_lending_blocked)", "blocked"),
                ),
            ),
        ),
    ),
    RowSpec(
        "NRI: what containers were given or refused",
        36,
        (
            PanelSpec(
                "timeseries",
                "NRI decisions per second",
                "CreateContainer decisions: inject (devices given) or refuse. The refusal's reason is in the "
                "agent's log line (decision=refuse reason=...) and the pod's CreateContainerError.",
                (0, 37, 9, 8),
                (
                    Query(
                        "sum by (decision) (rate(gpushare_nri_handler_seconds_count[$__rate_interval]))", "{{decision}}"
                    ),
                ),
                unit="ops",
            ),
            PanelSpec(
                "table",
                "NRI refusals by reason",
                "Containers refused over the dashboard's time range, by reason (docs/nri.md lists each: "
                "malformed, forged, conflict, unconfirmed, not-ready, not-shadow, lend-ended, devices-unknown, mix). "
                "The full message is in the pod's CreateContainerError and the agent's log line.",
                (9, 37, 4, 8),
                (_t("sum by (reason) (increase(gpushare_nri_refusals_total[$__range]))"),),
                columns=("reason",),
                value_names={"A": "refused"},
            ),
            PanelSpec(
                "timeseries",
                "NRI handler latency p99",
                "The CreateContainer handler's latency, by decision.",
                (13, 37, 5, 8),
                (
                    Query(
                        "histogram_quantile(0.99, sum by (le, decision) "
                        "(rate(gpushare_nri_handler_seconds_bucket[$__rate_interval])))",
                        "{{decision}}",
                    ),
                ),
                unit="s",
            ),
            PanelSpec(
                "timeseries",
                "Pods evicted, by reason",
                "Pods the agents deleted (ShadowGone, OwnerBack, ...); each also has a Warning Event.",
                (18, 37, 6, 8),
                (Query("sum by (reason) (increase(gpushare_evictions_total[$__rate_interval]))", "{{reason}}"),),
            ),
        ),
    ),
    RowSpec(
        "Agent health",
        45,
        (
            PanelSpec(
                "stat",
                "Agents up",
                "The agents' scrape targets answering (up), of all of them.",
                (0, 46, 5, 6),
                (
                    Query(f'sum(up{{job="{AGENT_JOB}"}})', "up"),
                    Query(f'count(up{{job="{AGENT_JOB}"}})', "targets"),
                ),
            ),
            PanelSpec(
                "stat",
                "NRI connected, Lease held",
                "Agents whose NRI plugin is registered with containerd, and agents holding the Lease (one).",
                (5, 46, 5, 6),
                (
                    Query("sum(gpushare_nri_connected)", "NRI connected"),
                    Query("sum(gpushare_leader)", "leader"),
                ),
            ),
            PanelSpec(
                "timeseries",
                "Seconds since the last reconcile pass",
                "Over 120 s for 2 minutes fires GpushareAgentStalled.",
                (10, 46, 7, 6),
                (Query("time() - gpushare_reconcile_last_pass_timestamp_seconds", "{{instance}}"),),
                unit="s",
            ),
            PanelSpec(
                "table",
                "Device plugins",
                "Per gpushare device plugin: registered with kubelet, devices advertised and healthy.",
                (17, 46, 7, 9),
                (
                    _t("max by (resource) (gpushare_plugin_registered)"),
                    _t("sum by (resource) (gpushare_devices_advertised)"),
                    _t("sum by (resource) (gpushare_devices_healthy)"),
                ),
                columns=("resource",),
                value_names={"A": "registered", "B": "advertised", "C": "healthy"},
            ),
        ),
    ),
)


def _target(ref: str, q: Query) -> prometheus.Dataquery:
    target = prometheus.Dataquery().expr(q.expr).ref_id(ref)
    if q.legend:
        target = target.legend_format(q.legend)
    if q.format == "table":
        return target.format(PromQueryFormat.TABLE).instant()
    if q.format == "heatmap":
        return target.format(PromQueryFormat.HEATMAP).range()
    return target.range()


def _table_transforms(spec: PanelSpec) -> list[DataTransformerConfig]:
    """Several instant queries become one row per key; label columns in order, the rest hidden."""
    refs = [chr(ord("A") + i) for i in range(len(spec.queries))]
    hidden = {"Time": True, "__name__": True, "instance": True, "job": True}
    if len(refs) == 1:  # a lone query's value shows only when named (the GPU map's 1s say nothing)
        renames = {"Value": spec.value_names.get("A", "value")}
        hidden["Value"] = "A" not in spec.value_names
    else:
        renames = {f"Value #{ref}": spec.value_names.get(ref, ref) for ref in refs}
    order = {name: i for i, name in enumerate([*spec.columns, *renames])}
    out = [DataTransformerConfig(id_val="merge", options={})] if len(refs) > 1 else []
    organize = {"excludeByName": hidden, "indexByName": order, "renameByName": renames}
    out.append(DataTransformerConfig(id_val="organize", options=organize))
    return out


def _panel(spec: PanelSpec, panel_id: int) -> Any:
    x, y, w, h = spec.pos
    builder: Any
    if spec.kind == "table":
        builder = table.Panel()
        for t in _table_transforms(spec):
            builder = builder.with_transformation(t)
    elif spec.kind == "timeseries":
        builder = timeseries.Panel()
    elif spec.kind == "stat":
        builder = stat.Panel()
    elif spec.kind == "heatmap":
        builder = heatmap.Panel()
    else:
        raise ValueError(f"unknown panel kind {spec.kind!r}")
    builder = builder.id(panel_id).title(spec.title).description(spec.description).datasource(DATASOURCE)
    builder = builder.grid_pos(GridPos(h=h, w=w, x=x, y=y))
    if spec.unit:
        builder = builder.unit(spec.unit)
    for i, q in enumerate(spec.queries):
        builder = builder.with_target(_target(chr(ord("A") + i), q))
    return builder


def build() -> dict[str, Any]:
    """The dashboard as Grafana's JSON model (a plain dict)."""
    dash = (
        db.Dashboard("gpushare: who uses which GPU")
        .uid(UID)
        .description("GPU sharing, spot lending and the gpushare agents (docs/observability.md)")
        .tags(["gpushare", "gpu"])
        .refresh("30s")
        .time("now-1h", "now")
        .timezone("browser")
        .with_variable(db.DatasourceVariable(DATASOURCE_VAR).label("Prometheus").type("prometheus"))
    )
    panel_id = 1
    for row in ROWS:
        dash = dash.with_row(db.Row(row.title).id(panel_id).grid_pos(GridPos(h=1, w=24, x=0, y=row.y)))
        panel_id += 1
        for spec in row.panels:
            dash = dash.with_panel(_panel(spec, panel_id))
            panel_id += 1
    doc: dict[str, Any] = json.loads(json.dumps(dash.build(), cls=JSONEncoder))
    return doc


def render() -> str:
    return json.dumps(build(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def panels(doc: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel but the rows, in order."""
    for panel in doc["panels"]:
        if panel["type"] != "row":
            yield panel
        yield from (p for p in panel.get("panels", []) if p["type"] != "row")


def queries(doc: Mapping[str, Any]) -> Iterator[tuple[str, str, str]]:
    """(panel title, refId, expression) for every target of every panel."""
    for panel in panels(doc):
        for target in panel.get("targets", []):
            yield panel["title"], target["refId"], target["expr"]


def runnable(expr: str, window: str) -> str:
    """The expression with Grafana's interval variables set to ``window``, as Prometheus takes it."""
    for name in GRAFANA_WINDOWS:
        expr = expr.replace(name, window)
    return expr


def _stale(text: str) -> list[str]:
    problems: list[str] = []
    for path in OUTPUTS:
        current = path.read_text() if path.is_file() else ""
        if current != text:
            rel = str(path.relative_to(REPO))
            problems.extend(difflib.unified_diff(current.splitlines(True), text.splitlines(True), rel, "generated"))
    return problems


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 with a diff if the files are stale")
    args = p.parse_args(argv)
    text = render()
    if args.check:
        problems = _stale(text)
        sys.stdout.writelines(problems)
        return 1 if problems else 0
    for path in OUTPUTS:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    print(f"wrote {', '.join(str(p.relative_to(REPO)) for p in OUTPUTS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
