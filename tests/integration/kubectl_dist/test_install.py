"""The plugin installed three ways, each proved on a machine with no compiler and no gpushare:
pip's wheel in a fresh virtualenv, the zipapp on a bare Python, and the krew archive its
manifest names; then run by the real kubectl against the session cluster, completion included."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path
from typing import Any

import yaml

from localcluster.cluster import Cluster
from tests.integration.kubectl_dist.conftest import BASE_URL, REPO, Built, Installed, bare_env

VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
AGENT_ONLY = {"cffi", "grpcio", "pyroute2", "protobuf", "prometheus-client", "gpushare"}


def run(argv: list[str], env: dict[str, str], timeout: float = 120) -> str:
    res = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, check=False, cwd=env["HOME"])
    assert res.returncode == 0, f"{' '.join(argv)} exited {res.returncode}:\n{res.stdout}\n{res.stderr}"
    return res.stdout


def with_cluster(env: dict[str, str], cluster: Cluster, *bin_dirs: Path) -> dict[str, str]:
    """The operator's PATH: the plugin's folder and the real kubectl's, and the cluster's kubeconfig."""
    path = os.pathsep.join([env["PATH"], *(str(d) for d in bin_dirs), str(cluster.binaries.kubectl.parent)])
    return {**env, "PATH": path, "KUBECONFIG": str(cluster.kubeconfig)}


def completions(env: dict[str, str], *words: str) -> list[str]:
    """What kubectl's shell completion gets for ``kubectl gpushare WORDS`` (cobra's __complete)."""
    lines = run(["kubectl", "__complete", "gpushare", *words], env).splitlines()
    assert lines and lines[-1] == ":4", lines  # kubectl relays our directive: no file names
    return [line.split("\t")[0] for line in lines[:-1]]


def test_the_wheel_installs_without_a_compiler_or_the_agents_dependencies(built: Built, installed: Installed) -> None:
    print(f"\nbuild {built.seconds:.1f}s; fresh venv + pip install from PyPI {installed.seconds:.1f}s")
    env = installed.env
    names = {p["name"].lower() for p in json.loads(run([str(installed.bin / "pip"), "list", "--format=json"], env))}
    assert "kubectl-gpushare" in names and "kubernetes" in names
    assert not names & AGENT_ONLY, names & AGENT_ONLY
    assert run([str(installed.bin / "kubectl-gpushare"), "--version"], env) == f"kubectl-gpushare {VERSION}\n"
    help_text = run([str(installed.bin / "kubectl-gpushare"), "--help"], env)
    assert all(c in help_text for c in ("status", "who", "why", "completion")), help_text
    assert run([str(installed.bin / "kubectl_complete-gpushare"), "w"], env).splitlines()[-1] == ":4"
    # Every module of ours comes from the install, never from this checkout.
    probe = (
        "import json, sys; import cli.kubectl.plugin; "
        "print(json.dumps({n: getattr(m, '__file__', '') for n, m in sys.modules.items()}))"
    )
    loaded = json.loads(run([str(installed.bin / "python"), "-c", probe], env))
    ours = {n: f for n, f in loaded.items() if n.split(".")[0] in ("cli", "controller", "gpushare")}
    assert ours and all(f.startswith(str(installed.bin.parent)) for f in ours.values()), ours


def test_kubectl_runs_and_completes_the_pip_installed_plugin(
    installed: Installed, cluster: Cluster, pending_pod: str
) -> None:
    env = with_cluster(installed.env, cluster)
    assert run(["kubectl", "gpushare", "--version"], env) == f"kubectl-gpushare {VERSION}\n"
    # The live API, through kubectl as an operator types it: a pod no node can take.
    doc = json.loads(run(["kubectl", "gpushare", "why", pending_pod, "-n", "default", "--api-only", "-o", "json"], env))
    assert (doc["pod"], doc["state"]) == (f"default/{pending_pod}", "Pending"), doc
    assert "the scheduler cannot place it" in doc["explanation"], doc
    found = json.loads(run(["kubectl", "gpushare", "why", pending_pod, "-A", "--api-only", "-o", "json"], env))
    assert found["pod"] == f"default/{pending_pod}"
    items = json.loads(run(["kubectl", "gpushare", "why", "-A", "-l", "app=kd", "--api-only", "-o", "json"], env))
    assert [i["pod"] for i in items["items"]] == [f"default/{pending_pod}"]
    # kubectl's completion finds kubectl_complete-gpushare on PATH; names come from the cluster.
    assert completions(env, "") == ["completion", "status", "who", "why"]
    assert completions(env, "wh") == ["who", "why"]
    assert completions(env, "who", "--all") == ["--all-namespaces"]
    assert completions(env, "status", "") == [cluster.node_name]
    assert {"default", "kube-system"} <= set(completions(env, "who", "-n", ""))
    assert completions(env, "why", "-n", "default", "kd-") == [pending_pod]
    assert completions(env, "why", "-o", "") == ["wide", "json", "yaml"]


def test_the_zipapp_runs_on_a_bare_python(built: Built, cluster: Cluster, pending_pod: str, tmp_path: Path) -> None:
    """No pip, no packages: the one file and a Python. krew's caveat links the completion name to it."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True, timeout=120)
    bin_dir = tmp_path / "plugins"
    bin_dir.mkdir()
    (bin_dir / "kubectl-gpushare").symlink_to(built.pyz)
    (bin_dir / "kubectl_complete-gpushare").symlink_to("kubectl-gpushare")
    env = with_cluster(bare_env([tmp_path / "bare" / "bin"], tmp_path), cluster, bin_dir)
    assert run(["kubectl", "gpushare", "--version"], env) == f"kubectl-gpushare {VERSION}\n"
    doc = json.loads(run(["kubectl", "gpushare", "why", pending_pod, "--api-only", "-o", "json"], env))
    assert (doc["pod"], doc["state"]) == (f"default/{pending_pod}", "Pending"), doc
    assert completions(env, "status", "") == [cluster.node_name]
    (unpacked,) = (tmp_path / "c" / "kubectl-gpushare").iterdir()
    assert unpacked.name.endswith(f"-cp{built.python.replace('.', '')}")


