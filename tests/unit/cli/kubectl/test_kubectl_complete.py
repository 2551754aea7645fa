"""Completion of ``kubectl gpushare``: the words kubectl passes to ``kubectl_complete-gpushare``
(kubectl's plugin_completion.go: the plugin's words, the last one under the cursor), and the lines
it must print back (cobra's ``__complete`` format: ``value[TAB help]`` lines, then ``:directive``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from cli.kubectl import complete
from cli.kubectl.plugin import app

TREE = complete.tree_of(typer.main.get_command(app))


class Names:
    """The cluster, as completion asks about it; records what it was asked."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str | None]] = []

    def nodes(self) -> list[str]:
        self.asked.append(("nodes", None))
        return ["gpu-node-1", "gpu-node-2", "cpu-node"]

    def pods(self, namespace: str | None) -> list[str]:
        self.asked.append(("pods", namespace))
        if namespace is None:
            return ["default/infer-0", "team/trainer"]
        return [f"{namespace or 'ctx'}-infer-0", f"{namespace or 'ctx'}-infer-1"]

    def namespaces(self) -> list[str]:
        self.asked.append(("namespaces", None))
        return ["default", "gpushare-system", "kube-system"]

    def contexts(self) -> list[str]:
        self.asked.append(("contexts", None))
        return ["prod", "staging"]


def lines(*words: str) -> list[str]:
    return complete.complete(list(words), TREE, Names())


def values(*words: str) -> list[str]:
    *found, directive = lines(*words)
    assert directive == ":4", f"{words}: file names offered ({directive})"
    return [f.split("\t")[0] for f in found]


def test_the_tree_is_the_apps_own_commands_and_flags() -> None:
    assert sorted(TREE.commands) == ["completion", "status", "who", "why"]
    for name in ("status", "who", "why"):
        flags = {f for o in TREE.commands[name].options for f in o.flags}
        kubectl_own = {"-A", "--all-namespaces", "-l", "--selector", "--context", "--kubeconfig", "-n", "--namespace"}
        assert kubectl_own | {"--request-timeout", "--agent-namespace", "-o", "-h"} <= flags, (name, flags)
        by_flag = {f: o for o in TREE.commands[name].options for f in o.flags}
        assert not by_flag["-A"].takes_value and by_flag["-n"].takes_value and by_flag["--request-timeout"].takes_value
    assert {f for o in TREE.root.options for f in o.flags} == {"--version", "-h", "--help"}


def test_subcommands_with_their_help_and_no_file_names() -> None:
    found = lines("")
    assert found[-1] == ":4"
    assert [f.split("\t")[0] for f in found[:-1]] == ["completion", "status", "who", "why"]
    assert all("\t" in f and "\n" not in f for f in found[:-1]), found
    assert values("w") == ["who", "why"]
    assert values("st") == ["status"]
    assert lines("nope", "") == [":4"]


def test_flags_when_the_word_starts_with_a_dash() -> None:
    assert values("who", "--na") == ["--namespace"]
    assert values("who", "--a") == ["--all-namespaces", "--agent-namespace", "--api-only"]
    assert "-A" in values("status", "-") and "--selector" in values("status", "-")
    assert values("--v") == ["--version"]


def test_flag_values_in_every_spelling() -> None:
    assert values("who", "-o", "") == ["wide", "json", "yaml"]
    assert values("who", "--output=j") == ["json"]  # bash completes the part after '='
    assert values("who", "-n", "kube") == ["kube-system"]
    assert values("who", "--namespace=g") == ["gpushare-system"]
    assert values("who", "-ng") == ["-ngpushare-system"]  # the shell's word is the whole "-ng"
    assert values("status", "--agent-namespace", "") == ["default", "gpushare-system", "kube-system"]
    assert values("why", "--context", "s") == ["staging"]
    assert values("who", "-l", "") == []  # a selector is free text
    assert lines("who", "--kubeconfig", "") == [":0"]  # a file: the shell completes file names


def test_arguments_are_the_clusters_names() -> None:
    assert values("status", "gpu") == ["gpu-node-1", "gpu-node-2"]
    assert values("who", "") == ["ctx-infer-0", "ctx-infer-1"]  # the context's namespace
    assert values("why", "-n", "team", "") == ["team-infer-0", "team-infer-1"]
    assert values("who", "-A", "") == ["default/infer-0", "team/trainer"]  # every namespace: NS/NAME
    assert values("completion", "") == ["bash"]
    assert values("why", "infer-0", "") == []  # one argument only
    assert values("who", "-o", "json", "--", "") == ["ctx-infer-0", "ctx-infer-1"]


def test_nothing_is_asked_of_the_cluster_for_commands_and_flags() -> None:
    names = Names()
    for words in ([""], ["who", "-"], ["who", "-o", ""], ["status", "--kubeconfig", ""]):
        complete.complete(words, TREE, names)
    assert names.asked == []


def test_the_words_typed_so_far_reach_the_lookup() -> None:
    req = complete.resolve(["who", "--context", "prod", "-n", "team", "--kubeconfig=/k", "-A", ""], TREE)
    assert (req.kind, req.command and req.command.name, req.incomplete) == ("argument", "who", "")
    assert req.values == {"context": "prod", "namespace": "team", "kubeconfig": "/k", "all_namespaces": True}


def test_the_bash_script_for_kubectl_gpushare_typed_directly(tmp_path: Path) -> None:
    """The script `kubectl-gpushare completion bash` prints, in a real bash, asking a completion
    executable that runs this checkout's complete_main (the installed one is the same function)."""
    shim = tmp_path / "kubectl_complete-gpushare"
    repo = Path(__file__).resolve().parents[4]
    shim.write_text(
        f"#!/bin/sh\nexec {sys.executable} -c "
        f"'import sys; sys.path.insert(0, \"{repo}\"); from cli.kubectl.plugin import complete_main; complete_main()'"
        ' "$@"\n'
    )
    shim.chmod(0o755)
    script = tmp_path / "completion.bash"
    script.write_text(complete.script("bash"))

    def reply(line: str) -> list[str]:
        cmd = f'source {script}; COMP_LINE="{line}"; COMP_POINT=${{#COMP_LINE}}; _kubectl_gpushare; '
        cmd += 'printf "%s\\n" "${COMPREPLY[@]}"'
        env = {**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}", "KUBECONFIG": "/nonexistent"}
        res = subprocess.run(
            ["bash", "--norc", "-c", cmd], capture_output=True, text=True, env=env, timeout=60, check=False
        )
        assert res.returncode == 0 and not res.stderr, res
        return [w for w in res.stdout.splitlines() if w]

    assert reply("kubectl-gpushare ") == ["completion", "status", "who", "why"]
    assert reply("kubectl-gpushare w") == ["who", "why"]
    assert reply("kubectl-gpushare who --all") == ["--all-namespaces"]
    assert reply("kubectl-gpushare who -o=y") == ["yaml"]
    assert reply("kubectl-gpushare status ") == []  # no cluster here: nothing, and no file names


def test_only_bash_gets_a_script() -> None:
    assert "complete -F _kubectl_gpushare kubectl-gpushare" in complete.script("bash")
    with pytest.raises(ValueError, match="kubectl's own completion"):
        complete.script("zsh")
