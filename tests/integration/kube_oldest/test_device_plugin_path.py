"""The device-plugin path on the oldest supported kubelet (docs/compatibility.md).

Every other cluster tier runs the newest release. This tier starts a cluster whose node runs the
oldest supported kubelet against the newest control plane, as a cluster mid-upgrade does (the
skew policy allows a kubelet three minors behind), and runs the real-kubelet device-plugin
checks on it again: gpushare's device plugins registering
with kubelet, node allocatable, a pod's container annotation as containerd received it, a
health flip, a kubelet restart, the fake vendor's GPUs and spot, and PodResources under
kubelet's rate limit. Imported test functions run here against this module's ``cluster``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from localcluster.bringup import find_installs, running_cluster
from localcluster.cluster import Cluster
from localcluster.errors import ClusterUnavailable
from localcluster.layout import OLDEST_KUBELET_VERSION
from tests.integration.kubelet_peer.test_real_kubelet import (  # noqa: F401  (collected here, on this cluster)
    plugins,
    test_podresources_calls_stay_under_the_real_kubelets_limit,
    test_real_kubelet_allocatable_pod_annotation_health_restart,
    test_real_kubelet_fake_gpus_and_spot,
)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """A Ready one-node cluster whose kubelet is the oldest supported, for this module only."""
    try:
        find_installs(OLDEST_KUBELET_VERSION)
    except ClusterUnavailable as e:
        pytest.skip(str(e))
    with running_cluster(kubelet_version=OLDEST_KUBELET_VERSION) as c:
        assert c.node()["status"]["nodeInfo"]["kubeletVersion"] == OLDEST_KUBELET_VERSION
        yield c
