"""Shared steps of the NRI tests: a source container holding a fake GPU, and probes of a container."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from gpushare import keys
from localcluster.containerd import Containerd
from localcluster.cri import CriClient, DeviceSpec, Pod
from nri_plugin import Injector, Stub
from tests.harness.devices import FakeDevice

GPU_PATH = "/dev/fakegpu0"
VISIBLE = "NVIDIA_VISIBLE_DEVICES"
GPU_ID = "GPU-fake-0"

# Type and numbers of the node, an open for read-write (refused unless the device cgroup allows it),
# then the container's device cgroup rules (cgroup v1 on this machine).
PROBE = ["sh", "-c", f"stat -c '%F %t:%T' {GPU_PATH} && exec 3<>{GPU_PATH} && cat /sys/fs/cgroup/devices/devices.list"]


def same_pod_annotation(target: str, source: str) -> dict[str, str]:
    return {f"{keys.POD_ANNOTATION_DEVICES_FROM_PREFIX}{target}": source}


def run_source(cri: CriClient, pod: Pod, dev: FakeDevice, name: str = "main", path: str = GPU_PATH) -> str:
    """A container given the fake GPU the way kubelet gives a device plugin's device: CRI Devices + env."""
    return cri.run_container(pod, name, devices=[DeviceSpec(path, str(dev.path))], envs={VISIBLE: GPU_ID})


@dataclass(frozen=True)
class Seen:
    """What a container sees of the fake GPU."""

    node: str  # "character special file a:e" or "" when absent
    can_open: bool
    cgroup_allows: bool
    visible_env: str | None


def probe(cri: CriClient, container_id: str, dev: FakeDevice) -> Seen:
    res = cri.exec_sync(container_id, PROBE)
    lines = res.stdout.splitlines()
    node = lines[0] if lines and lines[0].startswith("character") else ""
    env = cri.exec_sync(container_id, ["sh", "-c", f'echo "${{{VISIBLE}-<unset>}}"']).stdout.strip()
    return Seen(
        node=node,
        can_open=res.exit_code == 0,
        cgroup_allows=f"c {dev.major}:{dev.minor} rw" in res.stdout,
        visible_env=None if env == "<unset>" else env,
    )


def expected_node(dev: FakeDevice) -> str:
    return f"character special file {dev.major:x}:{dev.minor:x}"


@contextlib.contextmanager
def connected_stub(containerd: Containerd, injector: Injector) -> Iterator[Stub]:
    """The in-process plugin serving ``injector``, connected to this containerd until the block ends."""
    stub = Stub(injector, socket_path=containerd.nri_socket)
    stop = threading.Event()
    thread = threading.Thread(target=stub.run, args=(stop,), name="gpushare-nri-run")
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while stub.connections == 0:
            assert time.monotonic() < deadline, "the NRI plugin did not connect to containerd"
            time.sleep(0.05)
        yield stub
    finally:
        stop.set()
        stub.close()
        thread.join(10)