def krew_problems(name: str, doc: dict[str, Any]) -> list[str]:
    """What krew's manifest validation (internal/index/validation) refuses, for this manifest."""
    problems = []
    if doc.get("apiVersion") != "krew.googlecontainertools.github.com/v1alpha2" or doc.get("kind") != "Plugin":
        problems.append(f"apiVersion/kind: {doc.get('apiVersion')}/{doc.get('kind')}")
    if not re.fullmatch(r"[\w-]+", name) or doc.get("metadata", {}).get("name") != name:
        problems.append(f"metadata.name {doc.get('metadata')} is not the file's name {name}")
    spec = doc.get("spec") or {}
    short = spec.get("shortDescription") or ""
    if not short or "\n" in short or "\r" in short:
        problems.append(f"shortDescription {short!r}")
    if not re.fullmatch(r"v\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?", spec.get("version") or ""):
        problems.append(f"version {spec.get('version')!r} is not v-prefixed semver")
    if not spec.get("platforms"):
        problems.append("no platforms")
    for p in spec.get("platforms") or ():
        if not p.get("uri") or not p.get("bin") or not re.fullmatch(r"[a-f0-9]{64}", p.get("sha256") or ""):
            problems.append(f"platform {p}: uri, bin and a lower-case hex sha256 are required")
        if "files" in p and (not p["files"] or any(not f.get("from") or not f.get("to") for f in p["files"])):
            problems.append(f"platform files {p['files']}")
        sel = p.get("selector") or {}
        keys = [*(sel.get("matchLabels") or {}), *(e.get("key") for e in sel.get("matchExpressions") or ())]
        if not keys or set(keys) - {"os", "arch"}:
            problems.append(f"selector {sel}: os and arch only, and not empty")
    return problems


def test_the_krew_manifest_names_the_archive_it_was_built_with(built: Built, tmp_path: Path) -> None:
    doc = yaml.safe_load(built.manifest.read_text())
    assert krew_problems(built.manifest.stem, doc) == []
    assert doc["spec"]["version"] == f"v{VERSION}" and built.python in doc["spec"]["caveats"]
    (p,) = doc["spec"]["platforms"]
    os_name, _, arch = built.platform.partition("/")
    assert p["selector"] == {"matchLabels": {"os": os_name, "arch": arch}}
    assert p["uri"] == f"{BASE_URL}/{built.archive.name}" and built.archive.name.endswith(".tar.gz")
    assert p["sha256"] == hashlib.sha256(built.archive.read_bytes()).hexdigest()
    licence = [("LICENSE", 0o644)] if (REPO / "LICENSE").is_file() else []
    with tarfile.open(built.archive) as tar:
        assert [(m.name, m.mode) for m in tar.getmembers()] == [(p["bin"], 0o755), *licence]
        tar.extractall(tmp_path, filter="data")
    assert p["files"] == [{"from": name, "to": "."} for name, _ in [(p["bin"], 0), *licence]]
    assert (tmp_path / p["bin"]).read_bytes() == built.pyz.read_bytes()
    if licence:
        assert (tmp_path / "LICENSE").read_bytes() == (REPO / "LICENSE").read_bytes()
