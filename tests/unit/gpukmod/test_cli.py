"""`gpushare kmod` wiring: flags over config over defaults, errors become one clear line."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from typer.testing import CliRunner

from controller.commands import kmod as cli
from gpukmod import InstallAction, KmodError


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[tuple[str, ...]]:
    seen: list[tuple[str, ...]] = []

    def build(kernel_dir: Path, out: Path) -> Path:
        seen.append(("build", str(kernel_dir), str(out)))
        return out / "gpukmod.ko"

    def install(ko: Path, params: str) -> InstallAction:
        seen.append(("install", str(ko), params))
        return InstallAction.REPLACE

    monkeypatch.setattr(cli, "build_module", build)
    monkeypatch.setattr(cli, "install", install)
    monkeypatch.setattr(cli, "ko_version", lambda ko: "0.1.0")
    return seen


def test_install_builds_against_kernel_dir_with_params(calls: list[tuple[str, ...]], tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli.app, ["install", "--kernel-dir", "/k", "--out", str(tmp_path), "--max-block-ms", "500"]
    )
    assert result.exit_code == 0, result.output
    assert calls == [
        ("build", "/k", str(tmp_path)),
        ("install", str(tmp_path / "gpukmod.ko"), "max_block_ms=500 nl_unit=31"),
    ]
    assert "0.1.0: replace" in result.output


def test_install_takes_config_values(calls: list[tuple[str, ...]], tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("version: v1\nmaxBlockMs: 1200\nnetlinkProtocol: 30\n")
    result = CliRunner().invoke(cli.app, ["install", "--ko", "/x.ko", "--config", str(config)])
    assert result.exit_code == 0, result.output
    assert calls == [("install", "/x.ko", "max_block_ms=1200 nl_unit=30")]


def test_errors_print_the_hint_and_exit_1(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse() -> None:
        raise KmodError(errno.EAGAIN, "unload", "gpukmod")

    monkeypatch.setattr(cli, "loaded_version", lambda: "0.1.0")
    monkeypatch.setattr(cli, "unload", refuse)
    result = CliRunner().invoke(cli.app, ["unload"])
    assert result.exit_code == 1
    assert "close the listener socket" in result.output
