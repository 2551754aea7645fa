"""Where a cluster's binaries, ports and files are: plain data, no processes, no sockets."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from localcluster.errors import ClusterUnavailable

# The supported range (docs/compatibility.md): clusters run the newest release; one tier's node runs
# the oldest supported kubelet against it (Kubernetes' skew policy allows three minors), which
# keeps the device-plugin path tested where DRA's sharing features are still alpha.
NEWEST_KUBE_VERSION = "v1.37.2"
OLDEST_KUBELET_VERSION = "v1.34.4"
KUBE_VERSION = os.environ.get("GPUSHARE_KUBE_VERSION", NEWEST_KUBE_VERSION)
# kubelet refuses --node-ip=127.0.0.1 (loopback) and then publishes no address at all, so the
# apiserver cannot reach it for logs/exec. A node *named* by an IP gets that IP as InternalIP
# unchecked (pkg/kubelet/nodestatus NodeAddress, step 2), which is exactly what we want.
NODE_NAME = "127.0.0.1"
KUBE_COMMANDS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl")
BUILD_HINT = "make deps   (or: hack/kube/build.sh && hack/kube/install-etcd.sh && hack/containerd/install.sh)"


@dataclasses.dataclass(frozen=True)
class Binaries:
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    kubelet: Path
    kubectl: Path
    etcd: Path

    @classmethod
    def find(cls, cache: Path, version: str = KUBE_VERSION, *, kubelet_version: str | None = None) -> Binaries:
        """The cached binaries, or ClusterUnavailable naming what is missing and how to build it.

        ``kubelet_version``: the node's kubelet from that release, the rest from ``version``."""
        kube = cache / "kube" / version / "bin"
        node = cache / "kube" / (kubelet_version or version) / "bin"
        etcds = sorted((cache / "etcd").glob("*/usr/bin/etcd"))
        paths = {c: (node if c == "kubelet" else kube) / c for c in KUBE_COMMANDS}
        missing = [str(p) for p in paths.values() if not p.is_file()]
        if not etcds:
            missing.append(str(cache / "etcd" / "<version>" / "usr/bin/etcd"))
        if missing:
            raise ClusterUnavailable(f"cluster binaries missing: {', '.join(missing)}; build them with: {BUILD_HINT}")
        return cls(
            kube_apiserver=kube / "kube-apiserver",
            kube_controller_manager=kube / "kube-controller-manager",
            kube_scheduler=kube / "kube-scheduler",
            kubelet=paths["kubelet"],
            kubectl=kube / "kubectl",
            etcd=etcds[-1],
        )


@dataclasses.dataclass(frozen=True)
class Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int
    kubelet: int
    kubelet_healthz: int
    scheduler: int = 0  # its /metrics (HTTPS, self-signed, no credentials); 0 in a state file from before it


@dataclasses.dataclass(frozen=True)
class Layout:
    """Every path of one cluster, all under ``root`` (a short /tmp path: unix sockets are limited)."""

    root: Path

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def etcd_data(self) -> Path:
        return self.root / "etcd"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def kubelet_root(self) -> Path:
        return self.root / "kubelet"

    @property
    def device_plugin_dir(self) -> Path:
        return self.kubelet_root / "device-plugins"

    @property
    def pod_resources_socket(self) -> Path:
        return self.kubelet_root / "pod-resources" / "kubelet.sock"

    @property
    def pod_logs(self) -> Path:
        return self.root / "pod-logs"

    @property
    def kubelet_config(self) -> Path:
        return self.root / "kubelet-config.yaml"

    @property
    def containerd_dir(self) -> Path:
        return self.root / "containerd"

    @property
    def audit_policy(self) -> Path:
        return self.root / "audit-policy.yaml"

    @property
    def audit_log(self) -> Path:
        """The apiserver's audit log: one JSON line per request of the agent's ServiceAccount."""
        return self.logs / "audit.log"

    @property
    def state_file(self) -> Path:
        return self.root / "cluster.json"

    @property
    def cgroup_root(self) -> str:
        """kubelet's cgroupRoot: one private top-level cgroup per cluster, named after the root dir."""
        return "/" + self.root.name

    def kubeconfig_for(self, user: str) -> Path:
        return self.pki / f"{user}.kubeconfig"
