"""The scale tier: kwok's simulated GPU nodes next to the session cluster's real node.

It uses the session-wide cluster (tests/harness/cluster_fixture.py) and removes everything it
added (nodes, pods, the agent's identity) before the next tier runs. Without a built kwok it
skips, naming the build command (`make kwok`).
"""

from __future__ import annotations

from tests.harness.cluster_fixture import cluster  # noqa: F401
from tests.harness.kwok_fixture import kwok  # noqa: F401
