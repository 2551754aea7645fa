"""Fail-closed tier: a private one-node cluster whose containerd 2.x runs its NRI default validator.

The validator requires nothing node-wide: only a container whose pod carries NRI's
``required-plugins.noderesource.dev/container.<name>`` annotation waits for gpushare's plugin
(docs/nri.md, "Failing closed"). The cluster is private to this tier because no other tier's
containerd may run with the validator on. Skips, naming the build command, when the cluster
binaries are missing or not root.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from localcluster.bringup import find_installs, running_cluster
from localcluster.cluster import Cluster
from localcluster.containerd_config import RequiredPlugins, render_nri_validator
from localcluster.errors import ClusterUnavailable


@pytest.fixture(scope="module")
def validating_cluster() -> Iterator[Cluster]:
    try:
        _, containerd = find_installs()
    except ClusterUnavailable as exc:
        pytest.skip(str(exc))
    with running_cluster(containerd_extra_config=render_nri_validator(containerd, RequiredPlugins())) as cluster:
        yield cluster
