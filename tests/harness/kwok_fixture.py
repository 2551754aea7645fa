"""The session-wide ``kwok`` fixture of the tiers that run simulated nodes (scale, replay).

Without a built kwok the tier skips, naming the build command (``make kwok``); the run then fails
unless the tier is named in GPUSHARE_ALLOW_SKIP (tests/conftest.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from localcluster.errors import ClusterUnavailable
from localcluster.kwok import kwok_binary


@pytest.fixture(scope="session")
def kwok() -> Path:
    try:
        return kwok_binary()
    except ClusterUnavailable as e:
        pytest.skip(str(e))
