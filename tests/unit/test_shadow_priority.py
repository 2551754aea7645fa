"""Shadows preempt nobody unless the operator opts in, and the chart, the config and the shadow
manifest say the same (docs/install.md, "Shadow priority"). The live cluster's side is
tests/integration/e2e/test_shadow_priority.py."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.core.model import Pool, ShareKey
from controller.share.solver import build_shadow_manifest
from gpushare import keys
from gpushare.config import Config, load_config
from gpushare.errors import ConfigError
from localcluster.errors import ClusterUnavailable
from localcluster.helm import helm_binary

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "manifests" / "chart"
KEY = ShareKey(Pool("nvidia.com/gpu", ()), keys.KIND_SHARE, 4)


def _helm() -> Path:
    try:
        return helm_binary()
    except ClusterUnavailable as exc:  # fails, never skips: the chart cannot be checked without it
        pytest.fail(str(exc))


def _render(*sets: str) -> subprocess.CompletedProcess[str]:
    args = [str(_helm()), "template", "gpushare", str(CHART), *(a for s in sets for a in ("--set", s))]
    return subprocess.run(args, capture_output=True, text=True, check=False, timeout=120)


def _class_and_config(*sets: str) -> tuple[dict[str, Any], Config]:
    proc = _render(*sets)
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    cm = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "gpushare-config")
    cfg = load_config(text=cm["data"]["config.yaml"])
    (pc,) = [d for d in docs if d["kind"] == "PriorityClass" and d["metadata"]["name"] == cfg.shadow_priority_class]
    return pc, cfg


def test_by_default_a_shadow_preempts_nobody() -> None:
    assert Config().shadow_preemption is False
    spec = build_shadow_manifest(KEY, "shadow-x-0", Config())["spec"]
    assert spec["preemptionPolicy"] == "Never" and spec["priorityClassName"] == "gpushare-shadow"
    pc, cfg = _class_and_config()
    assert pc["preemptionPolicy"] == "Never" and pc["value"] == 1000000
    assert cfg.shadow_preemption is False


def test_the_opt_in_turns_preemption_on_in_the_class_the_config_and_the_shadow() -> None:
    pc, cfg = _class_and_config("priorityClasses.shadow.preemption=true")
    assert pc["preemptionPolicy"] == "PreemptLowerPriority" and cfg.shadow_preemption is True
    assert build_shadow_manifest(KEY, "shadow-x-0", cfg)["spec"]["preemptionPolicy"] == "PreemptLowerPriority"


def test_a_knob_that_is_not_a_boolean_is_refused_by_name() -> None:
    proc = _render("priorityClasses.shadow.preemption=maybe")
    assert proc.returncode != 0 and "/priorityClasses/shadow/preemption" in proc.stderr  # values.schema.json
    with pytest.raises(ConfigError, match="shadowPreemption"):
        load_config(text="version: v1\nshadowPreemption: maybe\n")
