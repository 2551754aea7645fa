"""The trace-replay tier: a slice of Alibaba's GPU trace on kwok nodes beside the session cluster's real node.

It uses the session-wide cluster (tests/harness/cluster_fixture.py), restarts its scheduler with the
replay's profile and back, and removes every node, pod, claim and class it added before the next
tier runs. Without a built kwok it skips, naming the build command (`make kwok`).
"""

from __future__ import annotations

from tests.harness.cluster_fixture import cluster  # noqa: F401
from tests.harness.kwok_fixture import kwok  # noqa: F401
