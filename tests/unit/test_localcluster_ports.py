"""Listener ports of a local cluster come from below the kernel's ephemeral range."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from localcluster import host


def test_a_port_is_free_and_outside_the_range_outgoing_connections_use() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = {host.free_port() for _ in range(50)}
    assert all(20000 <= p < low for p in ports), sorted(ports)
    assert len(ports) > 1  # drawn, not one fixed port every cluster would fight over
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", ports.pop()))


def test_with_no_room_below_the_range_the_kernel_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host, "_ephemeral_low", lambda: 1024)
    assert host.free_port() > 0
