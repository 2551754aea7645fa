"""``kubectl gpushare`` on the real cluster: the installed ``kubectl-gpushare`` reads the API and
the agent's status (through ``kubectl exec`` into the DaemonSet pod), with kubectl's own flags,
and once through tmux, run and completed by the real kubectl as a person would type it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpushare import keys
from localcluster.agent import FAKE_RESOURCE
from localcluster.pods import pod_manifest, sharer
from tests.integration.e2e.conftest import Env
from tests.integration.e2e.test_sharing import _running

PLUGIN = Path(sys.executable).parent / "kubectl-gpushare"
COMPLETER = PLUGIN.parent / "kubectl_complete-gpushare"  # kubectl runs it to complete `kubectl gpushare`
BASH_COMPLETION = "/usr/share/bash-completion/bash_completion"  # kubectl's bash completion needs it


def _env(e: Env) -> dict[str, str]:
    """PATH as an operator's: the plugin's folder and the real kubectl's; colour left to the terminal."""
    path = os.pathsep.join([str(PLUGIN.parent), str(e.cluster.binaries.kubectl.parent), os.environ["PATH"]])
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    return {**env, "PATH": path, "KUBECONFIG": str(e.cluster.kubeconfig)}


def plugin(e: Env, *args: str) -> str:
    res = subprocess.run([str(PLUGIN), *args], capture_output=True, text=True, timeout=180, check=False, env=_env(e))
    assert res.returncode == 0, f"kubectl-gpushare {' '.join(args)} exited {res.returncode}: {res.stderr}"
    assert not res.stderr, f"kubectl-gpushare {' '.join(args)} said: {res.stderr}"
    return res.stdout


