"""The optional NVML source: cgroup attribution, unknowns, and clear failures without a driver.

The GPU is what we fake (a stand-in ``pynvml`` module); /proc is a real directory tree.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from controller.errors import MetricsError
from controller.metrics.adapters import Workload
from controller.metrics.nvml import ContainerRef, NvmlSource, parse_cgroup

CID = "a" * 64
CID2 = "0123456789abcdef" * 4
UID = "1b2c3d4e-0000-4111-8222-333344445555"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # cgroup v1, cgroupfs driver
        (
            f"12:devices:/kubepods/besteffort/pod{UID}/{CID}\n11:cpu:/kubepods/besteffort/pod{UID}/{CID}\n",
            ContainerRef(CID, UID),
        ),
        # guaranteed QoS has no class directory
        (f"4:memory:/kubepods/pod{UID}/{CID}\n", ContainerRef(CID, UID)),
        # cgroup v2, systemd driver, containerd
        (
            f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice/"
            f"cri-containerd-{CID}.scope\n",
            ContainerRef(CID, UID),
        ),
        # CRI-O and Docker scopes
        (f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/crio-{CID2}.scope\n", ContainerRef(CID2, UID)),
        (f"0::/system.slice/docker-{CID2}.scope\n", ContainerRef(CID2, None)),
        # a host process, and CRI-O's conmon (not a container)
        ("0::/user.slice/user-0.slice/session-1.scope\n", None),
        (f"0::/kubepods.slice/crio-conmon-{CID}.scope\n", None),
        ("garbage\n\n", None),
    ],
)
def test_parse_cgroup(text: str, expected: ContainerRef | None) -> None:
    assert parse_cgroup(text) == expected


class FakeNvml:
    """The pynvml surface NvmlSource uses; two GPUs, GPU 1 without power readings."""

    class NVMLError(Exception):
        pass

    def __init__(self, init_error: bool = False) -> None:
        self.init_error = init_error
        self.shutdowns = 0
        self.gpus = [
            {
                "uuid": b"GPU-aaa",
                "util": 42,
                "used": 10 << 30,
                "total": 80 << 30,
                "power": 312_500,
                "pids": [101, 102, 103],
            },
            {"uuid": "GPU-bbb", "util": 0, "used": 1 << 20, "total": 80 << 30, "power": None, "pids": []},
        ]

    def nvmlInit(self) -> None:  # noqa: N802 (pynvml's names)
        if self.init_error:
            raise self.NVMLError("Driver Not Loaded")

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> dict[str, Any]:  # noqa: N802
        return self.gpus[i]

    def nvmlDeviceGetUUID(self, h: dict[str, Any]) -> Any:  # noqa: N802
        return h["uuid"]

    def nvmlDeviceGetName(self, h: dict[str, Any]) -> str:  # noqa: N802
        return "NVIDIA H100"

    def nvmlDeviceGetPciInfo(self, h: dict[str, Any]) -> Any:  # noqa: N802
        return SimpleNamespace(busId=b"00000000:18:00.0")

    def nvmlDeviceGetUtilizationRates(self, h: dict[str, Any]) -> Any:  # noqa: N802
        return SimpleNamespace(gpu=h["util"], memory=0)

    def nvmlDeviceGetMemoryInfo(self, h: dict[str, Any]) -> Any:  # noqa: N802
        return SimpleNamespace(used=h["used"], total=h["total"], free=h["total"] - h["used"])

    def nvmlDeviceGetPowerUsage(self, h: dict[str, Any]) -> int:  # noqa: N802
        if h["power"] is None:
            raise self.NVMLError("Not Supported")
        return int(h["power"])

    def nvmlDeviceGetComputeRunningProcesses(self, h: dict[str, Any]) -> list[Any]:  # noqa: N802
        return [SimpleNamespace(pid=p, usedGpuMemory=1) for p in h["pids"]]

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: dict[str, Any]) -> list[Any]:  # noqa: N802
        raise self.NVMLError("Not Supported")


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    (tmp_path / "101").mkdir()
    (tmp_path / "101" / "cgroup").write_text(f"0::/kubepods/besteffort/pod{UID}/{CID}\n")
    (tmp_path / "102").mkdir()
    (tmp_path / "102" / "cgroup").write_text("0::/system.slice/sshd.service\n")
    # 103 has exited: no directory
    return tmp_path


def test_devices_with_pods_attributed_through_cgroups(proc: Path) -> None:
    seen: list[ContainerRef] = []

    def resolve(ref: ContainerRef) -> Workload | None:
        seen.append(ref)
        return Workload("team-ml", "trainer-0", "main") if ref.pod_uid == UID else None

    nv = FakeNvml()
    gpu0, gpu1 = NvmlSource(resolve, node="n1", proc_root=proc, nvml=nv).read()
    assert seen == [ContainerRef(CID, UID)]
    assert (gpu0.device_id, gpu0.index, gpu0.uuid, gpu0.node, gpu0.pci_bus_id) == (
        "GPU-aaa",
        0,
        "GPU-aaa",
        "n1",
        "00000000:18:00.0",
    )
    assert (gpu0.utilization_pct, gpu0.memory_used_bytes, gpu0.memory_total_bytes, gpu0.power_watts) == (
        42.0,
        10 << 30,
        80 << 30,
        312.5,
    )
    assert gpu0.workloads == (Workload("team-ml", "trainer-0", "main"),)
    # Not supported is unknown, not 0; the rest of the device still counts.
    assert (gpu1.power_watts, gpu1.utilization_pct, gpu1.workloads) == (None, 0.0, ())
    assert nv.shutdowns == 1


def test_without_a_resolver_no_pod_is_named(proc: Path) -> None:
    (gpu0, _) = NvmlSource(proc_root=proc, nvml=FakeNvml()).read()
    assert gpu0.workloads == ()


def test_init_failure_is_a_clear_metrics_error() -> None:
    with pytest.raises(MetricsError, match=r"NVML could not start \(Driver Not Loaded\).*NVIDIA driver"):
        NvmlSource(nvml=FakeNvml(init_error=True)).read()


def test_missing_nvidia_ml_py_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    with pytest.raises(MetricsError, match=r"nvidia-ml-py, which is not installed; pip install 'gpushare\[nvml\]'"):
        NvmlSource().read()


def test_this_machine_fails_clearly_without_a_driver() -> None:
    # Real: the installed pynvml (when the nvml extra is present) on this machine. Without a driver
    # (CI) the failure must say what is missing; with one, the read must give NVIDIA devices.
    try:
        devices = NvmlSource().read()
    except MetricsError as err:
        message = str(err)
        assert "NVML could not start" in message or "nvidia-ml-py, which is not installed" in message
    else:
        assert all(d.vendor == "nvidia" and d.device_id for d in devices)
