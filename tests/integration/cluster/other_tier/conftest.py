"""Stands for a later tier that re-exports the fixture in its own conftest, as docs/cluster.md says."""

from __future__ import annotations

from tests.harness.cluster_fixture import cluster  # noqa: F401
