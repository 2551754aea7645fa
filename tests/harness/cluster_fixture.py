"""The session-wide ``cluster`` fixture: one Ready one-node cluster (localcluster) per pytest process.

A tier gets it by re-exporting the fixture in its conftest.py:

    from tests.harness.cluster_fixture import cluster  # noqa: F401
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator

import pytest

from localcluster.bringup import find_installs, reap_dead_clusters, running_cluster
from localcluster.cluster import Cluster
from localcluster.errors import ClusterUnavailable


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


class _SessionCluster:
    """One cluster per pytest process, however many conftests import the fixture.

    Each conftest that re-exports ``cluster`` makes its own fixture definition, and pytest keeps
    one value per definition; a reference count here makes them all share the first cluster,
    stopped when the last user is torn down (at session end).
    """

    def __init__(self) -> None:
        self.stack: contextlib.ExitStack | None = None
        self.cluster: Cluster | None = None
        self.users = 0

    def acquire(self) -> Cluster:
        if self.cluster is None:
            reap_dead_clusters()
            stack = contextlib.ExitStack()
            # `timeout` and CI end a run with SIGTERM, which by default skips every finally: turn it
            # into KeyboardInterrupt so pytest tears the session down and the cluster goes with it.
            if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
                signal.signal(signal.SIGTERM, _interrupt)
                stack.callback(signal.signal, signal.SIGTERM, signal.SIG_DFL)
            try:
                self.cluster = stack.enter_context(running_cluster(keep=bool(os.environ.get("GPUSHARE_KEEP_CLUSTER"))))
            except BaseException:
                stack.close()
                raise
            self.stack = stack
        self.users += 1
        return self.cluster

    def release(self) -> None:
        self.users -= 1
        if self.users == 0 and self.stack is not None:
            stack, self.stack, self.cluster = self.stack, None, None
            stack.close()


_SESSION = _SessionCluster()


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """A Ready one-node cluster shared by the whole session (skips, naming the build command, if absent)."""
    try:
        find_installs()
    except ClusterUnavailable as e:
        pytest.skip(str(e))
    c = _SESSION.acquire()
    try:
        yield c
    finally:
        _SESSION.release()
