"""The facts `gpushare doctor` gathers about a node, as plain data (``cli.doctor.verdicts`` judges them).

Each field is what a probe found, or ``None`` where it could not tell; probes never raise, they
record why (``*_error``), so one unreadable thing costs one check, not the whole report.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class SocketFact:
    """A Unix socket as found: ``state`` is ok (accepted a connection), missing, not-socket or refused."""

    path: str
    state: str
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.state == "ok"

    def describe(self) -> str:
        what = {"ok": "answers", "missing": "does not exist", "not-socket": "is not a socket"}.get(self.state)
        return f"{self.path} {what or 'refuses connections'}" + (f" ({self.detail})" if self.detail else "")


@dataclass(frozen=True)
class ContainerdFact:
    """The containerd whose config names our NRI socket (``pid`` None: no running containerd does)."""

    pid: int | None = None
    config_path: str | None = None
    config_error: str | None = None
    version: str | None = None  # from its binary, e.g. "2.4.2"
    nri_disabled: bool | None = None  # [plugins."io.containerd.nri.v1.nri"] disable, default applied
    nri_socket: str | None = None  # its socket_path, default applied
    systemd_cgroup: bool | None = None  # the default runtime's SystemdCgroup
    others: tuple[str, ...] = ()  # other containerd processes: "pid N (config C, NRI socket S)"


@dataclass(frozen=True)
class NriFact:
    """The NRI socket and a real handshake on it (register, Configure, Synchronize, disconnect)."""

    socket: SocketFact
    runtime: str | None = None
    runtime_version: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class CgroupFact:
    root: str  # spot.cgroupRoot
    version: str | None  # v1, v2, hybrid (from the mount table); None: no cgroup filesystem there
    kubelet_driver: str | None = None  # cgroupDriver from kubelet's config (or flag)
    kubelet_config: str | None = None
    kubelet_error: str | None = None
    # What spot itself finds under the root (podcgroups.cgroups.detect_layout): where pods are
    # and the driver their names show, or why it finds none (then nothing is lent).
    spot_layout: str | None = None
    layout_driver: str | None = None
    spot_blocked: str | None = None


@dataclass(frozen=True)
class KubeletFact:
    plugin_dir: str
    plugin_dir_exists: bool
    registration: SocketFact  # kubelet.sock
    vendor_sockets: tuple[SocketFact, ...]  # every other socket but gpushare's own
    pod_resources: SocketFact
    pods: int | None = None  # pods PodResources List returned
    list_error: str | None = None
    devices: Mapping[str, int] | None = None  # GetAllocatableResources: resource -> device count
    devices_error: str | None = None
    api_allocatable: Mapping[str, int] | None = None  # the node's allocatable, when the API answered
    api_error: str | None = None


@dataclass(frozen=True)
class ExporterFact:
    source: str  # metrics.source; "" when unset
    process_level: bool  # metrics.processLevel
    devices: int | None = None
    vendor: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class KmodFact:
    release: str
    loaded: str | None
    package_version: str
    load_blocker: str | None  # why no unsigned module loads here (gpukmod.module.load_blocker)
    build_blocker: str | None  # why it cannot be built here (no headers)


@dataclass(frozen=True)
class AgentFact:
    listen: str
    healthz: int | None = None  # HTTP status of /healthz
    error: str | None = None
    spot: bool | None = None  # whether the running agent lends GPUs (/status has spot_runtime); None: unknown
    spot_mode: str | None = None  # /status spot_runtime.mode: how the running agent sees returns


@dataclass(frozen=True)
class NodeFacts:
    containerd: ContainerdFact
    nri: NriFact
    cgroup: CgroupFact
    kubelet: KubeletFact
    real_resources: tuple[str, ...]
    exporter: ExporterFact
    kmod: KmodFact
    agent: AgentFact
    spot: bool = True  # the agent lends GPUs (not --no-spot)


_VERSION = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+))?")


def parse_version(text: str | None) -> tuple[int, int, int] | None:
    """``"v2.4.2"``, ``"1.7.24~ds1"`` -> (2, 4, 2), (1, 7, 24); ``None`` when no version is in it."""
    m = _VERSION.search(text or "")
    if m is None:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


__all__ = [
    "AgentFact",
    "CgroupFact",
    "ContainerdFact",
    "ExporterFact",
    "KmodFact",
    "KubeletFact",
    "NodeFacts",
    "NriFact",
    "SocketFact",
    "parse_version",
]
