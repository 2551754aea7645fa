"""How the chart lets Prometheus find the agents: the headless Service, the optional ServiceMonitor and
PodMonitor, the job label as a value (the rules and the dashboard follow it), and TLS on /metrics.

No prometheus-operator runs here, so the two monitors are checked by shape: every field they use is
one that monitoring.coreos.com/v1 defines for that place (the field names below are read from the
operator's Go types, pkg/apis/monitoring/v1: ServiceMonitorSpec, Endpoint, PodMonitorSpec,
PodMetricsEndpoint, SafeAuthorization, SafeTLSConfig, RelabelConfig), and each selector selects what
it must in the very objects the chart renders. Rendered with the helm binary `make helm` builds.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml

from gpushare.config import load_config
from tests.unit.test_chart_values import _agent, _refused
from tests.unit.test_manifests_rendered import _one, _pod_spec, _template

JOB = "gpushare-system/gpushare-agent"  # a PodMonitor's own "<namespace>/<name>" style

# monitoring.coreos.com/v1, the fields this chart may write (a subset of each type's).
SERVICE_MONITOR_SPEC = {"jobLabel", "targetLabels", "podTargetLabels", "endpoints", "selector", "namespaceSelector"}
POD_MONITOR_SPEC = {"jobLabel", "podTargetLabels", "podMetricsEndpoints", "selector", "namespaceSelector"}
_ENDPOINT_COMMON = {
    "port", "path", "scheme", "params", "interval", "scrapeTimeout", "honorLabels", "honorTimestamps",
    "metricRelabelings", "relabelings", "authorization", "basicAuth", "oauth2", "tlsConfig", "followRedirects",
}  # fmt: skip
# Endpoint (a ServiceMonitor's) alone keeps the deprecated bearerTokenFile; a PodMonitor's endpoint has none.
SERVICE_MONITOR_ENDPOINT = _ENDPOINT_COMMON | {"targetPort", "bearerTokenFile"}
POD_METRICS_ENDPOINT = _ENDPOINT_COMMON | {"portNumber", "targetPort"}
SAFE_AUTHORIZATION = {"type", "credentials"}
SAFE_TLS_CONFIG = {"ca", "cert", "keySecret", "serverName", "insecureSkipVerify", "minVersion", "maxVersion"}
RELABEL_CONFIG = {"sourceLabels", "separator", "targetLabel", "regex", "modulus", "replacement", "action"}
RELABEL_ACTIONS = {"replace", "keep", "drop", "hashmod", "labelmap", "labeldrop", "labelkeep", "lowercase", "uppercase"}


def _kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def _ns(docs: list[dict[str, Any]]) -> str:
    """The chart's namespace, where the agents run: every namespaced object of it belongs there."""
    return str(_kind(docs, "DaemonSet")[0]["metadata"]["namespace"])


