"""An operator's two steps, against a local cluster: put the images `make image` builds into the
node's containerd (namespace ``k8s.io``), and run helm (the binary `make helm` builds) with a
values file; then wait for a DaemonSet to roll out or its pods to go."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import yaml

from localcluster.cluster import Cluster
from localcluster.cri import CriClient
from localcluster.errors import ClusterError, ClusterUnavailable
from localcluster.paths import REPO, cache_dir

# The release's namespace, where the chart puts every namespaced object (docs/install.md).
RELEASE_NAMESPACE = "gpushare-system"
# Seconds each import took, per (cluster root, containerd pid, flavour): one import per cluster.
IMPORTED: dict[tuple[str, int, str], float] = {}


def image_name(flavour: str) -> str:
    """The full name `make image` (agent) or `make image-kmod` (kmod) gives its image; the CRI looks it up so."""
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    return f"docker.io/gpushare/{'agent' if flavour == 'agent' else 'agent-kmod'}:{version}"


def import_image(cluster: Cluster, flavour: str = "agent", *, timeout_s: float = 900.0) -> float:
    """Build the image (``agent`` or ``kmod``) with hack/image/build.py as `make image` does and
    import it into the cluster's containerd, once per cluster; the seconds that took, whenever it
    ran. An unchanged build reuses its archive, so this is mostly the import."""
    key = (str(cluster.root), cluster.pids.get("containerd", 0), flavour)
    if key not in IMPORTED:
        IMPORTED[key] = _import(cluster, flavour, timeout_s)
    return IMPORTED[key]


def _import(cluster: Cluster, flavour: str, timeout_s: float) -> float:
    started = time.monotonic()
    argv = [sys.executable, str(REPO / "hack" / "image" / "build.py"), flavour]
    argv += ["--containerd-socket", str(cluster.cri_socket)]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False, cwd=REPO)
    if res.returncode != 0:
        out = f"{res.stdout}{res.stderr}".strip()
        raise ClusterError(f"building or importing the {flavour} image failed ({res.returncode}):\n{out}")
    # CRI learns an imported image from containerd's events; until then kubelet would try to pull it.
    image = image_name(flavour)
    with CriClient(str(cluster.cri_socket)) as cri:
        cluster.wait_for(f"CRI lists {image}", functools.partial(cri.has_image, image), 60)
    return time.monotonic() - started


def helm_binary() -> Path:
    """``$HELM``, else the helm `make helm` builds; ClusterUnavailable naming `make helm` when missing."""
    version = (REPO / "hack" / "image" / "helm-version").read_text().strip()
    path = Path(os.environ.get("HELM") or cache_dir() / "helm" / version / "bin" / "helm")
    if not os.access(path, os.X_OK):
        raise ClusterUnavailable(f"no helm binary at {path}: run `make helm` (builds helm {version} from Go)")
    return path


class Helm:
    """The helm binary against the cluster's admin kubeconfig; a failed command raises ClusterError."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.binary = helm_binary()

    def __call__(self, *args: str, timeout_s: float = 180.0) -> str:
        argv = [str(self.binary), "--kubeconfig", str(self.cluster.kubeconfig), *args]
        res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False, cwd=REPO)
        if res.returncode != 0:
            raise ClusterError(f"helm {' '.join(args)} failed ({res.returncode}): {res.stderr.strip()}")
        return res.stdout

    def install(self, release: str, chart: Path, namespace: str, values: Path, *more: str) -> None:
        self._adopt_unowned(release, namespace)
        more = more if "--create-namespace" in more else (*more, "--create-namespace")
        self("install", release, str(chart), "--namespace", namespace, "--values", str(values), *more)

    def _adopt_unowned(self, release: str, namespace: str) -> None:
        """Mark the chart's PriorityClasses as this release's where no release owns them.

        A host-process agent on the same test cluster applies them with kubectl
        (``localcluster.agent.apply_base_manifests``), and Helm refuses to install over an object
        without a release's ownership label and annotations: a tier that ran such an agent would
        otherwise break every Helm install after it on the shared cluster. With them, Helm adopts
        the object, as it documents for resources created outside it.
        """
        owned = {
            "metadata": {
                "labels": {"app.kubernetes.io/managed-by": "Helm"},
                "annotations": {"meta.helm.sh/release-name": release, "meta.helm.sh/release-namespace": namespace},
            }
        }
        for manifest, base in (("10-priorityclasses.yaml", "/apis/scheduling.k8s.io/v1/priorityclasses"),):
            for doc in yaml.safe_load_all((REPO / "manifests" / manifest).read_text()):
                if not doc or doc.get("kind") != "PriorityClass":
                    continue
                path = f"{base}/{doc['metadata']['name']}"
                try:
                    live = self.cluster.request("GET", path)
                except ClusterError:
                    continue  # not there (or unreadable: then helm install says why)
                if "meta.helm.sh/release-name" not in ((live.get("metadata") or {}).get("annotations") or {}):
                    self.cluster.request("PATCH", path, owned, "application/merge-patch+json")

    def upgrade(self, release: str, chart: Path, namespace: str, values: Path) -> None:
        self("upgrade", release, str(chart), "--namespace", namespace, "--values", str(values))

    def uninstall(self, release: str, namespace: str, *more: str, timeout_s: float = 180.0) -> None:
        self("uninstall", release, "--namespace", namespace, "--ignore-not-found", *more, timeout_s=timeout_s)


def write_values(path: Path, values: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(values, sort_keys=False))
    return path


def daemonset_ready(cluster: Cluster, namespace: str, name: str) -> bool:
    """The DaemonSet's current template runs, ready, on every node it selects (at least one)."""
    res = cluster.kubectl("get", "daemonset", "-n", namespace, name, "-o", "json", check=False)
    if res.returncode != 0:
        return False
    ds = json.loads(res.stdout)
    st = ds.get("status") or {}
    want = st.get("desiredNumberScheduled", 0)
    return bool(
        want >= 1
        and st.get("observedGeneration", 0) >= ds["metadata"]["generation"]
        and st.get("updatedNumberScheduled", 0) == want
        and st.get("numberReady", 0) == want
        and st.get("numberAvailable", 0) == want
    )


def pods(cluster: Cluster, namespace: str, selector: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads(
        cluster.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json").stdout
    )["items"]
    return items


def wait_pods_gone(cluster: Cluster, namespace: str, selector: str, timeout_s: float = 60.0) -> None:
    cluster.wait_for(f"pods {selector} in {namespace} gone", lambda: not pods(cluster, namespace, selector), timeout_s)
