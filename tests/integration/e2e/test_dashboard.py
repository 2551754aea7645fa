"""Every query of the shipped Grafana dashboard (hack/dashboard.py) runs against the e2e's real Prometheus,
which scrapes the agent's pod and the fake dcgm-exporter with the shipped rules: none errs and each
returns series. The dashboard is the one the chart installed, whose job matcher is the e2e's
``prometheus.jobLabel``, the job Prometheus scrapes the agent under.

Several panels only have series after an event, so the test makes each happen first:

- sharers on a shadow (shadow slots, sharers) and an owner (the GPU map, per-pod utilization);
- a lent GPU and a borrower on it (the spot timeline's "lent" and "borrowers");
- a container the NRI plugin refuses (a cross-pod instruction): ``decision="refuse"`` above 0;
- the owner back on its GPU (its processes in the exporter's page): the borrower is killed and
  deleted, so ``gpushare_spot_kills_total{reason}``, ``gpushare_evictions_total{reason}`` and an
  observation in ``gpushare_spot_return_seconds`` exist.

The gauges of the borrower are gone after the return, so each query is evaluated at two instants:
once the whole scene stands, and after the return; it must answer at both and have series at one.
With ``GPUSHARE_DASHBOARD_DATA=<file>`` the test also saves every panel's data there, which
``hack/dashboard_screenshot.py --data <file>`` draws (docs/img/dashboard.png).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
import time
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

from gpushare import keys
from localcluster.agent import FAKE_RESOURCE
from localcluster.pods import pod_manifest, sharer
from localcluster.prometheus import AGENT_JOB, PrometheusServer
from tests.integration.e2e.conftest import FAKE_GPU_IDS, Env
from tests.integration.e2e.test_prometheus import _dcgm

REPO = Path(__file__).resolve().parents[3]


@cache
def _module(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"gpushare_{name}", REPO / "hack" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _waiting_reason(e: Env, pod: str) -> str:
    (item,) = [p for p in e.pods("default") if p["metadata"]["name"] == pod]
    for status in (item.get("status") or {}).get("containerStatuses") or []:
        reason = ((status.get("state") or {}).get("waiting") or {}).get("reason")
        if reason:
            return str(reason)
    return ""


def _has(prometheus: PrometheusServer, expr: str) -> bool:
    return any(not math.isnan(s.value) and s.value > 0 for s in prometheus.query(expr))


def _scene(e: Env, prometheus: PrometheusServer) -> tuple[str, str]:
    """Two sharers on a shadow at 80 %, a lendable owner of the other GPU lending it to a borrower, and a
    container NRI refused; returns (the shadow's GPU, the lent GPU) once Prometheus has it all."""
    e.exporter.text = _dcgm({}, {})  # every GPU idle: the lendable owner's is lent after the idle window
    owner = pod_manifest("dash-owner", resources={FAKE_RESOURCE: "1"}, labels={keys.LABEL_LENDABLE: "true"})
    e.start_pods([sharer("dash-s-0"), sharer("dash-s-1"), owner])
    e.wait("2 sharers recorded", lambda: sum(len(s["users"]) for s in e.agent.status()["shadows"]) == 2, 30)
    (shadow,) = e.agent.status()["shadows"]
    (shadow_gpu,) = shadow["gpu"]
    (lent,) = [g for g in FAKE_GPU_IDS if g != shadow_gpu]
    e.exporter.text = _dcgm({shadow_gpu: 80.0}, {shadow_gpu: 4096})
    e.wait("the owner's GPU lent", lambda: e.allocatable().get(keys.RESOURCE_SPOT_GPU) == "1", 60)
    e.start_pods([pod_manifest("dash-borrower", resources={keys.RESOURCE_SPOT_GPU: "1"})])
    # The borrower's processes use the lent GPU: the owner is not back.
    page = _dcgm({shadow_gpu: 80.0, lent: 30.0}, {shadow_gpu: 4096, lent: 1000}, {lent: ("default/dash-borrower",)})
    e.exporter.text = page
    # Prometheus must hold a sample of the refusal count from before the refusal, or increase()
    # over the panel's range has nothing to rise from (earlier tests of the tier may have refused).
    refused = 'sum(gpushare_nri_handler_seconds_count{decision="refuse"})'
    prometheus.wait("the agent's refusal count in Prometheus", lambda: bool(prometheus.query(refused)), 60)
    before = prometheus.query(refused)[0].value
    stolen = {keys.POD_ANNOTATION_DEVICES_FROM_PREFIX + "app": "default/dash-s-0/app"}
    e.apply(pod_manifest("dash-thief", annotations=stolen))
    e.wait("dash-thief refused", lambda: _waiting_reason(e, "dash-thief") == "CreateContainerError", 60)
    prometheus.wait(
        "the borrower, the refusal and per-pod utilization in Prometheus",
        lambda: (
            _has(prometheus, 'gpushare_gpu_user{role="borrower"}')
            and any(s.value > before for s in prometheus.query(refused))
            and _has(prometheus, 'gpushare:pod_gpu_utilization:percent{role="borrower"}')
        ),
        90,
    )
    return shadow_gpu, lent


def _owner_back(e: Env, prometheus: PrometheusServer, shadow_gpu: str, lent: str) -> None:
    """The borrower goes quiet, then the owner's processes use its GPU again: the GPU turning busy is the
    return signal (no gpukmod here), so the borrower is killed and deleted (OwnerBack) and the return timed."""
    e.exporter.text = _dcgm({shadow_gpu: 80.0}, {shadow_gpu: 4096})
    # The agent must read the lent GPU idle once, or the owner's use would not be a turn to busy.
    prometheus.wait(
        "the quiet page scraped", lambda: _is_zero(prometheus, f'DCGM_FI_DEV_GPU_UTIL{{UUID="{lent}"}}'), 60
    )
    time.sleep(3.0)  # a few of the agent's 1 s scrapes of the same page
    users = {lent: ("default/dash-owner",)}
    e.exporter.text = _dcgm({shadow_gpu: 80.0, lent: 60.0}, {shadow_gpu: 4096, lent: 2000}, users)
    e.wait("the borrower deleted", lambda: all(p["metadata"]["name"] != "dash-borrower" for p in e.pods("default")), 90)
    events = ("gpushare_spot_return_seconds_count", "gpushare_spot_kills_total", "gpushare_evictions_total")

    def missing() -> list[str]:
        return [name for name in events if not _has(prometheus, name)]

    try:
        prometheus.wait("the return, the kill and the eviction in Prometheus", lambda: not missing(), 60)
    except AssertionError as exc:
        spot = e.agent.status().get("spot_runtime")
        raise AssertionError(f"{exc}: no series yet of {missing()}; the agent's spot runtime: {spot}") from None


def _is_zero(prometheus: PrometheusServer, expr: str) -> bool:
    samples = prometheus.query(expr)
    return bool(samples) and all(s.value == 0.0 for s in samples)


def _instant(prometheus: PrometheusServer, expr: str, at: float) -> list[dict[str, Any]]:
    data = prometheus.api("query", query=expr, time=f"{at:.3f}")
    if data["resultType"] == "scalar":
        return [{"metric": {}, "value": data["result"]}]
    result: list[dict[str, Any]] = data["result"]
    return result


def test_every_dashboard_query_answers_with_series(e2e: Env, prometheus: PrometheusServer) -> None:
    dash = _module("dashboard")
    start = time.time()
    shadow_gpu, lent = _scene(e2e, prometheus)
    scene_at = time.time()
    _owner_back(e2e, prometheus, shadow_gpu, lent)
    end = time.time() + 2.0
    time.sleep(2.0)
    window = f"{math.ceil(end - start) + 30}s"  # Grafana's $__range and $__rate_interval: the whole test

    doc = json.loads(e2e.chart_file("70-dashboard.yaml", "gpushare-grafana-dashboard", "gpushare.json"))
    assert f'up{{job="{AGENT_JOB}"}}' in " ".join(expr for _, _, expr in dash.queries(doc))
    empty: list[str] = []
    answers: dict[str, dict[str, Any]] = {}
    for title, ref, expr in dash.queries(doc):
        runnable = dash.runnable(expr, window)
        at_scene = _instant(prometheus, runnable, scene_at)  # an error raises, naming the query
        after = _instant(prometheus, runnable, end)
        answers[f"{title}/{ref}"] = {"scene": at_scene, "after": after}
        if not at_scene and not after:
            empty.append(f"{title} {ref}: {runnable}")
    assert not empty, "queries without series:\n" + "\n".join(empty)

    # The panels say what happened: every role of the scene on the map, the refusal, the return.
    roles = {r["metric"]["role"] for r in answers["GPU map: node → GPU → holder and users/A"]["scene"]}
    assert {"owner", "shadow", "sharer", "borrower"} <= roles, roles
    refused = {r["metric"]["reason"]: float(r["value"][1]) for r in answers["NRI refusals by reason/A"]["after"]}
    assert sum(refused.values()) >= 1.0, refused  # dash-thief's refusal, under its reason word
    kills = {r["metric"]["reason"] for r in answers["Spot timeline: lent, borrowed, returned/D"]["after"]}
    assert kills, "no kill reason"
    (free,) = answers["Slots free/A"]["scene"]
    assert float(free["value"][1]) == 2.0  # one share-gpu-4 shadow, two sharers

    out = os.environ.get("GPUSHARE_DASHBOARD_DATA")
    if out:
        shot = _module("dashboard_screenshot")
        Path(out).write_text(json.dumps(shot.collect(prometheus.url, doc, start, scene_at, end), indent=1))
