"""The lanes `make test` runs side by side (tests/conftest.py): every tier in one, one worker per lane."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import LANES, known_tiers, lane_of

REPO = Path(__file__).resolve().parents[2]


def test_every_tier_has_a_lane() -> None:
    assert sorted(LANES) == sorted(known_tiers())


def test_make_test_starts_one_worker_per_lane() -> None:
    # Two lanes in one worker would run one after the other: the suite's time would be their sum.
    makefile = (REPO / "Makefile").read_text()
    workers = re.search(r"^TEST_LANES := (\d+)$", makefile, re.M)
    assert workers is not None, "Makefile sets no TEST_LANES"
    assert "-n $(TEST_LANES) --dist loadgroup" in makefile
    assert int(workers.group(1)) == len(set(LANES.values()))


def test_a_test_id_runs_in_its_tiers_lane() -> None:
    assert lane_of("tests/integration/e2e/test_sharing.py::test_x[a-b]") == "session-cluster"
    assert lane_of("tests/integration/kernel/test_qemu.py::test_gpukmod_in_qemu[6.1.0-50-amd64]") == "guests"
    assert lane_of("tests/unit/cli/doctor/test_probes.py::test_decode_allocatable") == "mixed"
    assert lane_of("tests/property/test_share_solver.py::test_y") == "mixed"
    assert lane_of("tests/integration/nvidia/test_cdi_generate.py::test_z") == "guests"
    assert lane_of("tests/integration/lowest_deps/test_lowest_deps.py::test_w") == "mixed"
