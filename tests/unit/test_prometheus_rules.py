"""The shipped Prometheus rules and the agent's /metrics, checked by promtool (Debian's, `make prometheus`).

- ``promtool check rules`` and ``promtool test rules`` over manifests/prometheus/;
- every recording rule (per vendor) and every alert has a promtool unit test;
- the chart ships the very same file, and rendered for another ``prometheus.jobLabel`` it passes the
  same unit tests moved to that job;
- ``promtool check metrics`` on a live scrape of the agent's HTTP endpoint (the real
  ``Endpoint`` and registry, with attribution, spot and NRI series in it).

A missing promtool fails these tests (it never skips them): the message names `make prometheus`.
"""

from __future__ import annotations

import http.client
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from controller.core.mapping import MappingCache
from controller.core.model import PodResourcesEntry, build_snapshot
from controller.http_endpoint import Endpoint
from controller.metrics.attribution import attribute, join_label_names
from controller.metrics.exposition import AgentMetrics
from controller.report import TickReport
from controller.spot.counters import SpotCounters
from gpumetrics.model import DeviceMetrics
from gpumetrics.promtext import parse_text
from localcluster import prometheus
from localcluster.errors import ClusterUnavailable
from tests.unit.controller.loop_pods import CFG, pod, shadow
from tests.unit.test_manifests_rendered import _template

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "manifests" / "prometheus" / "gpushare.rules.yaml"
RULE_TESTS = REPO / "manifests" / "prometheus" / "tests" / "gpushare.rules.test.yaml"
CHART_RULES = REPO / "manifests" / "chart" / "files" / "prometheus" / "gpushare.rules.yaml"


