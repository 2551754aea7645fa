"""The plain manifests are the chart rendered with its defaults, and the chart says what it should.

manifests/chart is the one source of truth: these tests render it with the helm binary that
`make helm` builds and fail (never skip) when that binary is missing, because a skipped check
here would let the committed manifests drift from the chart unnoticed.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tomllib
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from gpushare.config import load_config

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "manifests" / "chart"
RENDER = REPO / "hack" / "image" / "render_manifests.py"


@cache
def _render_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("render_manifests", RENDER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _helm() -> Path:
    mod = _render_module()
    try:
        path: Path = mod.find_helm()
    except mod.NoHelm as exc:
        problem = str(exc)
    else:
        return path
    pytest.fail(f"{problem}. The chart cannot be checked without it.")


def _template(*sets: str) -> list[dict[str, Any]]:
    args = [str(_helm()), "template", "gpushare", str(CHART), "--namespace", "gpushare-system"]
    for s in sets:
        args += ["--set", s]
    proc = subprocess.run(args, capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def _one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    # The ConfigMap meant is the agent's config; the chart's other one holds the Prometheus rules.
    name = "gpushare-config" if kind == "ConfigMap" else None
    (doc,) = [d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    return doc


def _pod_spec(docs: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = _one(docs, "DaemonSet")["spec"]["template"]["spec"]
    return spec


def test_committed_manifests_are_a_fresh_render(tmp_path: Path) -> None:
    helm = _helm()
    proc = subprocess.run(
        [sys.executable, str(RENDER), "--helm", str(helm), "--check"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert proc.returncode == 0, (
        "manifests/*.yaml differ from the chart: edit manifests/chart, then run `make manifests`\n"
        + proc.stdout
        + proc.stderr
    )


def test_chart_lints_clean() -> None:
    proc = subprocess.run(
        [str(_helm()), "lint", "--strict", str(CHART)], capture_output=True, text=True, check=False, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_chart_and_image_tags_follow_the_project_version() -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert (chart["version"], chart["appVersion"]) == (version, version)
    spec = _pod_spec(_template())
    images = [c["image"] for c in spec["initContainers"] + spec["containers"]]
    assert images == [f"gpushare/agent-kmod:{version}", f"gpushare/agent:{version}"]
    # The fake vendor's chart runs the agent image too (its tag is that chart's appVersion).
    fake = yaml.safe_load((REPO / "tests" / "charts" / "fake-gpus" / "Chart.yaml").read_text())
    assert fake["appVersion"] == version, "tests/charts/fake-gpus/Chart.yaml names another image tag"
    listed = yaml.safe_load(chart["annotations"]["artifacthub.io/images"])
    assert sorted(i["image"] for i in listed) == sorted(images)


def test_every_privilege_and_host_mount_says_why() -> None:
    """A comment just above hostPID, each `privileged: true` and each hostPath volume (a run of
    hostPath lines may share one), so a reviewer never has to guess why the agent needs it."""
    lines = (REPO / "manifests" / "40-daemonset.yaml").read_text().splitlines()
    privileges = ("hostPID: true", "privileged: true")
    needs = [i for i, line in enumerate(lines) if "hostPath:" in line or line.strip() in privileges]
    assert len(needs) >= 10
    for i in needs:
        j = i - 1
        while j >= 0 and ("hostPath:" in lines[j] or lines[j].strip() == "securityContext:"):
            j -= 1
        assert lines[j].strip().startswith("#"), f"no reason comment above line {i + 1}: {lines[i].strip()}"


def test_spot_and_kmod_switches() -> None:
    on = _pod_spec(_template())
    off = _pod_spec(_template("spot.enabled=false", "kmod.enabled=false"))
    assert [c["name"] for c in on["initContainers"]] == ["kmod"]
    assert "initContainers" not in off
    assert not {"--no-spot", "--no-kmod"} & set(on["containers"][0]["command"])
    assert off["containers"][0]["command"][-2:] == ["--no-spot", "--no-kmod"]
    assert {v["name"] for v in on["volumes"]} - {v["name"] for v in off["volumes"]} == {"modules", "usr-src"}


def test_values_reach_the_config_and_the_mounts() -> None:
    docs = _template(
        "config.nri.socket=/run/containerd/nri/nri.sock",
        "config.shareSpecs={2,8}",
        "config.realResources={amd.com/gpu,nvidia.com/gpu}",
        "config.metrics.listen=0.0.0.0:9500",
        "config.metrics.source=",
        "config.extra.idleThresholdPct=5",
        "priorityClasses.shadow.name=gpu-holders",
        "image.repository=registry.example.com/gpushare/agent",
        "image.tag=dev",
        "kmod.extraHostPaths={/usr/lib/linux-kbuild-6.1}",
    )
    cfg = load_config(text=_one(docs, "ConfigMap")["data"]["config.yaml"])
    assert cfg.nri.socket == "/run/containerd/nri/nri.sock"
    assert cfg.share_specs == (2, 8)
    assert cfg.real_resources == ("amd.com/gpu", "nvidia.com/gpu")
    assert (cfg.metrics.source, cfg.idle_threshold_pct) == ("", 5.0)
    assert cfg.shadow_priority_class == "gpu-holders"
    assert {d["metadata"]["name"] for d in docs if d["kind"] == "PriorityClass"} == {"gpu-holders", "gpushare-spot"}
    spec = _pod_spec(docs)
    agent = spec["containers"][0]
    assert agent["image"] == "registry.example.com/gpushare/agent:dev"
    assert agent["ports"] == [{"name": "metrics", "containerPort": 9500}]
    host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert host["nri"] == "/run/containerd/nri"
    assert host["kmod-extra-0"] == "/usr/lib/linux-kbuild-6.1"
    mounts = {m["name"]: m["mountPath"] for m in agent["volumeMounts"]}
    assert mounts["nri"] == "/run/containerd/nri"


def test_default_config_is_valid_and_names_the_priority_class() -> None:
    docs = _template()
    cfg = load_config(text=_one(docs, "ConfigMap")["data"]["config.yaml"])
    shadow = [d for d in docs if d["kind"] == "PriorityClass" and d["metadata"]["name"] == cfg.shadow_priority_class]
    assert shadow and shadow[0]["value"] == 1000000
