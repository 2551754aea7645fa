"""``kubectl gpushare`` output: kubectl's table layout, colour only on a terminal and never with
NO_COLOR, json/yaml, how kubeconfig and -n are resolved, and bad input refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from typer.testing import CliRunner

from cli.kubectl import output as out
from cli.kubectl.explain import Explanation
from cli.kubectl.plugin import app
from cli.kubectl.source import context_namespace, kubeconfig_paths
from cli.kubectl.view import GpuUse, NodeRow


def _row(**kw: object) -> NodeRow:
    base: dict[str, object] = dict(
        node="node-a", agent_pod="gpushare-agent-x", agent_ready=True, restarts=0, leader=True, nri=True,
        gpus=2, shadows=1, sharers=4, borrowers=0,
    )  # fmt: skip
    base.update(kw)
    return NodeRow(**base)  # type: ignore[arg-type]


def test_colour_only_on_a_tty_and_never_with_no_color() -> None:
    assert out.use_colour(True, {})
    assert not out.use_colour(False, {})
    assert not out.use_colour(True, {"NO_COLOR": "1"})
    assert out.use_colour(True, {"NO_COLOR": ""})  # no-color.org: set *and not empty*


def test_status_table_columns_align_with_or_without_colour() -> None:
    rows = [_row(), _row(node="node-bb", agent_ready=False, leader=False, nri=None, problems=("NRI down",))]
    plain = out.status_table(rows, wide=False, colour=False)
    lines = plain.splitlines()
    assert lines[0].split() == ["NODE", "AGENT", "READY", "LEADER", "NRI", "GPUS", "SHADOWS", "SHARERS",
                                "BORROWERS", "PROBLEMS"]  # fmt: skip
    assert "\x1b[" not in plain
    assert lines[1].index("gpushare-agent-x") == lines[0].index("AGENT")
    assert lines[-1] == "node-bb: NRI down"
    coloured = out.status_table(rows, wide=False, colour=True)
    assert "\x1b[32mconnected\x1b[0m" in coloured and "\x1b[31mfalse\x1b[0m" in coloured
    # Colour codes take no columns: stripped, the coloured table is the plain one.
    assert out._ANSI.sub("", coloured) == plain


def test_wide_adds_columns() -> None:
    plain = out.status_table([_row(advertised={"gpushare/share-gpu-4": 4}, spot={"busy": 2})], wide=True, colour=False)
    header, row = plain.splitlines()
    assert header.split()[-5:] == ["RESTARTS", "LAST-PASS", "SOURCE", "SPOT", "OFFERS"]
    assert "share-gpu-4=4" in row and "busy=2" in row


def test_who_table_marks_unknown_gpus() -> None:
    uses = [GpuUse("n", "default/p", "app", "owner", (), "", "Running", "nvidia.com/gpu")]
    text = out.who_table(uses, wide=True, colour=False)
    assert text.splitlines()[1].split() == ["n", "?", "owner", "default/p", "app", "-", "Running", "nvidia.com/gpu"]


def test_why_text_is_a_heading_and_one_paragraph() -> None:
    e = Explanation("default/p", "Pending", "ShadowUnschedulable", "It waits.", "Free a GPU.")
    assert out.why_text(e, colour=False) == "default/p: Pending (ShadowUnschedulable)\nIt waits. Fix: Free a GPU."


def test_json_and_yaml_round_trip() -> None:
    doc = {"nodes": [out.as_dict(_row())]}
    assert json.loads(out.serialise(doc, "json")) == doc
    assert yaml.safe_load(out.serialise(doc, "yaml")) == doc


def test_kubeconfig_like_kubectl(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    assert kubeconfig_paths("/x", {"KUBECONFIG": f"{a}:{b}"}) == [Path("/x")]
    assert kubeconfig_paths(None, {"KUBECONFIG": f"{a}:{b}"}) == [a, b]
    assert kubeconfig_paths(None, {}) == [Path.home() / ".kube" / "config"]
    a.write_text("current-context: dev\n")
    b.write_text(
        yaml.safe_dump(
            {"contexts": [{"name": "dev", "context": {"namespace": "team"}}, {"name": "prod", "context": {}}]}
        )
    )
    assert context_namespace([a, b], None) == "team"
    assert context_namespace([a, b], "prod") == "default"
    assert context_namespace([tmp_path / "missing"], None) == "default"


def test_bad_output_and_missing_kubeconfig_are_refused_by_name(tmp_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(app, ["status", "-o", "xml"])
    assert res.exit_code == 2 and "Invalid value for -o: 'xml'" in res.output
    res = runner.invoke(app, ["who", "--kubeconfig", str(tmp_path / "none")], env={"KUBERNETES_SERVICE_HOST": ""})
    assert res.exit_code == 1 and "no kubeconfig found" in res.output


def test_who_targets_name_their_kind_or_are_looked_up() -> None:
    from cli.kubectl.plugin import _split_target  # noqa: PLC0415 - a private helper, tested alone

    assert _split_target("pod/web-0") == ("pod", "web-0")  # then found in -n's namespace (find_pod)
    assert _split_target("pod/other/web-0") == ("pod", "other/web-0")
    assert _split_target("gpu/GPU-0a1b") == ("gpu", "GPU-0a1b")
    assert _split_target("web-0") == ("", "web-0")
    assert _split_target("team/web-0") == ("", "team/web-0")
