"""Backend choice: the cffi helper first, pyroute2 when the extension is missing."""

from __future__ import annotations

import errno
import types

import pytest

from gpukmod import KmodError, KmodUnavailable
from gpukmod import _transport as t


class _Fake:
    def __init__(self, name: str, unit: int) -> None:
        self.name = name
        self.unit = unit


def _importer(missing: set[str]) -> object:
    def import_module(name: str) -> types.SimpleNamespace:
        if name in missing:
            raise ImportError(f"No module named {name!r}")
        return types.SimpleNamespace(
            NativeTransport=lambda unit: _Fake("native", unit),
            Pyroute2Transport=lambda unit: _Fake("pyroute2", unit),
            NativeModuleOps=lambda: _Fake("native-ops", 0),
            SyscallModuleOps=lambda: _Fake("syscall-ops", 0),
        )

    return import_module


@pytest.mark.parametrize(
    ("missing", "backend", "chosen"),
    [
        (set(), "auto", "native"),
        ({"gpukmod._native"}, "auto", "pyroute2"),
        (set(), "pyroute2", "pyroute2"),
        (set(), "native", "native"),
    ],
)
def test_backend_choice(monkeypatch: pytest.MonkeyPatch, missing: set[str], backend: str, chosen: str) -> None:
    monkeypatch.setattr(t.importlib, "import_module", _importer(missing))
    transport = t.open_transport(30, backend)
    assert transport.name == chosen
    assert getattr(transport, "unit", None) == 30


def test_nothing_available_says_how_to_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(t.importlib, "import_module", _importer({"gpukmod._native", "gpukmod._pyroute2"}))
    with pytest.raises(KmodUnavailable) as exc:
        t.open_transport(31, "auto")
    assert "pip install -e ." in str(exc.value) and "gpukmod._pyroute2" in str(exc.value)


def test_unknown_backend_is_refused() -> None:
    with pytest.raises(KmodError) as exc:
        t.open_transport(31, "ctypes")
    assert exc.value.errno == errno.EINVAL and "auto, native or pyroute2" in str(exc.value)


def test_module_ops_fall_back_to_syscalls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(t.importlib, "import_module", _importer({"gpukmod._native"}))
    assert getattr(t.module_ops(), "name", None) == "syscall-ops"
