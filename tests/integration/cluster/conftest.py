"""The one-node cluster tier. Other tiers get the same session-wide cluster the same way:

from tests.harness.cluster_fixture import cluster  # noqa: F401  (in their conftest.py)
"""

from __future__ import annotations

from tests.harness.cluster_fixture import cluster  # noqa: F401
