"""Every product module holds one concept, says which in its docstring, and stays readable.

A module is cut by what it is about, not by how long it grew: the ceiling below is loose on
purpose, so it never decides where a concept ends, and it applies to every part alike. A module
that reaches it holds two concepts; split it where they part. Generated protobuf stubs are exempt.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PARTS = ("gpushare", "nri_plugin", "deviceplugins", "gpukmod", "gpumetrics", "podcgroups", "controller", "cli")
MAX_MODULE_LINES = 600


def _modules() -> list[Path]:
    return sorted(p for part in PARTS for p in (ROOT / part).rglob("*.py") if "_pb" not in p.parts)


def test_every_part_has_modules_to_check() -> None:
    # A moved or renamed part must not turn the checks below into checks of nothing.
    for part in PARTS:
        assert any(p.relative_to(ROOT).parts[0] == part for p in _modules()), f"no modules found under {part}/"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_module_names_its_concept_and_stays_under_the_ceiling(path: Path) -> None:
    source = path.read_text()
    lines = len(source.splitlines())
    assert lines <= MAX_MODULE_LINES, (
        f"{path.relative_to(ROOT)} has {lines} lines (ceiling {MAX_MODULE_LINES}): it holds more than one concept"
    )
    docstring = ast.get_docstring(ast.parse(source))
    assert docstring, f"{path.relative_to(ROOT)} has no docstring saying what it is"
