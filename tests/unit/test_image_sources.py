"""The agent image's wheel is built from SOURCE_ROOTS: every package the project ships must be
there, or the image's `gpushare` fails at import on the node while every host-side test passes."""

from __future__ import annotations

import importlib.util
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _layers() -> object:
    spec = importlib.util.spec_from_file_location("image_layers", REPO / "hack" / "image" / "layers.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("image_layers", module)
    spec.loader.exec_module(module)
    return module


def test_every_shipped_package_goes_into_the_image() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    shipped = {p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]}
    roots = set(_layers().SOURCE_ROOTS)  # type: ignore[attr-defined]
    assert shipped, "pyproject lists no packages: the check would pass on nothing"
    assert shipped <= roots, f"packages missing from hack/image/layers.py SOURCE_ROOTS: {sorted(shipped - roots)}"


def test_the_licence_goes_into_the_wheel_and_so_into_the_image() -> None:
    licence = (REPO / "LICENSE").read_text()
    assert licence.lstrip().startswith("Apache License\n                           Version 2.0, January 2004")
    assert "END OF TERMS AND CONDITIONS" in licence and "Copyright 2026 The gpushare Authors" in licence
    assert tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["license"] == {"text": "Apache-2.0"}
    # setuptools takes LICEN[CS]E* into the dist-info by default; the image's wheel is built from SOURCE_ROOTS.
    assert "LICENSE" in _layers().SOURCE_ROOTS  # type: ignore[attr-defined]
