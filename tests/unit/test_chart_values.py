"""The chart's values for where the agent runs: the API server endpoint, kubelet's root dir, the
log format and extra flags, a metrics file on the node, and the rolling restart on a config change.

Rendered with the helm binary `make helm` builds (tests/unit/test_manifests_rendered.py fails,
never skips, when it is missing); a value that cannot work must fail the render naming itself.
"""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from gpushare.config import load_config
from gpushare.errors import ConfigError
from tests.unit.test_manifests_rendered import CHART, _helm, _one, _pod_spec, _template


def _agent(spec: dict[str, Any]) -> dict[str, Any]:
    (agent,) = spec["containers"]
    return dict(agent)


def _refused(*sets: str) -> str:
    args = [str(_helm()), "template", "gpushare", str(CHART), "--namespace", "gpushare-system"]
    for s in sets:
        args += ["--set", s]
    proc = subprocess.run(args, capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode != 0, f"helm template accepted {sets}"
    return proc.stderr


def test_the_agent_runs_in_the_nodes_network_and_pid_namespaces() -> None:
    spec = _pod_spec(_template())
    assert (spec["hostNetwork"], spec["hostPID"]) == (True, True)


def test_api_server_values_become_the_in_cluster_clients_endpoint() -> None:
    env = {e["name"]: e.get("value") for e in _agent(_pod_spec(_template()))["env"]}
    assert set(env) == {"NODE_NAME"}  # default: the kubernetes service kubelet names
    spec = _pod_spec(_template("apiServer.host=10.0.0.10", "apiServer.port=6443"))
    env = {e["name"]: e.get("value") for e in _agent(spec)["env"]}
    assert (env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"]) == ("10.0.0.10", "6443")


def test_half_an_api_server_is_refused_naming_the_missing_value() -> None:
    assert "apiServer.port is set but apiServer.host is empty" in _refused("apiServer.port=6443")
    assert "apiServer.host is set but apiServer.port is empty" in _refused("apiServer.host=10.0.0.10")


def test_kubelet_root_dir_moves_the_mounts_and_the_config() -> None:
    docs = _template("kubelet.rootDir=/data/kubelet/")
    spec = _pod_spec(docs)
    host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert (host["device-plugins"], host["pod-resources"]) == (
        "/data/kubelet/device-plugins",
        "/data/kubelet/pod-resources",
    )
    mounts = {m["name"]: m["mountPath"] for m in _agent(spec)["volumeMounts"]}
    assert (mounts["device-plugins"], mounts["pod-resources"]) == (host["device-plugins"], host["pod-resources"])
    cfg = load_config(text=_one(docs, "ConfigMap")["data"]["config.yaml"])
    assert cfg.kubelet.device_plugin_dir == "/data/kubelet/device-plugins/"
    assert cfg.kubelet.pod_resources_socket == "/data/kubelet/pod-resources/kubelet.sock"
    assert "/kubelet/rootDir" in _refused("kubelet.rootDir=var/lib/kubelet")  # values.schema.json
    # The old per-path values would be ignored silently: refused, naming what replaces them.
    assert "additional properties 'kubelet' not allowed" in _refused("config.kubelet.devicePluginDir=/x/")


def test_log_format_and_extra_flags_reach_the_command() -> None:
    command = _agent(_pod_spec(_template("logFormat=text", "extraArgs={--period,1}", "spot.enabled=false")))["command"]
    assert command[:4] == ["gpushare", "--log-format", "text", "agent"]
    assert command[-3:] == ["--no-spot", "--period", "1"]
    assert "/logFormat" in _refused("logFormat=xml")  # values.schema.json


def test_a_metrics_file_on_the_node_is_mounted_read_only_with_its_directory() -> None:
    docs = _template("config.metrics.source=/run/exporter/dcgm.prom", "config.metrics.processLevel=true")
    spec = _pod_spec(docs)
    (volume,) = [v for v in spec["volumes"] if v["name"] == "metrics-source"]
    assert volume["hostPath"] == {"path": "/run/exporter", "type": "Directory"}
    (mount,) = [m for m in _agent(spec)["volumeMounts"] if m["name"] == "metrics-source"]
    assert (mount["mountPath"], mount["readOnly"]) == ("/run/exporter", True)
    cfg = load_config(text=_one(docs, "ConfigMap")["data"]["config.yaml"])
    assert (cfg.metrics.source, cfg.metrics.process_level) == ("/run/exporter/dcgm.prom", True)
    # A URL needs no mount.
    assert not [v for v in _pod_spec(_template())["volumes"] if v["name"] == "metrics-source"]
    assert "must be a URL or an absolute file path" in _refused("config.metrics.source=dcgm.prom")


def test_a_config_change_rolls_the_agents_and_nothing_else_does() -> None:
    def checksum(*sets: str) -> str:
        spec: dict[str, Any] = _one(_template(*sets), "DaemonSet")["spec"]["template"]
        return str(spec["metadata"]["annotations"]["checksum/config"])

    base = checksum()
    assert checksum("config.shareSpecs={2,3,4,5,6}") != base
    assert checksum("resources.limits.memory=512Mi") == base


def _rbac_rules(docs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    (role,) = [d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == name]
    return list(role["rules"])


REVIEWS = [
    {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
    {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]},
]


def test_metrics_need_a_reviewed_token_by_default_and_the_agent_may_ask_exactly_that() -> None:
    docs = _template()
    cfg = load_config(text=_one(docs, "ConfigMap")["data"]["config.yaml"])
    assert (cfg.metrics.access, cfg.metrics.max_connections) == ("rbac", 32)
    # The Role holds the Lease; the ClusterRole's only rules outside the core group are the reviews.
    assert [r for r in _rbac_rules(docs, "gpushare-agent") if r["apiGroups"] != [""]] == REVIEWS
    # What a scraper is bound to: reading /metrics, nothing else.
    assert _rbac_rules(docs, "gpushare-metrics-reader") == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]


def test_open_metrics_grant_the_agent_no_reviews() -> None:
    docs = _template("config.metrics.access=open")
    assert load_config(text=_one(docs, "ConfigMap")["data"]["config.yaml"]).metrics.access == "open"
    assert not [r for r in _rbac_rules(docs, "gpushare-agent") if r in REVIEWS]
    assert "/config/metrics/access" in _refused("config.metrics.access=anonymous")  # values.schema.json


def test_kubelets_probes_reach_the_agent_on_its_loopback() -> None:
    def probe_hosts(*sets: str) -> set[str]:
        agent = _agent(_pod_spec(_template(*sets)))
        return {agent[p]["httpGet"]["host"] for p in ("startupProbe", "livenessProbe")}

    assert probe_hosts() == {"127.0.0.1"}
    assert probe_hosts("config.metrics.listen=127.0.0.1:9500") == {"127.0.0.1"}
    assert probe_hosts("config.metrics.listen=[::]:9500") == {"127.0.0.1"}
    assert probe_hosts("config.metrics.listen=[::1]:9500") == {"::1"}
    # An address of one node cannot be every node's, and kubelet's probe would miss it.
    assert "config.metrics.listen must be on every address" in _refused("config.metrics.listen=10.0.0.7:9487")


def test_a_bad_connection_cap_is_refused_by_the_chart_and_the_agent_naming_the_key() -> None:
    assert "/config/metrics/maxConnections" in _refused("config.metrics.maxConnections=2")
    text = _one(_template(), "ConfigMap")["data"]["config.yaml"].replace("maxConnections: 32", "maxConnections: 2")
    with pytest.raises(ConfigError) as err:
        load_config(text=text)
    assert any(p.startswith("metrics.maxConnections: must be between 8 and 1024") for p in err.value.problems)


@pytest.mark.parametrize("key", ["shadowImage", "metrics", "nri"])
def test_a_config_extra_key_the_chart_writes_is_refused_naming_it(key: str) -> None:
    err = _refused(f"config.extra.{key}=x")
    assert f"config.extra.{key}: the chart writes {key} itself" in err, err


def test_a_key_given_twice_in_the_config_file_is_refused_naming_it() -> None:
    with pytest.raises(ConfigError, match=r"found the key 'shadowImage' twice \(first on line 2\)"):
        load_config(text="version: v1\nshadowImage: a\nwarmShadows: 1\nshadowImage: b\n")
    with pytest.raises(ConfigError, match=r"found the key 'socket' twice"):
        load_config(text="version: v1\nnri:\n  socket: /a\n  socket: /b\n")
    assert load_config(text="version: v1\nshadowImage: a\n").shadow_image == "a"


def test_the_pods_policy_skips_the_control_planes_namespaces_and_never_the_shadows() -> None:
    docs = [d for d in _template() if d.get("kind") == "ValidatingAdmissionPolicy"]
    pods = next(d for d in docs if d["metadata"]["name"] == "gpushare-pods")
    (expr,) = pods["spec"]["matchConstraints"]["namespaceSelector"]["matchExpressions"]
    assert expr == {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]}
    node = next(d for d in docs if d["metadata"]["name"] == "gpushare-agent-node")
    assert "namespaceSelector" not in node["spec"]["matchConstraints"]
    err = _refused("admission.excludedNamespaces={kube-system,gpushare-system}")
    assert "admission.excludedNamespaces may not name gpushare-system" in err, err
