"""docs/compatibility.md: every row of the matrix names a tier that exists, and every test file it
names is there, so the matrix cannot claim a check nobody runs."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "compatibility.md"
TIERS = {p.name for p in (REPO / "tests" / "integration").iterdir() if p.is_dir() and p.name != "__pycache__"}


def _matrix_rows() -> list[list[str]]:
    text = DOC.read_text()
    table = text[text.index("## The matrix") : text.index("## Not tested")]
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| component")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]


def test_the_matrix_has_its_rows() -> None:
    components = [row[0] for row in _matrix_rows()]
    for expected in ("Kubernetes control plane", "containerd", "cgroups", "NVIDIA device plugin", "Helm", "Prometheus"):
        assert expected in components, components


def test_every_row_names_a_tier_that_exists() -> None:
    for row in _matrix_rows():
        assert len(row) == 4, row
        tested_by = row[3]
        named = set(re.findall(r"`([a-z_]+)`", tested_by))
        assert not named - TIERS, f"{row[0]}: {sorted(named - TIERS)} is no tier under tests/integration"
        assert named or tested_by.startswith(("unit", "every")), f"{row[0]}: names no tier ({tested_by})"


def test_every_test_file_named_exists() -> None:
    for name in set(re.findall(r"`(test_[a-z0-9_]+\.py|guest_[a-z0-9_]+\.py)`", DOC.read_text())):
        assert list((REPO / "tests").rglob(name)), f"docs/compatibility.md names {name}, which is nowhere under tests/"
