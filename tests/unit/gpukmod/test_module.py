"""The install decision and its execution against a fake ModuleOps; errno → KmodError hints."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from gpukmod import InstallAction, KmodError, install, plan_install
from gpukmod import module as m
from gpukmod.errors import hint_for


@pytest.mark.parametrize(
    ("loaded", "candidate", "action"),
    [
        (None, "0.1.0", InstallAction.LOAD),
        ("0.1.0", "0.1.0", InstallAction.KEEP),
        ("0.0.9", "0.1.0", InstallAction.REPLACE),
        ("0.1.0+next", "0.1.0", InstallAction.REPLACE),
    ],
)
def test_plan_install(loaded: str | None, candidate: str, action: InstallAction) -> None:
    assert plan_install(loaded, candidate) is action


class FakeOps:
    """Records calls; ``load`` sets the version the fake .ko declares (or ``report``)."""

    def __init__(self, loaded: str | None, report: str | None = None) -> None:
        self.loaded = loaded
        self.report = report
        self.calls: list[str] = []

    def load(self, path: str, params: str) -> None:
        if self.loaded is not None:
            raise KmodError(errno.EEXIST, "load", path)
        self.calls.append(f"load {params}")
        self.loaded = self.report or "0.1.0"

    def unload(self, name: str) -> None:
        self.calls.append("unload")
        self.loaded = None

    def version(self, name: str) -> str | None:
        return self.loaded


@pytest.fixture
def ko(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setattr(m, "ko_version", lambda path: "0.1.0")
    return tmp_path / "gpukmod.ko"


def test_install_keeps_loads_and_replaces(ko: Path) -> None:
    same = FakeOps("0.1.0")
    assert install(ko, ops=same) is InstallAction.KEEP
    assert same.calls == []
    fresh = FakeOps(None)
    assert install(ko, "max_block_ms=10", ops=fresh) is InstallAction.LOAD
    assert fresh.calls == ["load max_block_ms=10"]
    other = FakeOps("0.0.1")
    assert install(ko, ops=other) is InstallAction.REPLACE
    assert other.calls == ["unload", "load "]


def test_install_verifies_the_loaded_version(ko: Path) -> None:
    with pytest.raises(KmodError) as exc:
        install(ko, ops=FakeOps(None, report="9.9.9"))
    assert exc.value.errno == errno.EIO and "9.9.9" in str(exc.value)


def test_ko_version_errors(tmp_path: Path) -> None:
    with pytest.raises(KmodError) as exc:
        m.ko_version(tmp_path / "missing.ko")
    assert exc.value.errno == errno.ENOENT
    junk = tmp_path / "junk.ko"
    junk.write_bytes(b"junk" * 100)
    with pytest.raises(KmodError) as exc:
        m.ko_version(junk)
    assert exc.value.errno == errno.ENOEXEC


def test_build_without_headers_says_what_to_install(tmp_path: Path) -> None:
    with pytest.raises(KmodError) as exc:
        m.build_module(tmp_path / "no-headers", tmp_path / "out")
    assert "linux-headers" in str(exc.value) and "--kernel-dir" in str(exc.value)


def test_format_params() -> None:
    assert m.format_params(max_block_ms=500, unit=30) == "max_block_ms=500 nl_unit=30"
    assert m.format_params() == ""


@pytest.mark.parametrize(
    ("op", "code", "words"),
    [
        ("unload", errno.EAGAIN, "close the listener socket"),
        ("open", errno.EPROTONOSUPPORT, "gpushare kmod load"),
        ("version", errno.ENOENT, "gpushare kmod load"),
        ("load", errno.ENOEXEC, "gpushare kmod install"),
        ("add", errno.ENOSPC, "table is full"),
        ("release", errno.ENOENT, "add it first"),
    ],
)
def test_errors_carry_actionable_hints(op: str, code: int, words: str) -> None:
    err = KmodError(code, op, "detail")
    assert words in str(err) and err.errno == code and err.op == op
    assert str(err).startswith(f"gpukmod: {op} failed: ")
    assert hint_for(op, code) == err.hint


def test_source_version_is_the_kmod_version_file() -> None:
    assert m.source_version() == (m.SOURCE_DIR / "VERSION").read_text().strip()
    for name in m.SOURCE_FILES:
        assert (m.SOURCE_DIR / name).is_file(), name
