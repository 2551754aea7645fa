"""The committed stubs must be exactly what `make protos` generates from the .proto files."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_committed_stubs_match_protos() -> None:
    spec = importlib.util.spec_from_file_location("gen_protos", ROOT / "hack" / "protos.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_protos"] = module
    spec.loader.exec_module(module)
    assert module.check_all() == [], "stale stubs; run `make protos` and commit"