def _monitor(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (doc,) = _kind(docs, kind)
    return doc


def _endpoint(doc: dict[str, Any]) -> dict[str, Any]:
    key = "endpoints" if doc["kind"] == "ServiceMonitor" else "podMetricsEndpoints"
    (endpoint,) = doc["spec"][key]
    return dict(endpoint)


def _matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A metav1.LabelSelector (matchLabels, matchExpressions with In) against an object's labels."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        assert expr["operator"] == "In", expr
        if labels.get(expr["key"]) not in expr["values"]:
            return False
    return True


def _pod_labels(docs: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    return {d["metadata"]["name"]: d["spec"]["template"]["metadata"]["labels"] for d in _kind(docs, "DaemonSet")}


def _check_shape(doc: dict[str, Any]) -> None:
    spec_fields, endpoint_fields = (
        (SERVICE_MONITOR_SPEC, SERVICE_MONITOR_ENDPOINT)
        if doc["kind"] == "ServiceMonitor"
        else (POD_MONITOR_SPEC, POD_METRICS_ENDPOINT)
    )
    assert doc["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(doc["spec"]) <= spec_fields, set(doc["spec"]) - spec_fields
    endpoint = _endpoint(doc)
    assert set(endpoint) <= endpoint_fields, set(endpoint) - endpoint_fields
    assert set(endpoint.get("authorization") or {}) <= SAFE_AUTHORIZATION
    assert set(endpoint.get("tlsConfig") or {}) <= SAFE_TLS_CONFIG
    for relabel in endpoint["relabelings"]:
        assert set(relabel) <= RELABEL_CONFIG and relabel["action"] in RELABEL_ACTIONS, relabel
    for key in ("interval", "scrapeTimeout"):  # the CRD's Duration pattern, e.g. 30s
        assert re.fullmatch(r"(([0-9]+)(ms|s|m|h))+", endpoint[key]), endpoint[key]


def test_a_headless_service_selects_the_agents_of_both_daemonsets_at_their_metrics_port() -> None:
    docs = _template("dra.enabled=true", "config.metrics.listen=0.0.0.0:9500")
    service = _monitor(docs, "Service")
    assert (service["metadata"]["name"], service["metadata"]["namespace"]) == ("gpushare-agent", _ns(docs))
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 9500, "targetPort": "metrics", "protocol": "TCP"}]
    pods = _pod_labels(docs)
    assert set(pods) == {"gpushare-agent", "gpushare-agent-dra"}
    for name, labels in pods.items():
        assert all(labels.get(k) == v for k, v in service["spec"]["selector"].items()), name
    # The port the Service names is the container's.
    for ds in _kind(docs, "DaemonSet"):
        (agent,) = ds["spec"]["template"]["spec"]["containers"]
        assert {"name": "metrics", "containerPort": 9500} in agent["ports"]
    assert service["metadata"]["labels"]["app.kubernetes.io/component"] == "monitoring"


def test_by_default_there_is_the_service_and_no_monitor_or_scraper_identity() -> None:
    docs = _template()
    assert _monitor(docs, "Service")["metadata"]["name"] == "gpushare-agent"
    assert not _kind(docs, "ServiceMonitor") and not _kind(docs, "PodMonitor")
    assert not [d for d in docs if d["metadata"]["name"].startswith("gpushare-metrics-scraper")]
    assert not _kind(_template("metrics.service.enabled=false"), "Service")


def test_the_service_monitor_selects_the_service_and_sets_the_job() -> None:
    docs = _template(
        "prometheus.serviceMonitor.enabled=true",
        f"prometheus.jobLabel={JOB}",
        "prometheus.serviceMonitor.labels.release=kube-prometheus-stack",
        "prometheus.serviceMonitor.interval=15s",
    )
    monitor = _monitor(docs, "ServiceMonitor")
    _check_shape(monitor)
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"  # for the operator's selector
    service = _monitor(docs, "Service")
    assert _matches(monitor["spec"]["selector"], service["metadata"]["labels"])
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [_ns(docs)]}
    endpoint = _endpoint(monitor)
    assert (endpoint["port"], endpoint["path"], endpoint["scheme"]) == ("metrics", "/metrics", "http")
    assert (endpoint["interval"], endpoint["scrapeTimeout"], endpoint["honorLabels"]) == ("15s", "10s", True)
    # After the operator's own relabelings, which would name the job after the Service.
    assert endpoint["relabelings"] == [{"action": "replace", "targetLabel": "job", "replacement": JOB}]


def test_the_pod_monitor_selects_the_agents_of_both_daemonsets_and_sets_the_job() -> None:
    docs = _template("prometheus.podMonitor.enabled=true", "dra.enabled=true", f"prometheus.jobLabel={JOB}")
    monitor = _monitor(docs, "PodMonitor")
    _check_shape(monitor)
    for name, labels in _pod_labels(docs).items():
        assert _matches(monitor["spec"]["selector"], labels), name
    assert not _matches(monitor["spec"]["selector"], {"app.kubernetes.io/part-of": "gpushare"})
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [_ns(docs)]}
    endpoint = _endpoint(monitor)
    assert (endpoint["port"], endpoint["honorLabels"]) == ("metrics", True)
    assert {"action": "replace", "targetLabel": "job", "replacement": JOB} in endpoint["relabelings"]


