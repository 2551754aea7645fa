"""kubectl_dist tier: ``kubectl gpushare`` as an operator installs it on a machine that is not a
GPU node, apart from the agent. Real peers: PyPI (pip resolves and downloads the plugin's
dependencies), a fresh virtualenv with every compiler hidden, a bare Python for the zipapp, the
real kubectl (its plugin discovery and plugin completion), and the session cluster.

``make kubectl-plugin-dist`` builds the same things for every platform; here the build is for this
machine and this Python only (hack/kubectl_dist.py --platform --python), once per session.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cli.kubectl.zipapp import this_platform
from localcluster.cluster import Cluster
from localcluster.pods import pod_manifest
from tests.harness.cluster_fixture import cluster  # noqa: F401

REPO = Path(__file__).resolve().parents[3]
BASE_URL = "https://downloads.example.org/kubectl-gpushare"
COMPILERS = ("cc", "gcc", "g++", "c++", "clang", "clang++", "cpp", "ld", "rustc", "cargo", "go")
PENDING = "kd-pending"  # a pod no node can take: what `why` explains from the live API


@dataclass(frozen=True)
class Built:
    out: Path
    wheel: Path
    pyz: Path
    archive: Path
    manifest: Path
    platform: str
    python: str
    seconds: float


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    out = tmp_path_factory.mktemp("kubectl-dist")
    here = this_platform(platform.system(), platform.machine())
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    t0 = time.monotonic()
    argv = [sys.executable, str(REPO / "hack" / "kubectl_dist.py"), "--out", str(out), "--platform", here]
    res = subprocess.run(
        [*argv, "--python", python, "--base-url", BASE_URL], capture_output=True, text=True, timeout=600, check=False
    )
    assert res.returncode == 0, f"hack/kubectl_dist.py failed (it needs PyPI):\n{res.stdout}\n{res.stderr}"
    (wheel,) = out.glob("*.whl")
    (pyz,) = out.glob("*.pyz")
    (archive,) = out.glob("*.tar.gz")
    return Built(out, wheel, pyz, archive, out / "gpushare.yaml", here, python, time.monotonic() - t0)


def bare_env(bin_dirs: list[Path], home: Path) -> dict[str, str]:
    """An environment with nothing on PATH but ``bin_dirs``: no compiler, no project venv."""
    keep = {k: v for k, v in os.environ.items() if k in ("LANG", "LC_ALL", "TZ", "TMPDIR", "SSL_CERT_FILE")}
    keep |= {k: v for k, v in os.environ.items() if k.lower() in ("http_proxy", "https_proxy", "no_proxy")}
    path = os.pathsep.join(str(d) for d in bin_dirs)
    for tool in COMPILERS:
        assert shutil.which(tool, path=path) is None, f"{tool} is reachable on {path}"
    return {**keep, "PATH": path, "HOME": str(home), "CC": "false", "CXX": "false", "XDG_CACHE_HOME": str(home / "c")}


@dataclass(frozen=True)
class Installed:
    bin: Path
    env: dict[str, str]
    seconds: float  # creating the venv and installing the wheel with its dependencies from PyPI


@pytest.fixture(scope="session")
def installed(built: Built, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """A fresh virtualenv (no system packages, no compiler on PATH) with the wheel pip-installed."""
    root = tmp_path_factory.mktemp("clean-venv")
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(root / "venv")], check=True, timeout=120)
    env = bare_env([root / "venv" / "bin"], root)
    pip = [str(root / "venv" / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "--no-input"]
    res = subprocess.run(
        [*pip, "install", "--quiet", str(built.wheel)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert res.returncode == 0, f"pip install of the wheel failed without a compiler:\n{res.stdout}\n{res.stderr}"
    return Installed(root / "venv" / "bin", env, time.monotonic() - t0)


@pytest.fixture
def pending_pod(cluster: Cluster) -> Iterator[str]:  # noqa: F811 - the session cluster, re-exported above
    manifest = pod_manifest(PENDING, labels={"app": "kd"})
    manifest["spec"]["nodeSelector"] = {"gpushare.test/no-such-node": "true"}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))
    deadline = time.monotonic() + 30
    while "Unschedulable" not in cluster.kubectl("get", "pod", PENDING, "-o", "jsonpath={.status.conditions}").stdout:
        assert time.monotonic() < deadline, "the scheduler did not mark the pod Unschedulable in 30s"
        time.sleep(0.3)
    try:
        yield PENDING
    finally:
        cluster.kubectl("delete", "pod", PENDING, "--grace-period=0", "--force", "--wait=false", check=False)
