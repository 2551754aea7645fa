"""`make cluster-up` / `make cluster-down` (the CLI behind them) leave nothing behind."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from localcluster.bringup import find_installs, reap_dead_clusters
from localcluster.cluster import leftovers
from localcluster.errors import ClusterUnavailable
from localcluster.images import BUSYBOX_IMAGE
from localcluster.layout import Binaries
from localcluster.paths import cache_dir
from localcluster.sysctls import read_sysctls

REPO = Path(__file__).resolve().parents[3]


def cli(action: str, root: Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "localcluster", action, "--root", str(root)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=240, cwd=REPO, check=False)


def pinned_netns() -> dict[Path, int]:
    """The network namespaces pinned under /run/netns (containerd's, everyone's): path -> inode.

    A namespace's inode number is reused as soon as it is freed, so another cluster on the host
    may pin a new namespace under the number this one's had: what identifies a pin is its path.
    """
    netns = Path("/run/netns")
    return {p: p.stat().st_ino for p in netns.iterdir()} if netns.is_dir() else {}


def require_cluster_installs() -> Path:
    """kubectl's path; skips (naming the build command) when the cluster cannot run here."""
    try:
        find_installs()
        return Binaries.find(cache_dir()).kubectl
    except ClusterUnavailable as e:
        pytest.skip(str(e))


@pytest.mark.slow
def test_cluster_up_then_down_leaves_no_process_mount_or_cgroup() -> None:
    kubectl = require_cluster_installs()
    root = Path(tempfile.mkdtemp(prefix="gs-kt", dir="/tmp"))
    sysctls = read_sysctls()
    t0 = time.monotonic()
    up = cli("up", root)
    try:
        assert up.returncode == 0, up.stderr
        started = time.monotonic() - t0
        assert f"export KUBECONFIG={root / 'kubeconfig'}" in up.stdout.splitlines()
        # Running pods give the teardown real work: shims, a token tmpfs, pod cgroups, and (the
        # pod without hostNetwork) a network namespace containerd pins under /run/netns.
        k = [str(kubectl), f"--kubeconfig={root / 'kubeconfig'}"]
        for name, host_network in (("busy", True), ("netns", False)):
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name},
                "spec": {
                    "hostNetwork": host_network,
                    "containers": [
                        {
                            "name": "main",
                            "image": BUSYBOX_IMAGE,
                            "imagePullPolicy": "Never",
                            "command": ["sh", "-c", "readlink /proc/self/ns/net; sleep 3600"],
                        }
                    ],
                },
            }
            subprocess.run([*k, "apply", "-f", "-"], input=json.dumps(pod), check=True, capture_output=True, text=True)
        for name in ("busy", "netns"):
            wait = [*k, "wait", "--for=condition=Ready", f"pod/{name}", "--timeout=60s"]
            subprocess.run(wait, check=True, capture_output=True)
        logs = subprocess.run([*k, "logs", "netns"], check=True, capture_output=True, text=True).stdout
        pod_netns = int(logs.strip().removeprefix("net:[").removesuffix("]"))
        pins = [path for path, ino in pinned_netns().items() if ino == pod_netns]
        assert pins, "containerd pinned no network namespace for the pod"
        before = leftovers(root)
        # The check below must be able to fail: it sees every kind of thing while the cluster runs.
        for kind in ("process", "mount", "cgroup"):
            assert any(item.startswith(kind) for item in before), (kind, before)
    finally:
        down = cli("down", root)
    assert down.returncode == 0, down.stderr
    assert leftovers(root) == []
    assert [p for p in pins if p.exists()] == []
    assert not root.exists()
    assert read_sysctls() == sysctls, "kubelet's sysctl changes were not put back"
    print(f"cluster up (CLI, cached binaries) in {started:.1f} s")


@pytest.mark.slow
def test_a_cluster_whose_test_process_was_killed_is_reaped() -> None:
    require_cluster_installs()
    root = Path(tempfile.mkdtemp(prefix="gs-kr", dir="/tmp"))
    script = (
        "import sys, time; from pathlib import Path; from localcluster.bringup import new_cluster; "
        "new_cluster(Path(sys.argv[1])).start(); print('up', flush=True); time.sleep(600)"
    )
    owner = subprocess.Popen(
        [sys.executable, "-c", script, str(root)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert owner.stdout is not None and owner.stdout.readline().strip() == "up", owner.stderr
        assert reap_dead_clusters() == [] or root.exists(), "a live cluster was reaped"
        assert root.exists()
        owner.send_signal(signal.SIGKILL)  # no finally, no teardown: the cluster's processes live on
        owner.wait(timeout=10)
        assert any(item.startswith("process") for item in leftovers(root))
        assert root in reap_dead_clusters()
        assert leftovers(root) == [] and not root.exists()
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait(timeout=10)
        for stream in (owner.stdout, owner.stderr):
            if stream is not None:
                stream.close()
