"""The fake vendor device plugin on a local cluster, installed the way an operator installs a
vendor's plugin: the image ``make image`` builds, imported into the cluster's containerd
(namespace ``k8s.io``), then ``helm install`` of its test chart ``tests/charts/fake-gpus``
(``FakeGpuRelease``).

    gpus = fake_gpus(cluster, side)        # a FakeGpuRelease, or a FakeGpus process
    gpus.start()

``GPUSHARE_AGENT_MODE=process`` makes it a host process instead (development). Paths in the
chart values are the host's as containerd sees them: containerd resolves hostPath volumes in
its own mount namespace, the host's, while kubelet runs in a private one (docs/cluster.md).

The agent's own DaemonSet pod, and the choice between it and a host process, live with the
tests (``tests/harness/worlds/agent_pod.py``): driving that pod reaches into the product's
cgroup code, and this package stays generic so that the product and the harness share no
internals.
"""

from __future__ import annotations

from pathlib import Path

from localcluster.agent import FAKE_RESOURCE, FakeGpus, GpuPlugin, agent_mode
from localcluster.cluster import Cluster
from localcluster.helm import Helm, daemonset_ready, import_image, wait_pods_gone, write_values
from localcluster.paths import REPO

FAKE_GPUS_CHART = REPO / "tests" / "charts" / "fake-gpus"
FAKE_GPUS_RELEASE = "fake-gpus"
FAKE_GPUS_NAMESPACE = "gpu-vendor"


class FakeGpuRelease:
    """The fake vendor plugin as a DaemonSet, installed with helm from tests/charts/fake-gpus."""

    def __init__(self, cluster: Cluster, side: Path, count: int = 2) -> None:
        self.cluster = cluster
        self.count = count
        self.dev_dir = side / "dev"
        self.values = side / "fake-gpus-values.yaml"
        self.helm = Helm(cluster)

    def start(self, timeout_s: float = 120.0) -> None:
        import_image(self.cluster)
        values = {
            "count": self.count,
            "resource": FAKE_RESOURCE,
            "kubeletRootDir": str(self.cluster.kubelet_root),
            "devDir": str(self.dev_dir),
        }
        write_values(self.values, values)
        self.helm.install(FAKE_GPUS_RELEASE, FAKE_GPUS_CHART, FAKE_GPUS_NAMESPACE, self.values, "--create-namespace")
        self.cluster.wait_for(
            "the fake-gpus DaemonSet ready",
            lambda: daemonset_ready(self.cluster, FAKE_GPUS_NAMESPACE, "fake-gpus"),
            timeout_s,
        )

    def stop(self) -> None:
        self.helm.uninstall(FAKE_GPUS_RELEASE, FAKE_GPUS_NAMESPACE)
        wait_pods_gone(self.cluster, FAKE_GPUS_NAMESPACE, "app.kubernetes.io/name=fake-gpus")
        # Wait for the namespace to go: the next tier's install of the same release into it would
        # otherwise be refused while it is still terminating.
        self.cluster.kubectl("delete", "namespace", FAKE_GPUS_NAMESPACE, "--ignore-not-found", "--timeout=120s")


def fake_gpus(cluster: Cluster, side: Path, count: int = 2, mode: str | None = None) -> GpuPlugin:
    """The (not yet started) fake vendor plugin: a DaemonSet, or a host process."""
    side.mkdir(parents=True, exist_ok=True)
    if (mode or agent_mode()) == "process":
        return FakeGpus(side, str(cluster.device_plugin_dir), count)
    return FakeGpuRelease(cluster, side, count)
