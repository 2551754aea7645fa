"""`gpushare kmod` wiring: flags over config over defaults, errors become one clear line."""

from __future__ import annotations

import dataclasses
import errno
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli import kmod as kmod_cli
from gpukmod import InstallAction, KmodError
from gpukmod.module import KernelFacts


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[tuple[str, ...]]:
    seen: list[tuple[str, ...]] = []

    def build(kernel_dir: Path, out: Path) -> Path:
        seen.append(("build", str(kernel_dir), str(out)))
        return out / "gpukmod.ko"

    def install(ko: Path, params: str) -> InstallAction:
        seen.append(("install", str(ko), params))
        return InstallAction.REPLACE

    monkeypatch.setattr(kmod_cli, "build_module", build)
    monkeypatch.setattr(kmod_cli, "install", install)
    monkeypatch.setattr(kmod_cli, "ko_version", lambda ko: "0.1.0")
    return seen


def test_install_builds_against_kernel_dir_with_params(calls: list[tuple[str, ...]], tmp_path: Path) -> None:
    result = CliRunner().invoke(
        kmod_cli.app, ["install", "--kernel-dir", "/k", "--out", str(tmp_path), "--max-block-ms", "500"]
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
    result = CliRunner().invoke(kmod_cli.app, ["install", "--ko", "/x.ko", "--config", str(config)])
    assert result.exit_code == 0, result.output
    assert calls == [("install", "/x.ko", "max_block_ms=1200 nl_unit=30")]


def test_errors_print_the_hint_and_exit_1(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse() -> None:
        raise KmodError(errno.EAGAIN, "unload", "gpukmod")

    monkeypatch.setattr(kmod_cli, "loaded_version", lambda: "0.1.0")
    monkeypatch.setattr(kmod_cli, "unload", refuse)
    result = CliRunner().invoke(kmod_cli.app, ["unload"])
    assert result.exit_code == 1
    assert "close the listener socket" in result.output


# --- install --best-effort: the init container's mode ---------------------------------------------------------


def _facts(**changes: object) -> KernelFacts:
    base = KernelFacts("6.1.0-50-amd64", "/k", True, None, True, "0", None, "[none] integrity", "N", None)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch, calls: list[tuple[str, ...]]) -> list[KernelFacts]:
    """The kernel facts the command will read (the test sets them); build and install are recorded."""
    box = [_facts()]
    monkeypatch.setattr(kmod_cli, "read_kernel_facts", lambda kernel_dir: box[0])
    monkeypatch.setattr(kmod_cli, "source_version", lambda: "0.1.0")
    return box


def _one_line(output: str) -> str:
    lines = output.splitlines()
    assert len(lines) == 1, output
    return lines[0]


def test_best_effort_skips_without_headers_in_one_line(
    machine: list[KernelFacts], calls: list[tuple[str, ...]]
) -> None:
    machine[0] = _facts(headers=False)
    result = CliRunner().invoke(kmod_cli.app, ["install", "--best-effort"])
    assert result.exit_code == 0
    line = _one_line(result.output)
    assert line.startswith("gpukmod not installed: no kernel headers for the running kernel 6.1.0-50-amd64")
    assert line.endswith("; spot sees owners return by utilization alone")
    assert calls == []


def test_best_effort_skips_under_secure_boot_lockdown(machine: list[KernelFacts], calls: list[tuple[str, ...]]) -> None:
    machine[0] = _facts(lockdown="none [integrity] confidentiality", secure_boot=b"\x06\x00\x00\x00\x01")
    result = CliRunner().invoke(kmod_cli.app, ["install", "--best-effort"])
    assert result.exit_code == 0
    assert "lockdown is 'integrity' (Secure Boot is on)" in _one_line(result.output)
    assert calls == []


def test_best_effort_keeps_our_loaded_version_without_building(
    machine: list[KernelFacts], calls: list[tuple[str, ...]]
) -> None:
    machine[0] = _facts(loaded="0.1.0", headers=False)
    result = CliRunner().invoke(kmod_cli.app, ["install", "--best-effort"])
    assert result.exit_code == 0
    assert _one_line(result.output) == "gpukmod 0.1.0: keep (version 0.1.0 is already loaded)"
    assert calls == []


def test_best_effort_installs_where_it_can(
    machine: list[KernelFacts], calls: list[tuple[str, ...]], tmp_path: Path
) -> None:
    result = CliRunner().invoke(
        kmod_cli.app, ["install", "--best-effort", "--out", str(tmp_path), "--max-block-ms", "500"]
    )
    assert result.exit_code == 0, result.output
    assert [c[0] for c in calls] == ["build", "install"]
    assert _one_line(result.output) == f"gpukmod 0.1.0: replace ({tmp_path / 'gpukmod.ko'})"


@pytest.mark.parametrize(
    ("code", "words"),
    [
        (errno.EKEYREJECTED, "rejected gpukmod's missing signature"),
        (errno.EPERM, "refused to load gpukmod (EPERM"),
        (errno.EBUSY, "load failed: Device or resource busy"),
    ],
)
def test_best_effort_turns_a_refused_load_into_one_line(
    monkeypatch: pytest.MonkeyPatch, machine: list[KernelFacts], code: int, words: str
) -> None:
    def refuse(ko: Path, params: str) -> InstallAction:
        raise KmodError(code, "load", str(ko))

    monkeypatch.setattr(kmod_cli, "install", refuse)
    result = CliRunner().invoke(kmod_cli.app, ["install", "--best-effort", "--ko", "/built/gpukmod.ko"])
    assert result.exit_code == 0
    line = _one_line(result.output)
    assert line.startswith("gpukmod not installed: ") and words in line, line


def test_best_effort_turns_a_failed_build_into_one_line(
    monkeypatch: pytest.MonkeyPatch, machine: list[KernelFacts]
) -> None:
    def fail(kernel_dir: Path, out: Path) -> Path:
        raise KmodError(errno.ENOEXEC, "build", "make failed, see /b/build.log:\ngpukmod.c:1: error: boom\n")

    monkeypatch.setattr(kmod_cli, "build_module", fail)
    result = CliRunner().invoke(kmod_cli.app, ["install", "--best-effort"])
    assert result.exit_code == 0
    assert "build failed: Exec format error (ENOEXEC): make failed, see /b/build.log" in _one_line(result.output)
    plain = CliRunner().invoke(kmod_cli.app, ["install"])
    assert plain.exit_code == 1 and "error: boom" in plain.output  # without the flag a failure still fails


def test_best_effort_on_this_machine_never_fails(tmp_path: Path) -> None:
    """Unpatched: the real kernel's facts. No headers at --kernel-dir, so nothing is built or loaded."""
    result = CliRunner().invoke(kmod_cli.app, ["install", "--best-effort", "--kernel-dir", str(tmp_path / "none")])
    assert result.exit_code == 0, result.output
    line = _one_line(result.output)
    assert line.startswith(("gpukmod not installed: ", "gpukmod ")), line
