"""What every `gpushare` command shares: config loading, the stop signals, `--spot-from` values."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from cli import deviceplugins, kmod
from cli.common import load_config_or_exit, parse_spot_from, stop_on_signals

BAD_CONFIG = "version: v1\nshareSpecs: [4, -1]\nmaxBlockMs: soon\n"


@pytest.fixture
def bad_config(tmp_path: Path) -> Path:
    path = tmp_path / "bad.yaml"
    path.write_text(BAD_CONFIG)
    return path


@pytest.fixture
def restore_signal_handlers() -> Iterator[None]:
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


def test_load_config_or_exit_lists_every_problem(bad_config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(typer.Exit) as exited:
        load_config_or_exit(bad_config, exit_code=7)
    assert exited.value.exit_code == 7
    err = capsys.readouterr().err
    assert "shareSpecs" in err and "maxBlockMs" in err


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["deviceplugins", "run", "--config"], id="deviceplugins run"),
        pytest.param(["fake-gpus", "--count", "1", "--config"], id="fake-gpus"),
        pytest.param(["kmod", "load", "--config"], id="kmod load"),
    ],
)
def test_a_bad_config_exits_1_naming_the_keys(argv: list[str], bad_config: Path) -> None:
    app = typer.Typer()
    app.add_typer(deviceplugins.app, name="deviceplugins")
    app.command("fake-gpus")(deviceplugins.fake_gpus)
    app.add_typer(kmod.app, name="kmod")
    result = CliRunner().invoke(app, [*argv, str(bad_config)])
    assert result.exit_code == 1, result.output
    assert "shareSpecs" in result.output and "maxBlockMs" in result.output


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.usefixtures("restore_signal_handlers")
def test_a_signal_sets_stop_and_says_so(signum: signal.Signals, caplog: pytest.LogCaptureFixture) -> None:
    stop = threading.Event()
    logger = logging.getLogger("cli.agent")
    stop_on_signals(stop, "agent", logger)
    with caplog.at_level(logging.INFO, logger=logger.name):
        os.kill(os.getpid(), signum)
        assert stop.wait(5)
    assert [(r.name, r.getMessage()) for r in caplog.records] == [
        ("cli.agent", f"agent: signal {signum.name}, stopping")
    ]


@pytest.mark.parametrize(
    ("values", "want"),
    [
        ([], {}),
        (["/run/a.sock"], {"example.com/gpu": "/run/a.sock"}),
        (
            ["nvidia.com/gpu=/run/n.sock", "/run/a.sock"],
            {"nvidia.com/gpu": "/run/n.sock", "example.com/gpu": "/run/a.sock"},
        ),
    ],
)
def test_parse_spot_from(values: list[str], want: dict[str, str]) -> None:
    assert parse_spot_from(values, "example.com/gpu") == want


@pytest.mark.parametrize(
    ("values", "needle"),
    [
        (["gpu=/run/a.sock"], "expected [RESOURCE=]SOCKET"),
        (["nvidia.com/gpu="], "expected [RESOURCE=]SOCKET"),
        (["/run/a.sock", "example.com/gpu=/run/b.sock"], "example.com/gpu given twice"),
    ],
)
def test_parse_spot_from_refuses(values: list[str], needle: str) -> None:
    with pytest.raises(typer.BadParameter, match=needle.replace("[", r"\[").replace("]", r"\]")):
        parse_spot_from(values, "example.com/gpu")