def plugin_json(e: Env, *args: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(plugin(e, *args, "-o", "json"))
    if "--api-only" not in args:
        assert not doc.get("unknownGpus"), f"an agent could not be read: {doc['unknownGpus']}"
    return doc


def _waiting_reason(e: Env, name: str) -> str:
    pod = e.cluster.pod(name) or {}
    for st in (pod.get("status") or {}).get("containerStatuses") or ():
        waiting = (st.get("state") or {}).get("waiting") or {}
        if waiting.get("reason"):
            return str(waiting["reason"])
    return ""


@pytest.fixture
def scene(e2e: Env) -> dict[str, Any]:
    """Two sharers on one shadow, a lendable owner of the other GPU, then a sharer that cannot get a
    shadow placed (both GPUs held) and a pod whose container the NRI plugin refuses."""
    e2e.start_pods(
        [
            sharer("kp-s-0"),
            sharer("kp-s-1"),
            pod_manifest("kp-owner", resources={FAKE_RESOURCE: "1"}, labels={keys.LABEL_LENDABLE: "true"}),
        ]
    )
    e2e.wait(
        "the shadow's GPU and its two users in the agent's status",
        lambda: [(bool(s["gpu"]), len(s["users"])) for s in e2e.agent.status()["shadows"]] == [(True, 2)],
        30,
    )
    (shadow,) = e2e.agent.status()["shadows"]
    e2e.apply(sharer("kp-wait", n=2))
    stolen = {keys.POD_ANNOTATION_DEVICES_FROM_PREFIX + "app": "default/kp-s-0/app"}
    e2e.apply(pod_manifest("kp-thief", annotations=stolen))
    e2e.wait(
        "ShadowUnschedulable on kp-wait",
        lambda: any(ev["reason"] == "ShadowUnschedulable" for ev in e2e.events("kp-wait")),
        60,
    )
    e2e.wait("kp-thief refused", lambda: _waiting_reason(e2e, "kp-thief") == "CreateContainerError", 60)
    return {"shadow": shadow["pod"], "gpu": shadow["gpu"], "node": e2e.cluster.node_name}


def test_status_who_and_why_answer_from_the_live_cluster(e2e: Env, scene: dict[str, Any]) -> None:
    (row,) = [r for r in plugin_json(e2e, "status")["nodes"] if r["node"] == scene["node"]]
    assert (row["agent_ready"], row["nri"], row["leader"], row["source"]) == (True, True, True, "agent"), row
    # On the node: one shadow, its two sharers (the Pending shadow and sharer have no node yet).
    assert (row["gpus"], row["shadows"], row["sharers"]) == (2, 1, 2), row
    table = plugin(e2e, "status", "--api-only")
    assert table.splitlines()[0].split()[:5] == ["NODE", "AGENT", "READY", "LEADER", "NRI"], table
    assert "--api-only" in table  # each node says why its agent was not asked
    assert "\x1b[" not in table, "colour codes in piped output"
    one = plugin(e2e, "status", scene["node"])
    assert "SHADOWS" in one and scene["shadow"] in one, one  # the agent's own detail follows the row

    # who POD: a sharer sees its shadow's GPU; a shadow; the owner.
    (use,) = plugin_json(e2e, "who", "kp-s-0")["uses"]
    assert (use["role"], use["gpu"], use["via"]) == ("sharer", scene["gpu"], scene["shadow"]), use
    (held,) = plugin_json(e2e, "who", f"pod/{scene['shadow']}")["uses"]
    assert (held["role"], held["gpu"], held["container"]) == ("shadow", scene["gpu"], "main"), held
    (owner,) = plugin_json(e2e, "who", "kp-owner")["uses"]
    (other,) = {"fakegpu0", "fakegpu1"} - set(scene["gpu"])
    assert (owner["role"], owner["gpu"], owner["resource"]) == ("owner", [other], FAKE_RESOURCE), owner
    # who GPU: the shadow and both sharers, by the GPU's ID.
    by_gpu = plugin_json(e2e, "who", f"gpu/{scene['gpu'][0]}")["uses"]
    assert sorted((u["role"], u["pod"]) for u in by_gpu) == [
        ("shadow", scene["shadow"]),
        ("sharer", "default/kp-s-0"),
        ("sharer", "default/kp-s-1"),
    ], by_gpu

    # why: the sharer waiting for a shadow that cannot be placed, and the container NRI refused.
    waiting = plugin_json(e2e, "why", "kp-wait", "--api-only")  # the shadows and Events are enough
    assert (waiting["state"], waiting["reason"]) == ("Pending", "ShadowUnschedulable"), waiting
    assert "cannot be scheduled" in waiting["explanation"] and "Fix: " in waiting["paragraph"], waiting
    refused = plugin_json(e2e, "why", "default/kp-thief")
    assert (refused["state"], refused["reason"]) == ("Refused", "CreateContainerError"), refused
    assert "not a container of this pod" in refused["explanation"] and "same pod" in refused["fix"], refused
    text = plugin(e2e, "why", "kp-wait", "--api-only").splitlines()
    assert len(text) == 2 and text[0].startswith("default/kp-wait: Pending") and "Fix:" in text[1], text
    assert _running(e2e, ["kp-s-0", "kp-s-1", "kp-owner"])


def test_kubectls_own_flags_scope_and_select_as_kubectl_does(e2e: Env, scene: dict[str, Any]) -> None:
    # who: the context's namespace by default (the shadow is in the agent's), every one with -A.
    here = {(u["role"], u["pod"]) for u in plugin_json(e2e, "who", "--request-timeout", "30s")["uses"]}
    everywhere = {(u["role"], u["pod"]) for u in plugin_json(e2e, "who", "-A", "--request-timeout", "0")["uses"]}
    assert {("sharer", "default/kp-s-0"), ("owner", "default/kp-owner")} <= here, here
    assert not [p for _, p in here if not p.startswith("default/")], here
    assert here | {("shadow", scene["shadow"])} <= everywhere, everywhere
    agent_ns = scene["shadow"].split("/")[0]
    agents = {(u["role"], u["pod"]) for u in plugin_json(e2e, "who", "-n", agent_ns)["uses"]}
    assert ("shadow", scene["shadow"]) in agents and {r for r, _ in agents} == {"shadow"}, agents
    # -l: the test's pods carry gpushare-e2e=1, the agent's shadow does not.
    labelled = {u["pod"] for u in plugin_json(e2e, "who", "-A", "-l", "gpushare-e2e=1")["uses"]}
    assert scene["shadow"] not in labelled and "default/kp-s-1" in labelled, labelled
    unlabelled = {u["pod"] for u in plugin_json(e2e, "who", "-A", "-l", "!gpushare-e2e")["uses"]}
    assert scene["shadow"] in unlabelled and all(p.startswith(f"{agent_ns}/") for p in unlabelled), unlabelled
    # who NAME with -A finds the shadow's name in the agent's namespace.
    (held,) = plugin_json(e2e, "who", "-A", scene["shadow"].split("/")[1])["uses"]
    assert (held["role"], held["pod"]) == ("shadow", scene["shadow"]), held
    # status -l selects nodes by their labels.
    labels = e2e.cluster.node()["metadata"]["labels"]
    key, value = next((k, v) for k, v in sorted(labels.items()) if v)
    assert [r["node"] for r in plugin_json(e2e, "status", "-l", f"{key}={value}")["nodes"]] == [scene["node"]]
    assert plugin_json(e2e, "status", "-l", f"{key}!={value}")["nodes"] == []
    # why -l: one explanation per selected pod.
    items = {i["pod"]: i for i in plugin_json(e2e, "why", "-l", "gpushare-e2e=1", "--api-only")["items"]}
    assert (items["default/kp-wait"]["state"], items["default/kp-thief"]["state"]) == ("Pending", "Refused"), items
    assert items["default/kp-s-0"]["state"] == "Running", items


def _tmux(sock: str, *args: str) -> str:
    res = subprocess.run(["tmux", "-L", sock, *args], capture_output=True, text=True, timeout=30, check=True)
    return res.stdout


def _run_in_pane(sock: str, command: str, marker: str, timeout_s: float = 120.0) -> str:
    """Type ``command`` into the pane, wait for ``marker``; the pane's text with its colours."""
    _tmux(sock, "send-keys", "-t", "kp", "clear", "Enter")
    _tmux(sock, "send-keys", "-t", "kp", f"{command}; echo {marker}-$?", "Enter")
    deadline = time.monotonic() + timeout_s
    while True:
        screen = _tmux(sock, "capture-pane", "-p", "-e", "-J", "-t", "kp")
        if re.search(rf"^{marker}-\d+", screen, re.MULTILINE):
            return screen
        assert time.monotonic() < deadline, f"{command!r} did not finish in {timeout_s}s:\n{screen}"
        time.sleep(0.5)


def _wait_for_screen(sock: str, pattern: str, timeout_s: float = 60.0) -> str:
    """The pane's text once ``pattern`` shows on it (a completion is typed, not run: no marker)."""
    deadline = time.monotonic() + timeout_s
    while True:
        screen = _tmux(sock, "capture-pane", "-p", "-J", "-t", "kp")
        if re.search(pattern, screen):
            return screen
        assert time.monotonic() < deadline, f"{pattern!r} not on the terminal in {timeout_s}s:\n{screen}"
        time.sleep(0.5)


def test_a_person_in_a_terminal_gets_colour_and_a_pipe_gets_none(e2e: Env) -> None:
    assert shutil.which("tmux"), "tmux is installed by `make deps` (mk/kubectl-plugin.mk)"
    sock = f"gs-kubectl-{os.getpid()}"
    env = _env(e2e)
    # The shell gets the environment on its command line: tmux's own environment is its server's.
    shell = f"env -u NO_COLOR PATH={shlex.quote(env['PATH'])} KUBECONFIG={shlex.quote(env['KUBECONFIG'])} bash --norc"
    try:
        _tmux(sock, "new-session", "-d", "-s", "kp", "-x", "220", "-y", "50", shell)
        tty = _run_in_pane(sock, "kubectl gpushare status", "DONE")
        assert "DONE-0" in tty, tty
        plain = re.sub(r"\x1b\[[0-9;]*m", "", tty)
        assert re.search(r"^NODE\s+AGENT\s+READY\s+LEADER\s+NRI", plain, re.MULTILINE), plain
        assert re.search(rf"^{re.escape(e2e.cluster.node_name)}\s+gpushare-agent-\S+\s+true\s+\*\s+connected", plain,
                         re.MULTILINE), plain  # fmt: skip
        assert "\x1b[" in tty.split("NODE", 1)[1], "no colour on the terminal"
        piped = _run_in_pane(sock, "kubectl gpushare status | cat", "PIPED")
        assert "PIPED-0" in piped and "NODE" in piped, piped
        assert "\x1b[" not in piped.split("NODE", 1)[1].split("PIPED-0", 1)[0], "colour codes in piped output"
        # TAB, through kubectl's own bash completion, which asks kubectl_complete-gpushare.
        assert COMPLETER.exists(), f"{COMPLETER} is missing: `make venv` (pip install -e .) installs it"
        assert Path(BASH_COMPLETION).is_file(), "bash-completion is installed by `make deps` (mk/kubectl-plugin.mk)"
        _run_in_pane(sock, f"source {BASH_COMPLETION}; source <(kubectl completion bash)", "LOADED")
        _tmux(sock, "send-keys", "-t", "kp", "clear", "Enter")
        _tmux(sock, "send-keys", "-t", "kp", "kubectl gpushare status ", "Tab")
        line = _wait_for_screen(sock, rf"kubectl gpushare status {re.escape(e2e.cluster.node_name)}")
        _tmux(sock, "send-keys", "-t", "kp", "C-c")
        _tmux(sock, "send-keys", "-t", "kp", "clear", "Enter")
        # Two TABs on an ambiguous word list the candidates, with kubectl's descriptions.
        _tmux(sock, "send-keys", "-t", "kp", "kubectl gpushare wh", "Tab", "Tab")
        listed = _wait_for_screen(sock, r"who +\(Which pods.*\n?.*why +\(Why a pod")  # side by side, or not
        _tmux(sock, "send-keys", "-t", "kp", "C-c")
        assert line and listed
    finally:
        subprocess.run(["tmux", "-L", sock, "kill-server"], capture_output=True, timeout=30, check=False)
