"""The lowest-versions lane: every direct dependency at exactly the floor pyproject.toml declares,
in a fresh virtualenv, with gpushare built by its build floors, and the unit and property tiers
pass there (hack/lowest_deps.py; `make test-lowest` runs the same lane on its own).

It needs the package index, or pip's cache holding every floor: without either it fails rather
than skips, since a floor nobody can install is exactly what it is here to catch."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from tests.harness.scripts import load_script

REPO = Path(__file__).resolve().parents[3]


def _lane() -> ModuleType:
    return load_script(REPO / "hack" / "lowest_deps.py", "lowest_deps")


# The install, the wheel build and the two tiers in one worker: inside `make test` this lane shares
# the cores with two others (QEMU among them), and a second worker of its own starved the unit
# tier's 16 MiB NRI sync past its 20 s deadline there (twice in one run; 5 s on a quiet machine).
# A few minutes, more than the suite's default 600 s per test would allow on a slow day.
@pytest.mark.timeout(1800)
def test_the_unit_and_property_tiers_pass_at_the_declared_floors(request: pytest.FixtureRequest) -> None:
    lane = _lane()
    try:
        result = lane.run_lane(workers=1)
    except (lane.LaneError, lane.FloorError) as exc:
        pytest.fail(str(exc), pytrace=False)
    # The tiers ran, in earnest: a collection that found nothing would also exit 0.
    assert result.counts.get("passed", 0) > 1000 and not result.counts.get("failed"), result.counts
    assert {p.name for p in result.pins} >= {"grpcio", "protobuf", "kubernetes", "typer", "pytest", "hypothesis"}
    steps = ", ".join(f"{k} {v:.0f} s" for k, v in result.seconds.items())
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        print(f"\nlowest-deps lane: {result.total:.0f} s ({steps}); {result.counts}")
