"""Fixtures of the fake driver's tests: the mock NVML built once, loaded fresh for each test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fakenvidia.build import build_mock_nvml
from tests.unit.fakenvidia.nvml import Nvml

CONFIG_ENV = "GPUSHARE_MOCK_NVML_CONFIG"
EVENTS_ENV = "GPUSHARE_MOCK_NVML_EVENTS"


@pytest.fixture(scope="session")
def nvml_library() -> Path:
    return build_mock_nvml()


@pytest.fixture
def nvml(nvml_library: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Nvml]:
    """The built mock with no configuration of the caller's environment, uninitialized before and after."""
    monkeypatch.delenv(CONFIG_ENV, raising=False)
    monkeypatch.delenv(EVENTS_ENV, raising=False)
    lib = Nvml(nvml_library)
    lib.reset()
    yield lib
    lib.reset()
