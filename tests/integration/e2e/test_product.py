"""The operator's surface: `gpushare status`, /metrics, /healthz, SIGTERM, bad config, the manifests."""

from __future__ import annotations

import json
import os

from localcluster.paths import REPO
from localcluster.pods import sharer
from tests.harness.worlds.agent_pod import AgentPod
from tests.integration.e2e.conftest import Env


def test_status_text_and_json_answer_the_first_questions(e2e: Env) -> None:
    names = ["stat-0", "stat-1"]
    e2e.start_pods([sharer(n) for n in names])
    e2e.wait("users recorded", lambda: sum(len(s["users"]) for s in e2e.agent.status()["shadows"]) == 2, 20)
    cfg = str(e2e.agent.config_path)

    doc = json.loads(e2e.gpushare("status", "--config", cfg, "-o", "json").stdout)
    assert doc["source"] == "agent" and doc["nri"]["connected"] is True
    assert doc["advertised"]["gpushare/share-gpu-4"] == 4 and doc["allocated"]["gpushare/share-gpu-4"] == 2
    (shadow,) = doc["shadows"]
    assert shadow["gpu"] and shadow["gpu"][0].startswith("fakegpu")
    assert sorted(shadow["users"]) == [f"default/{n}/app" for n in names]
    assert {(p["pod"], tuple(p["shadows"])) for p in doc["sharers"]} == {
        (f"default/{n}", (shadow["pod"],)) for n in names
    }
    assert "evictions" in doc

    text = e2e.gpushare("status", "--config", cfg).stdout
    assert "NRI: connected" in text and shadow["pod"] in text and "default/stat-0/app" in text, text
    assert "gpushare/share-gpu-4" in text and "RECENT EVICTIONS" in text, text

    # Agent down: the API-only view, saying so.
    e2e.agent.stop()
    try:
        down = json.loads(e2e.gpushare("status", "--config", cfg, "-o", "json").stdout)
        assert down["source"] == "api-only" and "did not answer" in down["warning"], down
        assert [s["pod"] for s in down["shadows"]] == [shadow["pod"]]
        assert sorted(down["shadows"][0]["users"]) == sorted(shadow["users"])  # from the shadow's record
        assert down["advertised"].get("gpushare/share-gpu-4") is not None
        assert "WARNING" in e2e.gpushare("status", "--config", cfg).stdout
    finally:
        e2e.agent.start()
        e2e.agent.wait_healthy()


def test_metrics_and_healthz(e2e: Env) -> None:
    e2e.start_pods([sharer("metrics-0")])
    e2e.wait("allocation seen", lambda: b'gpushare_allocations{resource="gpushare/share-gpu-4"} 1' in _metrics(e2e), 20)
    text = _metrics(e2e).decode()
    for family in (
        "gpushare_devices_advertised",
        "gpushare_allocations",
        "gpushare_shadows",
        "gpushare_evictions_total",
        "gpushare_nri_handler_seconds_bucket",
        "gpushare_nri_connected 1",
    ):
        assert family in text, family
    assert 'gpushare_devices_advertised{resource="gpushare/share-gpu-4"} 4' in text
    code, body = e2e.agent.get("/healthz")
    assert code == 200 and body.startswith(b"ok"), body


def _metrics(e: Env) -> bytes:
    code, body = e.agent.get("/metrics")
    assert code == 200
    return body


def test_sigterm_stops_cleanly_and_removes_sockets(e2e: Env) -> None:
    plugin_dir = e2e.cluster.device_plugin_dir
    ours = [p for p in os.listdir(plugin_dir) if p.startswith("gpushare-")]
    assert ours, os.listdir(plugin_dir)
    # Exit status 0: the agent ended on SIGTERM by itself (stop answers None when it had to kill it).
    assert e2e.agent.stop(timeout_s=20) == 0, e2e.agent.log_text()[-2000:]
    assert not [p for p in os.listdir(plugin_dir) if p.startswith("gpushare-")]
    assert "agent stopped" in e2e.agent.log_text()
    e2e.agent.start()
    e2e.agent.wait_healthy()


def test_bad_config_is_refused_at_start_naming_the_key(e2e: Env) -> None:
    bad = e2e.root / "bad.yaml"
    bad.write_text("version: v1\nnodeName: x\nshareSpecs: [4, -1]\nshadowIdleTimeout: soon\n")
    res = e2e.gpushare("agent", "--config", str(bad), check=False)
    assert res.returncode == 2, res
    assert "shareSpecs" in res.stderr and "shadowIdleTimeout" in res.stderr, res.stderr


def test_manifests_pass_server_side_dry_run(e2e: Env) -> None:
    """The rendered manifests and the examples against the real API server (the chart's templates are
    not manifests until rendered; their rendering is checked by tests/unit/test_manifests_rendered.py)."""
    # With the chart installed, `apply` would merge each object into the installed one (whose metrics
    # port is this cluster's); a dry-run `replace` checks each object whole.
    verb = "replace" if isinstance(e2e.agent, AgentPod) else "apply"
    res = e2e.cluster.kubectl(verb, "--dry-run=server", "-f", str(REPO / "manifests"), check=False)
    assert res.returncode == 0, res.stderr
    assert "(server dry run)" in res.stdout
    assert "daemonset.apps/gpushare-agent" in res.stdout, res.stdout
    res = e2e.cluster.kubectl("apply", "--dry-run=server", "-f", str(REPO / "manifests" / "examples"), check=False)
    assert res.returncode == 0, res.stderr


def test_rbac_grants_every_call_the_agent_makes(e2e: Env) -> None:
    """The ServiceAccount of manifests/20-rbac.yaml may do exactly what controller/io/kube_client.py asks of the API."""
    e2e.cluster.kubectl("apply", "-f", str(REPO / "manifests" / "20-rbac.yaml"))
    sa = "system:serviceaccount:gpushare-system:gpushare-agent"
    needed = [
        ("list", "pods", "--all-namespaces"),
        ("watch", "pods", "--all-namespaces"),
        ("patch", "pods", "-n=default"),
        ("delete", "pods", "-n=default"),
        ("create", "pods", "-n=gpushare-system"),
        ("create", "events", "-n=default"),
        ("list", "namespaces", ""),
        ("get", "leases.coordination.k8s.io", "-n=gpushare-system"),
        ("create", "leases.coordination.k8s.io", "-n=gpushare-system"),
        ("update", "leases.coordination.k8s.io", "-n=gpushare-system"),
    ]
    for verb, resource, scope in needed:
        args = ["auth", "can-i", verb, resource, f"--as={sa}", *([scope] if scope else [])]
        res = e2e.cluster.kubectl(*args, check=False)
        assert res.stdout.strip() == "yes", (verb, resource, scope, res.stdout, res.stderr)
    # Least privilege: no pods outside gpushare-system are created, no secrets are read.
    for verb, resource, scope in [("create", "pods", "-n=default"), ("get", "secrets", "-n=default")]:
        res = e2e.cluster.kubectl("auth", "can-i", verb, resource, f"--as={sa}", scope, check=False)
        assert res.stdout.strip() == "no", (verb, resource, scope, res.stdout)
