"""Optional NVML source for NVIDIA nodes: the same ``DeviceMetrics`` without dcgm-exporter.

Needs the ``nvml`` extra (``pip install 'gpushare[nvml]'``, which is nvidia-ml-py, module
``pynvml``) and the NVIDIA driver's ``libnvidia-ml.so``. Importing this module needs
neither: ``NvmlSource.read()`` fails with a ``MetricsError`` that says which is missing.

Pods are attributed per process: NVML lists the PIDs using each GPU, each PID's
``/proc/<pid>/cgroup`` names its pod UID and container ID (cgroup v1 or v2, cgroupfs or
systemd driver; containerd, CRI-O or Docker), and a *resolver* the caller passes in (the
controller, which knows the pods on its node) turns that into namespace/pod/container.
Without a resolver no workload is reported: a container ID alone does not name a pod.

Whole GPUs only: MIG instances are not enumerated here (use dcgm-exporter for MIG).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from controller.errors import MetricsError
from controller.metrics.adapters.model import DeviceMetrics, Workload

__all__ = ["ContainerRef", "NvmlSource", "Resolver", "load_nvml", "parse_cgroup"]

VENDOR = "nvidia"
INSTALL_HINT = "pip install 'gpushare[nvml]' (nvidia-ml-py)"


@dataclass(frozen=True, slots=True)
class ContainerRef:
    """A container as its cgroup path names it."""

    container_id: str
    pod_uid: str | None = None


Resolver = Callable[[ContainerRef], Workload | None]

_POD_UID = re.compile(r"pod([0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12})")
# Last path component: "<64 hex>" (cgroupfs) or "<runtime>-<64 hex>.scope" (systemd driver).
_CONTAINER = re.compile(r"(?:^|/)(?:cri-containerd-|containerd-|docker-|crio-)?([0-9a-f]{64})(?:\.scope)?/?$")


def parse_cgroup(text: str) -> ContainerRef | None:
    """The container (and pod UID, under kubepods) a ``/proc/<pid>/cgroup`` text names, else None.

    Lines are ``hierarchy:controllers:path`` (v2 has one ``0::path`` line). The first line
    whose path ends in a container ID wins; a host process has none.
    """
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        path = parts[2].strip()
        match = _CONTAINER.search(path)
        if match is None:
            continue
        uid = _POD_UID.search(path)
        pod_uid = uid.group(1).replace("_", "-").lower() if uid else None
        return ContainerRef(match.group(1), pod_uid)
    return None


def load_nvml() -> ModuleType:
    """``pynvml``, or a ``MetricsError`` saying how to install it."""
    try:
        return importlib.import_module("pynvml")
    except ImportError as exc:
        raise MetricsError(
            f"gpushare: the NVML metrics source needs nvidia-ml-py, which is not installed; {INSTALL_HINT}, "
            "or scrape dcgm-exporter instead (metrics.source)"
        ) from exc


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class NvmlSource:
    """Read every GPU through NVML once per ``read()``; ``nvml`` and ``proc_root`` are injectable."""

    def __init__(
        self,
        resolve: Resolver | None = None,
        *,
        node: str | None = None,
        proc_root: str | Path = "/proc",
        nvml: ModuleType | Any | None = None,
    ) -> None:
        self._resolve = resolve
        self._node = node
        self._proc_root = Path(proc_root)
        self._nvml = nvml

    def read(self) -> list[DeviceMetrics]:
        nv = self._nvml if self._nvml is not None else load_nvml()
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            raise MetricsError(
                f"gpushare: NVML could not start ({exc}); is the NVIDIA driver installed and libnvidia-ml.so "
                "visible to the agent (nvidia-smi works in its container)?"
            ) from exc
        try:
            return [self._device(nv, index) for index in range(nv.nvmlDeviceGetCount())]
        except nv.NVMLError as exc:
            raise MetricsError(f"gpushare: NVML failed while listing GPUs: {exc}") from exc
        finally:
            # Shutting down a library that failed mid-read: the read's own error is the one to report.
            with contextlib.suppress(nv.NVMLError):
                nv.nvmlShutdown()

    def _device(self, nv: Any, index: int) -> DeviceMetrics:
        handle = nv.nvmlDeviceGetHandleByIndex(index)

        def maybe(call: Callable[[], Any]) -> Any:
            # Not supported / no permission / GPU lost: that value is unknown, the rest still counts.
            try:
                return call()
            except nv.NVMLError:
                return None

        uuid = maybe(lambda: _text(nv.nvmlDeviceGetUUID(handle)))
        util = maybe(lambda: nv.nvmlDeviceGetUtilizationRates(handle).gpu)
        memory = maybe(lambda: nv.nvmlDeviceGetMemoryInfo(handle))
        power_mw = maybe(lambda: nv.nvmlDeviceGetPowerUsage(handle))
        pids: list[int] = []
        for call in (nv.nvmlDeviceGetComputeRunningProcesses, nv.nvmlDeviceGetGraphicsRunningProcesses):
            pids.extend(p.pid for p in (maybe(functools.partial(call, handle)) or ()))
        return DeviceMetrics(
            vendor=VENDOR,
            device_id=uuid or f"{self._node or VENDOR}:{index}",
            index=index,
            uuid=uuid,
            node=self._node,
            model=maybe(lambda: _text(nv.nvmlDeviceGetName(handle))),
            pci_bus_id=maybe(lambda: _text(nv.nvmlDeviceGetPciInfo(handle).busId)),
            workloads=self._workloads(pids),
            utilization_pct=float(util) if util is not None and 0 <= util <= 100 else None,
            memory_used_bytes=int(memory.used) if memory is not None else None,
            memory_total_bytes=int(memory.total) if memory is not None else None,
            power_watts=power_mw / 1000.0 if power_mw is not None and power_mw >= 0 else None,
        )

    def _workloads(self, pids: Iterable[int]) -> tuple[Workload, ...]:
        if self._resolve is None:
            return ()
        found: dict[Workload, None] = {}
        for pid in dict.fromkeys(pids):
            try:
                text = (self._proc_root / str(pid) / "cgroup").read_text()
            except OSError:
                continue  # the process exited between NVML's list and now
            ref = parse_cgroup(text)
            workload = self._resolve(ref) if ref is not None else None
            if workload is not None:
                found[workload] = None
        return tuple(sorted(found))