def _by_name(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def test_with_rbac_both_monitors_send_the_token_of_a_scraper_bound_to_the_metrics_reader() -> None:
    docs = _template("prometheus.serviceMonitor.enabled=true", "prometheus.podMonitor.enabled=true")
    for kind in ("ServiceMonitor", "PodMonitor"):
        auth = _endpoint(_monitor(docs, kind))["authorization"]
        assert auth == {"type": "Bearer", "credentials": {"name": "gpushare-metrics-scraper-token", "key": "token"}}
    secret = _by_name(docs, "Secret", "gpushare-metrics-scraper-token")
    assert secret["type"] == "kubernetes.io/service-account-token"
    assert secret["metadata"]["namespace"] == _ns(docs)
    assert secret["metadata"]["annotations"] == {"kubernetes.io/service-account.name": "gpushare-metrics-scraper"}
    assert _by_name(docs, "ServiceAccount", "gpushare-metrics-scraper")["metadata"]["namespace"] == _ns(docs)
    binding = _by_name(docs, "ClusterRoleBinding", "gpushare-metrics-scraper")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "gpushare-metrics-reader",
    }
    scraper = {"kind": "ServiceAccount", "name": "gpushare-metrics-scraper", "namespace": _ns(docs)}
    assert binding["subjects"] == [scraper]
    # The role it is bound to is the chart's own reader of /metrics, nothing more.
    reader = _by_name(docs, "ClusterRole", "gpushare-metrics-reader")
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]


def test_a_named_secret_or_a_token_file_replaces_the_charts_scraper() -> None:
    docs = _template("prometheus.podMonitor.enabled=true", "prometheus.auth.secretName=prom-token")
    auth = _endpoint(_monitor(docs, "PodMonitor"))["authorization"]
    assert auth["credentials"] == {"name": "prom-token", "key": "token"}
    assert not [d for d in docs if d["metadata"]["name"].startswith("gpushare-metrics-scraper")]

    token = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    docs = _template("prometheus.serviceMonitor.enabled=true", f"prometheus.auth.bearerTokenFile={token}")
    endpoint = _endpoint(_monitor(docs, "ServiceMonitor"))
    assert endpoint["bearerTokenFile"] == token and "authorization" not in endpoint
    assert not [d for d in docs if d["metadata"]["name"].startswith("gpushare-metrics-scraper")]
    # A PodMonitor has no token file in its CRD: refused, naming what it sends instead.
    refusal = _refused("prometheus.podMonitor.enabled=true", f"prometheus.auth.bearerTokenFile={token}")
    assert "prometheus.auth.bearerTokenFile is for a ServiceMonitor" in refusal


def test_open_access_sends_no_token_and_makes_no_scraper() -> None:
    docs = _template(
        "config.metrics.access=open", "prometheus.serviceMonitor.enabled=true", "prometheus.podMonitor.enabled=true"
    )
    for kind in ("ServiceMonitor", "PodMonitor"):
        endpoint = _endpoint(_monitor(docs, kind))
        assert not {"authorization", "bearerTokenFile"} & set(endpoint)
    assert not [d for d in docs if d["metadata"]["name"].startswith("gpushare-metrics-scraper")]


def test_a_service_monitor_without_the_service_is_refused() -> None:
    refusal = _refused("prometheus.serviceMonitor.enabled=true", "metrics.service.enabled=false")
    assert "prometheus.serviceMonitor.enabled needs metrics.service.enabled" in refusal


TLS = "config.metrics.tls.secretName=agent-tls"


def test_tls_mounts_the_secret_and_points_the_agents_config_at_its_files() -> None:
    docs = _template(TLS, "dra.enabled=true")
    for ds in _kind(docs, "DaemonSet"):
        spec = ds["spec"]["template"]["spec"]
        assert {"name": "metrics-tls", "secret": {"secretName": "agent-tls"}} in spec["volumes"]
        mounts = _agent(spec)["volumeMounts"]
        assert {"name": "metrics-tls", "mountPath": "/etc/gpushare-tls", "readOnly": True} in mounts
        # kubelet's probes stay plain HTTP on loopback, which the endpoint keeps serving.
        for probe in ("startupProbe", "livenessProbe"):
            get = _agent(spec)[probe]["httpGet"]
            assert get["host"] == "127.0.0.1" and get.get("scheme", "HTTP") == "HTTP"
    config = _one(docs, "ConfigMap")["data"]
    for name in ("config.yaml", "config-dra.yaml"):
        tls = load_config(text=config[name]).metrics.tls
        assert (tls.cert_file, tls.key_file, tls.client_ca_file) == (
            "/etc/gpushare-tls/tls.crt",
            "/etc/gpushare-tls/tls.key",
            "",
        )
    mutual_docs = _template(TLS, "config.metrics.tls.requireClientCert=true")
    mutual = load_config(text=_one(mutual_docs, "ConfigMap")["data"]["config.yaml"])
    assert mutual.metrics.tls.client_ca_file == "/etc/gpushare-tls/ca.crt"
    # Without a Secret nothing is mounted and the agent serves plain HTTP.
    spec = _pod_spec(_template())
    assert not [v for v in spec["volumes"] if v["name"] == "metrics-tls"]
    assert not load_config(text=_one(_template(), "ConfigMap")["data"]["config.yaml"]).metrics.tls.enabled


