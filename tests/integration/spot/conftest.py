"""Spot tier: a private one-node cluster, the fake vendor plugin for 2 GPUs, and
``gpushare agent`` as a host process reading fake dcgm metrics from a file the tests rewrite.

The cluster is private to this module (not the session's) so the agent here is the only one
on its node, whatever other tiers run in the same session. Skips, naming the build command,
when the cluster binaries are missing or not root.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from localcluster.bringup import find_installs, running_cluster
from localcluster.errors import ClusterUnavailable
from localcluster.spot import SpotEnv, spot_environment


@pytest.fixture(scope="module")
def spot_env() -> Iterator[SpotEnv]:
    try:
        find_installs()
    except ClusterUnavailable as exc:
        pytest.skip(str(exc))
    with running_cluster() as cluster, spot_environment(cluster) as env:
        yield env
