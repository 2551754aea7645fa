"""``kubectl gpushare``'s command line without a cluster: kubectl's flags on every subcommand, a
bad value refused (exit 2, naming it) before anything is read, ``--version``, and how a pod
name is found with -n and -A."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.kubectl import complete
from cli.kubectl.plugin import app, find_pod, plugin_version
from cli.kubectl.source import ClusterNames

REPO = Path(__file__).resolve().parents[4]
# No kubeconfig anywhere: a command that got as far as connecting would exit 1 saying so.
NO_CLUSTER = {"KUBECONFIG": "/nonexistent/kubeconfig", "KUBERNETES_SERVICE_HOST": ""}


def run(*argv: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(argv), env=NO_CLUSTER, prog_name="kubectl gpushare")
    return result.exit_code, re.sub(r"\s+", " ", result.output.replace("│", " "))


def test_version_is_the_projects() -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert plugin_version() == version
    assert run("--version") == (0, f"kubectl-gpushare {version} ")


@pytest.mark.parametrize("command", ["status", "who", "why"])
def test_every_subcommand_takes_kubectls_flags(command: str) -> None:
    code, text = run(command, "--help")
    assert code == 0, text
    for flag in ("-A", "--all-namespaces", "-l", "--selector", "--context", "--kubeconfig", "-n", "--namespace"):
        assert f" {flag} " in text, (command, flag)
    assert "--request-timeout" in text and "--agent-namespace" in text and "-o" in text
    assert run(command, "-h")[0] == 0


@pytest.mark.parametrize(
    ("argv", "named", "why"),
    [
        (["who", "--request-timeout", "abc"], "--request-timeout", "'abc' is not a duration"),
        (["status", "--request-timeout=-1s"], "--request-timeout", "'-1s' is negative"),
        (["why", "p", "--request-timeout", "1.5"], "--request-timeout", "1s | 2m | 3h"),
        (["status", "-l", "a in b"], "-l", "'a in b': found 'b', expected '('"),
        (["who", "--selector", "A/b=c"], "-l", "not a DNS subdomain"),
        (["who", "-o", "xml"], "-o", "'xml': use wide, json or yaml"),
        (["why"], "POD", "name one POD, or select pods with -l"),
        (["why", "p", "-l", "app=x"], "POD", "name one POD, or select pods with -l"),
        (["status", "node-1", "-l", "pool=a"], "NODE", "name one NODE or select nodes with -l"),
        (["completion", "zsh"], "SHELL", "only bash"),
    ],
)
def test_a_bad_flag_is_refused_before_anything_is_read(argv: list[str], named: str, why: str) -> None:
    code, text = run(*argv)
    assert code == 2, text
    assert f"Invalid value for {named}" in text and why in text, text
    assert "kubeconfig" not in text  # it never got as far as looking for one


def test_without_a_cluster_the_command_says_so() -> None:
    code, text = run("who", "-A", "--request-timeout", "0")
    assert code == 1 and "no kubeconfig found" in text, text


def test_completion_bash_prints_the_script() -> None:
    code, text = run("completion", "bash")
    assert code == 0
    assert "complete -F _kubectl_gpushare kubectl-gpushare" in text
    assert text.strip() == re.sub(r"\s+", " ", complete.script("bash")).strip()


PODS = ["default/infer-0", "team/infer-0", "team/trainer", "gpushare-system/shadow-1"]


@pytest.mark.parametrize(
    ("name", "scope", "found"),
    [
        ("trainer", "team", "team/trainer"),
        ("trainer", "default", None),
        ("trainer", None, "team/trainer"),  # -A: whichever namespace holds it
        ("team/trainer", "default", "team/trainer"),  # NS/NAME names its own namespace
        ("infer-0", "default", "default/infer-0"),
        ("nope", None, None),
        ("nope/trainer", None, None),
    ],
)
def test_a_pod_name_is_found_as_kubectl_would(name: str, scope: str | None, found: str | None) -> None:
    assert find_pod(name, scope, PODS) == found


def test_a_name_in_several_namespaces_under_all_namespaces_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"several namespaces \(default/infer-0, team/infer-0\)"):
        find_pod("infer-0", None, PODS)


def test_contexts_for_completion_come_from_every_kubeconfig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    one.write_text("contexts: [{name: prod, context: {cluster: c}}]\ncurrent-context: prod\n")
    two.write_text("contexts: [{name: staging, context: {cluster: c}}, {name: prod}]\n")
    monkeypatch.setenv("KUBECONFIG", f"{one}:{two}:{tmp_path / 'missing'}")
    assert ClusterNames({}).contexts() == ["prod", "staging"]
    assert ClusterNames({"kubeconfig": str(two)}).contexts() == ["prod", "staging"]
    assert ClusterNames({}).nodes() == []  # no server in these files: nothing, and no error