def test_tls_values_that_cannot_work_are_refused_naming_them() -> None:
    assert "config.metrics.tls.requireClientCert needs config.metrics.tls.secretName" in _refused(
        "config.metrics.tls.requireClientCert=true"
    )
    # Refused by the values schema where the chart has one, else by the template; either names the key.
    refusal = _refused("config.metrics.tls.certFile=/x.crt")
    assert "config.metrics.tls.certFile is not a value" in refusal or (
        "/config/metrics/tls" in refusal and "'certFile' not allowed" in refusal
    )


def test_with_tls_the_monitors_scrape_https_and_verify_with_the_secrets_ca() -> None:
    docs = _template(TLS, "prometheus.serviceMonitor.enabled=true", "prometheus.podMonitor.enabled=true")
    for kind in ("ServiceMonitor", "PodMonitor"):
        monitor = _monitor(docs, kind)
        _check_shape(monitor)
        endpoint = _endpoint(monitor)
        assert endpoint["scheme"] == "https"
        assert endpoint["tlsConfig"] == {
            "ca": {"secret": {"name": "agent-tls", "key": "ca.crt"}},
            "serverName": f"gpushare-agent.{_ns(docs)}.svc",
        }
    docs = _template(
        TLS,
        "prometheus.podMonitor.enabled=true",
        "prometheus.tlsConfig.insecureSkipVerify=true",
        "prometheus.tlsConfig.serverName=agents.example",
    )
    tls = _endpoint(_monitor(docs, "PodMonitor"))["tlsConfig"]
    assert tls == {"insecureSkipVerify": True, "serverName": "agents.example"}


def _job_matchers(text: str) -> list[str]:
    return re.findall(r'job=\\?"([^"\\]*)\\?"', text)


def test_the_rules_and_the_dashboard_select_the_configured_job() -> None:
    default = _template("prometheus.rules.operator=true")
    docs = _template("prometheus.rules.operator=true", f"prometheus.jobLabel={JOB}")
    rules = _by_name(docs, "ConfigMap", "gpushare-prometheus-rules")["data"]["gpushare.rules.yaml"]
    default_rules = _by_name(default, "ConfigMap", "gpushare-prometheus-rules")["data"]["gpushare.rules.yaml"]
    # Every matcher the default file has, and only those, now name the configured job.
    assert len(_job_matchers(rules)) == len(_job_matchers(default_rules)) >= 3
    assert set(_job_matchers(rules)) == {JOB} and set(_job_matchers(default_rules)) == {"gpushare-agent"}
    assert rules.replace(JOB, "gpushare-agent") == default_rules
    exprs = {r["alert"]: r["expr"] for g in yaml.safe_load(rules)["groups"] for r in g["rules"] if "alert" in r}
    assert exprs["GpushareAgentDown"] == f'up{{job="{JOB}"}} == 0'
    assert exprs["GpushareAgentsAbsent"] == f'absent(up{{job="{JOB}"}})'
    # The PrometheusRule carries the same groups.
    operator = _monitor(docs, "PrometheusRule")
    assert operator["spec"]["groups"] == yaml.safe_load(rules)["groups"]

    dashboard = _by_name(docs, "ConfigMap", "gpushare-grafana-dashboard")["data"]["gpushare.json"]
    queries = [t["expr"] for p in json.loads(dashboard)["panels"] for t in p.get("targets", [])]
    on_job = [q for q in queries if "job=" in q]
    assert on_job == [f'sum(up{{job="{JOB}"}})', f'count(up{{job="{JOB}"}})']


@pytest.mark.parametrize("job", ['a"b', "two words", "", "x}y"])
def test_a_job_name_that_would_break_the_queries_is_refused(job: str) -> None:
    assert "prometheus.jobLabel must be a job name" in _refused(f"prometheus.jobLabel={job}")
