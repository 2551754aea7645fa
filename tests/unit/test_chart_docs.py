"""The chart's values.schema.json and README.md are a fresh render of values.yaml, and the schema
refuses what the chart cannot use: a misspelt key, a wrong type, a value outside its set."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from tests.harness.scripts import load_script
from tests.unit.test_manifests_rendered import CHART, _helm

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "hack" / "chart_docs.py"


def _module() -> ModuleType:
    return load_script(SCRIPT, "chart_docs")


def test_schema_and_readme_are_a_fresh_render() -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


def test_every_top_level_value_says_what_it_is() -> None:
    mod = _module()
    top = [k for k in mod.keys((CHART / "values.yaml").read_text()) if "." not in k.path]
    assert [k.path for k in top if not k.doc] == []


def _render(*sets: str) -> subprocess.CompletedProcess[str]:
    args = [str(_helm()), "template", "gpushare", str(CHART), "--namespace", "gpushare-system"]
    for s in sets:
        args += ["--set", s]
    return subprocess.run(args, capture_output=True, text=True, check=False, timeout=120)


@pytest.mark.parametrize(
    ("bad", "named"),
    [
        ("nodeSelectr.gpu=true", "nodeSelectr"),
        ("config.shareSpec[0]=4", "shareSpec"),
        ("logFormat=xml", "/logFormat"),
        ("image.pullPolicy=Sometimes", "/image/pullPolicy"),
        ("config.metrics.access=anyone", "/config/metrics/access"),
        ("config.shareSpecs[0]=1", "/config/shareSpecs/0"),
        ("spot.enabled=maybe", "/spot/enabled"),
        ("uninstall.timeout=soon", "/uninstall/timeout"),
        ("admission.validationActions[0]=Block", "/admission/validationActions/0"),
    ],
)
def test_the_schema_refuses_a_bad_value_naming_it(bad: str, named: str) -> None:
    proc = _render(bad)
    assert proc.returncode != 0 and named in proc.stderr, proc.stderr


def test_open_maps_pass_through_and_the_defaults_validate() -> None:
    ok = _render("podLabels.team=ml", "config.extra.idleThresholdPct=5", "affinity.podAntiAffinity.x=y")
    assert ok.returncode == 0, ok.stderr
    schema = yaml.safe_load((CHART / "values.schema.json").read_text())
    assert schema["additionalProperties"] is False and schema["properties"]["config"]["additionalProperties"] is False
    assert schema["properties"]["podLabels"]["additionalProperties"] is True


def test_a_stale_constraint_is_an_error() -> None:
    mod = _module()
    mod.CONSTRAINTS["no.such.key"] = {"minimum": 1}
    try:
        with pytest.raises(ValueError, match=r"no\.such\.key"):
            mod.schema((CHART / "values.yaml").read_text())
    finally:
        del mod.CONSTRAINTS["no.such.key"]
