"""Bringing clusters up and down: find the cached installs, run one for a ``with`` block, and
reap the clusters a killed test run left behind."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from localcluster.cluster import Cluster, pids_of
from localcluster.containerd import ContainerdInstall, InstallMissing, find_install
from localcluster.errors import ClusterError, ClusterUnavailable
from localcluster.host import is_alive, process_identity
from localcluster.layout import BUILD_HINT, KUBE_VERSION, Binaries
from localcluster.paths import cache_dir


def find_installs(kubelet_version: str | None = None) -> tuple[Binaries, ContainerdInstall]:
    """The cached binaries (the node's kubelet of ``kubelet_version`` when given), or
    ClusterUnavailable naming what is missing and the command that builds it."""
    if os.geteuid() != 0:
        raise ClusterUnavailable("the cluster needs root (mounts, cgroups, runc); run `sudo make test`")
    binaries = Binaries.find(cache_dir(), KUBE_VERSION, kubelet_version=kubelet_version)
    try:
        return binaries, find_install("2.x")
    except InstallMissing as e:
        raise ClusterUnavailable(f"{e}; or: {BUILD_HINT}") from e


def new_cluster(
    root: Path | None = None, *, containerd_extra_config: str = "", kubelet_version: str | None = None
) -> Cluster:
    """A not yet started cluster in ``root`` (default: a fresh /tmp/gs-kXXXX); ClusterUnavailable if not built."""
    binaries, containerd = find_installs(kubelet_version)
    if root is None:
        root = Path(tempfile.mkdtemp(prefix="gs-k", dir="/tmp"))
    root.mkdir(parents=True, exist_ok=True)
    return Cluster(root, binaries, containerd, containerd_extra_config=containerd_extra_config)


@contextlib.contextmanager
def running_cluster(
    root: Path | None = None,
    keep: bool = False,
    *,
    containerd_extra_config: str = "",
    kubelet_version: str | None = None,
) -> Iterator[Cluster]:
    """Start a cluster, yield it, tear it down; raises ClusterError if the teardown left anything."""
    c = new_cluster(root, containerd_extra_config=containerd_extra_config, kubelet_version=kubelet_version)
    try:
        c.start()
        yield c
    finally:
        problems = c.stop()
        if not keep and not problems:
            shutil.rmtree(c.root, ignore_errors=True)
    if problems:
        raise ClusterError(f"teardown of {c.root} left: {problems}")


def reap_dead_clusters(tmp: Path = Path("/tmp")) -> list[Path]:
    """Tear down clusters left by a killed test run; returns their roots.

    Garbage: a state file whose owner process is gone, or, for a detached `make cluster-up`
    cluster (no owner), none of whose processes is alive any more. A cluster whose owner lives
    is its owner's to stop, even while its processes are down: test lanes run side by side, and
    one lane's reap must never race another's start or teardown.
    """
    reaped = []
    for state_file in sorted(tmp.glob("gs-k*/cluster.json")):
        root = state_file.parent
        try:
            state = json.loads(state_file.read_text())
            pids = [int(p) for p in state["pids"].values()]
            owner = tuple(state.get("owner") or ())
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if state.get("root") != str(root):
            continue
        if len(owner) == 2:
            garbage = process_identity(int(owner[0])) != owner
        else:
            garbage = not any(is_alive(p) for p in pids) and not pids_of(root)
        if not garbage:
            continue
        if not Cluster.from_state(state).stop():
            shutil.rmtree(root, ignore_errors=True)
            reaped.append(root)
    return reaped
