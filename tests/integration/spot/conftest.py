"""Spot tier: a private one-node cluster, the fake vendor plugin for 2 GPUs, and
``gpushare agent`` reading fake dcgm metrics from a file the tests rewrite. Both are installed
with helm (``tests/harness/worlds/spot.py``): the agent is the DaemonSet's pod, so it sees the node's
PIDs and cgroups through hostPID and the /sys/fs/cgroup mount, and reaches the file through a
read-only mount of its directory. ``GPUSHARE_AGENT_MODE=process`` runs both as host processes.

The chart's kmod init container runs too, as installed by default: this machine's kernel cannot
have gpukmod, so it says why and exits 0, and spot sees returns by utilization alone
(test_spot_install.py).

The cluster is private to this tier (not the session's) so the agent here is the only one on
its node, whatever other tiers run in the same session; the tier's modules share it, in file
order (the folder has an __init__.py for the package scope). Skips, naming the build command,
when the cluster binaries or helm are missing or not root.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from localcluster.agent import agent_mode
from localcluster.bringup import find_installs, running_cluster
from localcluster.errors import ClusterUnavailable
from localcluster.helm import helm_binary
from tests.harness.worlds.spot import SpotEnv, spot_environment


@pytest.fixture(scope="package")
def spot_env(request: pytest.FixtureRequest) -> Iterator[SpotEnv]:
    try:
        find_installs()
    except ClusterUnavailable as exc:
        pytest.skip(str(exc))
    try:
        helm_binary()
    except ClusterUnavailable as exc:
        if agent_mode() == "pod":
            pytest.skip(str(exc))
    with running_cluster() as cluster, spot_environment(cluster, kmod=True) as env:
        timings: dict[str, float] = getattr(env.agent, "timings", {})
        if timings:  # how long the operator's steps took, on the terminal (not captured)
            line = ", ".join(f"{what} {took:.1f} s" for what, took in timings.items())
            with request.config.pluginmanager.getplugin("capturemanager").global_and_fixture_disabled():
                print(f"\nspot tier: gpushare agent as the DaemonSet's pod, kmod init container on: {line}")
        yield env


# Modules that run after the others of this tier, in this order: their reclaims would count in the
# kill and eviction counters that the other modules read as absolute numbers.
LAST = ("test_hostile_spot.py", "test_spot_endpoint_saturated.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules of ``LAST`` run last in this tier, in place."""
    here = Path(__file__).parent
    places = [i for i, item in enumerate(items) if here in item.path.parents]
    order = {name: i for i, name in enumerate(LAST)}
    block = sorted((items[i] for i in places), key=lambda item: order.get(item.path.name, -1))
    for i, item in zip(places, block, strict=True):
        items[i] = item