def promtool(*args: str, stdin: str | None = None, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    try:
        binary = prometheus.binary("promtool")
    except ClusterUnavailable as exc:
        raise AssertionError(str(exc)) from exc
    return subprocess.run(
        [str(binary), *args], input=stdin, capture_output=True, text=True, timeout=120, check=False, cwd=cwd
    )


def _rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def test_promtool_checks_the_rules() -> None:
    res = promtool("check", "rules", str(RULES))
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in res.stdout


def test_promtool_unit_tests_pass() -> None:
    res = promtool("test", "rules", RULE_TESTS.name, cwd=RULE_TESTS.parent)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout


def test_every_rule_and_alert_has_a_unit_test() -> None:
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    exprs = [t["expr"] for test in tests for t in test.get("promql_expr_test", ())]
    alerted = {t["alertname"] for test in tests for t in test.get("alert_rule_test", ()) if t["exp_alerts"]}
    missing = []
    for rule in _rules():
        if "alert" in rule:
            if rule["alert"] not in alerted:
                missing.append(f"alert {rule['alert']}")
            continue
        vendor = (rule.get("labels") or {}).get("vendor")
        wanted = f'{rule["record"]}{{vendor="{vendor}"}}' if vendor else rule["record"]
        if wanted not in exprs:
            missing.append(f"record {wanted}")
    assert not missing, f"rules without a promtool test in {RULE_TESTS}: {missing}"


def test_the_chart_ships_the_same_rules() -> None:
    assert CHART_RULES.read_text() == RULES.read_text(), (
        f"{CHART_RULES} and {RULES} differ: edit one, copy it over the other"
    )
    rendered = REPO / "manifests" / "60-prometheus-rules.yaml"
    configmap = next(d for d in yaml.safe_load_all(rendered.read_text()) if d and d["kind"] == "ConfigMap")
    assert configmap["data"]["gpushare.rules.yaml"] == RULES.read_text()


def test_the_rules_rendered_for_another_job_pass_the_same_unit_tests(tmp_path: Path) -> None:
    """prometheus.jobLabel as a PodMonitor names its job: the chart's rule file, with the unit tests'
    series and expected alerts moved to that job, passes every promtool test the default passes."""
    job = "gpushare-system/gpushare-agent"
    docs = _template(f"prometheus.jobLabel={job}")
    (configmap,) = [
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "gpushare-prometheus-rules"
    ]
    (tmp_path / "gpushare.rules.yaml").write_text(configmap["data"]["gpushare.rules.yaml"])
    tests = RULE_TESTS.read_text().replace('job="gpushare-agent"', f'job="{job}"')
    tests = tests.replace("job: gpushare-agent\n", f"job: {job}\n").replace(
        "../gpushare.rules.yaml", "gpushare.rules.yaml"
    )
    assert tests.count(job) > 20 and "GpushareAgentsAbsent" in tests
    (tmp_path / "rules.test.yaml").write_text(tests)
    res = promtool("test", "rules", "rules.test.yaml", cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    # And the default file fails them: the tests above do look at the job.
    (tmp_path / "gpushare.rules.yaml").write_text(RULES.read_text())
    res = promtool("test", "rules", "rules.test.yaml", cwd=tmp_path)
    assert res.returncode != 0 and "GpushareAgentsAbsent" in res.stdout + res.stderr


def _live_report() -> TickReport:
    share = {"gpushare/share-gpu-4": "1"}
    pods = [shadow("s", node="n1", phase="Running"), pod("web", node="n1", phase="Running", limits=share)]
    rows = [
        PodResourcesEntry("gpushare-system", "s", "main", "example.com/gpu", ("GPU-1",)),
        PodResourcesEntry("default", "web", "main", "gpushare/share-gpu-4", ("gpushare-system/s-0",)),
    ]
    snap = build_snapshot(pods, CFG, pod_resources=rows)
    found = attribute(snap, MappingCache.rebuild(rows, snap.pods, CFG.real_resources))
    return TickReport(
        at=1796230000.0,
        took_ms=3.0,
        advertised={"gpushare/share-gpu-4": 4},
        evictions_total={"ShadowGone": 1},
        attribution=found,
    )


def test_promtool_checks_a_live_scrape_of_the_agents_endpoint() -> None:
    report = _live_report()
    spot = SpotCounters()
    spot.kills["OwnerBack"] += 1
    spot.observe_return(0.02)
    metrics = AgentMetrics(
        lambda: report,
        nri_connected=lambda: True,
        collectors=[spot],
        node="n1",
        vendor="nvidia",
        devices=lambda: (DeviceMetrics("nvidia", "GPU-1", index=0, uuid="GPU-1"),),
    )
    metrics.observe_nri_decision("refuse", 0.001)
    endpoint = Endpoint("127.0.0.1:0", report=lambda: report, status=dict, metrics=metrics.render)
    endpoint.start()
    try:
        host, port = endpoint.address.rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=5)
        conn.request("GET", "/metrics")
        body = conn.getresponse().read().decode()
        conn.close()
    finally:
        endpoint.close()
    assert "gpushare_gpu_user{" in body and 'UUID="GPU-1"' in body and 'role="sharer"' in body
    res = promtool("check", "metrics", stdin=body)
    assert res.returncode == 0 and not res.stdout.strip() and not res.stderr.strip(), res.stdout + res.stderr


FIXTURES = REPO / "tests" / "fixtures" / "metrics"
_KEYWORDS = {"max", "sum", "by", "on", "group_left", "or", "and"}


def _families_and_joins(expr: str) -> tuple[list[str], list[str]]:
    """The vendor families an expression reads (names or ``__name__`` patterns) and the labels it joins on."""
    patterns = re.findall(r'__name__=~"([^"]+)"', expr)
    joins = [label for group in re.findall(r"\bon \(([^)]*)\)", expr) for label in group.split(",")]
    bare = re.sub(r"\{[^}]*\}", " ", re.sub(r"\b(by|on) \([^)]*\)", " ", expr))
    names = [n for n in re.findall(r"\b[A-Za-z_][A-Za-z0-9_]*\b", bare) if n not in _KEYWORDS]
    return [*patterns, *(n for n in names if not n.startswith("gpushare"))], [j.strip() for j in joins]


def test_the_rules_name_the_families_and_labels_of_the_vendors_exporter_pages() -> None:
    """Each vendor's rules read families, and join on labels, that the sample exporter page of that vendor has."""
    for rule in _rules():
        vendor = (rule.get("labels") or {}).get("vendor")
        if vendor is None:
            continue
        pages = [parse_text(p.read_text()) for p in sorted(FIXTURES.glob(f"{vendor}*.prom"))]
        assert pages, f"no sample page tests/fixtures/metrics/{vendor}*.prom for the {vendor} rules"
        names = {s.name for page in pages for s in page.samples}
        labels = {label for page in pages for s in page.samples for label in s.labels}
        families, joins = _families_and_joins(rule["expr"])
        for family in families:
            assert any(re.fullmatch(family, n) for n in names), f"{rule['record']} ({vendor}): no {family} on the page"
        for join in set(joins) - {"namespace", "pod"}:
            if join != "device_id" or vendor == "hygon":
                assert join in labels, f"{rule['record']} ({vendor}): the page has no label {join}"
        assert set(joins) >= set(join_label_names(vendor)[:1]) or vendor == "hygon", rule["expr"]
