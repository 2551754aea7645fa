"""Fixtures for the kubelet-protocol tier: a private device-plugin dir with a KubeletPeer on it."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator

import pytest

from tests.integration.kubelet_peer.peer import KubeletPeer


@pytest.fixture
def plugin_dir() -> Iterator[str]:
    # Short path under /tmp: a unix socket path must fit in 107 bytes.
    path = tempfile.mkdtemp(prefix="gs-dp-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)
    shutil.rmtree(f"{path}.old", ignore_errors=True)  # KubeletPeer.restart(wipe_dir=True) leftovers


@pytest.fixture
def kubelet(plugin_dir: str) -> Iterator[KubeletPeer]:
    peer = KubeletPeer(plugin_dir)
    peer.start()
    yield peer
    peer.stop()
