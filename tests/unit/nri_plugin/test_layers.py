"""Decision code never imports transport, protobuf, threads or the clock (docs/architecture.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[3] / "nri_plugin"
PURE = ["decide.py", "device_rules.py", "model.py", "oracle.py"]
ALLOWED = {
    "__future__",
    "collections",
    "contextlib",
    "dataclasses",
    "fnmatch",
    "functools",
    "posixpath",
    "re",
    "typing",
    "gpushare",
    "nri_plugin.device_rules",
    "nri_plugin.model",
    "nri_plugin.oracle",
}


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


@pytest.mark.parametrize("name", PURE)
def test_decision_modules_import_only_pure_modules(name: str) -> None:
    bad = {m for m in _imports(PKG / name) if not any(m == a or m.startswith(a + ".") for a in ALLOWED)}
    assert not bad, f"nri_plugin/{name} imports {sorted(bad)}"


def test_transport_knows_nothing_of_nri() -> None:
    for path in (PKG / "transport").glob("*.py"):
        mods = _imports(path)
        assert not {m for m in mods if m.startswith(("nri_plugin.decide", "nri_plugin.stub", "gpushare.codecs"))}
        assert "nri_plugin._pb.nri_pb2" not in mods


def test_transport_maps_no_domain_error() -> None:
    # Refused instructions are the stub's to turn into a status code; the transport only
    # answers the code of an RpcStatusError, so it imports nothing of the shared contract.
    for path in (PKG / "transport").glob("*.py"):
        mods = _imports(path)
        assert not {m for m in mods if m.startswith("gpushare") or m.endswith(".InstructionRefused")}, path.name
