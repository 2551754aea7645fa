"""Test-suite rules shared by every tier (style.md §2.8).

- Integration tests (real containerd, kubelet, kernel in QEMU) run after everything else.
- A test that leaves a thread running fails: leaked threads hide hangs and races.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "/tests/integration/" in str(item.fspath):
            item.add_marker(pytest.mark.integration)
    # Stable sort: non-integration first, in collection order.
    items.sort(key=lambda it: it.get_closest_marker("integration") is not None)


@pytest.fixture(autouse=True)
def _no_leaked_threads() -> Iterator[None]:
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + 2.0
    while True:
        leaked = [
            t
            for t in threading.enumerate()
            if t not in before and t.is_alive() and not t.daemon and not t.name.startswith("grpc")
        ]
        leaked += [
            t for t in threading.enumerate() if t not in before and t.is_alive() and t.name.startswith("gpushare-")
        ]
        if not leaked or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    assert not leaked, f"test leaked threads: {[t.name for t in leaked]}"
