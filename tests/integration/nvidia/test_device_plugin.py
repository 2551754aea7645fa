"""NVIDIA's device plugin v0.17.4 on the mock NVML, registering with a kubelet stand-in.

The plugin enumerates the fake root's GPUs through the mock, registers ``nvidia.com/gpu`` with the
KubeletPeer (tests/integration/kubelet_peer/peer.py: what kubelet's device manager does on the
wire), and answers ListAndWatch, Allocate and GetPreferredAllocation as on a node with 8 A100s.
Its health check waits in ``nvmlEventSetWait_v2``, so an XID fired into the root reaches it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cli.doctor.diagnosis import ContainerdFact, Status, check_nvidia
from cli.doctor.socket_probe import probe_kubelet, probe_nvidia_plugin
from controller.core.actions import RecordEvent, SetDevices
from controller.core.mapping import MappingCache
from controller.core.real_devices import kubelet_real_devices
from controller.io.podresources import PodResourcesClient
from controller.share.solver import plan_node_shares
from deviceplugins import PluginManager
from deviceplugins.policies import AdvertisedDevice, spot_devices
from fakenvidia.driver_root import DriverRoot
from fakenvidia.health import fire_xid, wait_delivered
from gpushare import keys
from gpushare.config import Config
from gpushare.ids import format_spot_id
from localcluster.paths import NvidiaBinaries
from tests.harness.podresources_server import PodResourcesServer
from tests.integration.kubelet_peer.peer import KubeletPeer
from tests.integration.nvidia.conftest import GPU_COUNT, binary_env
from tests.integration.nvidia.device_plugin import RESOURCE, PluginProcess, device_plugin
from tests.unit.controller.podmaker import NODE, row, shadow, snap

pytestmark = pytest.mark.integration

ENVVAR = "--device-list-strategy=envvar"
NVML_PLATFORM = "--device-discovery-strategy=nvml"
# Generous: these bound a wait on a loaded 2-core machine, they are not what is tested.
REGISTER_S = 60.0
EVENT_S = 60.0
# XID 79 (GPU fallen off the bus) is critical; 13 (graphics engine exception) is one the plugin
# takes for an application's fault and ignores (its internal/rm/health.go).
CRITICAL_XID = 79
APPLICATION_XID = 13


@pytest.fixture
def plugin_dir() -> Iterator[str]:
    # Short, under /tmp: a unix socket's path must fit in 107 bytes.
    path = tempfile.mkdtemp(prefix="gs-nvdp-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def kubelet(plugin_dir: str) -> Iterator[KubeletPeer]:
    peer = KubeletPeer(plugin_dir)
    peer.start()
    yield peer
    peer.stop()


Starter = Callable[..., contextlib.AbstractContextManager[PluginProcess]]


@pytest.fixture
def start_plugin(nvidia: NvidiaBinaries, driver_root: DriverRoot, kubelet: KubeletPeer, tmp_path: Path) -> Starter:
    """``start_plugin(*flags, env=...)``: the plugin for this module's root, with the test's kubelet."""
    return functools.partial(device_plugin, nvidia, driver_root, kubelet.dir, tmp_path / "plugin.log")


@pytest.fixture
def plugin(start_plugin: Starter, kubelet: KubeletPeer) -> Iterator[PluginProcess]:
    """The plugin, registered and listing every GPU; a test that stops it checks its exit itself."""
    with start_plugin(ENVVAR, NVML_PLATFORM) as running:
        registered(kubelet, running)
        yield running
        assert running.proc.poll() is None, f"the plugin exited ({running.proc.returncode}):\n{running.log_text()}"


def registered(kubelet: KubeletPeer, plugin: PluginProcess) -> list[tuple[str, str]]:
    """Waits for the plugin's registration and a full device list; fails with the plugin's log, at
    once if the plugin exits (it does on any init error: --fail-on-init-error is its default)."""
    deadline = time.monotonic() + REGISTER_S
    while not kubelet.registered(RESOURCE):
        exited = plugin.proc.poll()
        if exited is not None or time.monotonic() > deadline:
            why = f"exited ({exited})" if exited is not None else f"did not register within {REGISTER_S} s"
            raise AssertionError(f"the plugin {why}; its log:\n{plugin.log_text()[-6000:]}")
        time.sleep(0.05)
    try:
        return kubelet.wait_devices(RESOURCE, lambda devices: len(devices) == GPU_COUNT, timeout_s=REGISTER_S)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nplugin log:\n{plugin.log_text()[-6000:]}") from None


@pytest.mark.parametrize(
    "finding",
    ["LD_LIBRARY_PATH", NVML_PLATFORM],
)
def test_registers_nvidia_gpu_and_lists_every_mock_gpu_healthy(
    finding: str, start_plugin: Starter, driver_root: DriverRoot, kubelet: KubeletPeer, gpu_uuids: list[str]
) -> None:
    # The plugin's platform check dlopens plain libnvidia-ml.so.1 (go-nvlib's HasNvml): either the
    # root's library directory is on the search path, or the platform is named and the check skipped.
    if finding == "LD_LIBRARY_PATH":
        flags, env = [ENVVAR], binary_env(LD_LIBRARY_PATH=str(driver_root.lib_dir))
    else:
        flags, env = [ENVVAR, finding], binary_env()
    with start_plugin(*flags, env=env) as plugin:
        devices = registered(kubelet, plugin)
        [registration] = kubelet.registered(RESOURCE)
        assert registration.version == "v1beta1"
        assert registration.endpoint == "nvidia-gpu.sock"
        assert registration.options.get_preferred_allocation_available
        assert registration.options_rpc.get_preferred_allocation_available
        assert sorted(devices) == sorted((uuid, "Healthy") for uuid in gpu_uuids)
        assert plugin.proc.poll() is None, plugin.log_text()
        assert plugin.stop() == 0, plugin.log_text()
    log = plugin.log_text()
    assert f"Registered device plugin for '{RESOURCE}' with Kubelet" in log
    assert 'Received signal "terminated", shutting down.' in log


def test_allocate_hands_the_runtime_the_uuids_in_nvidia_visible_devices(
    plugin: PluginProcess, kubelet: KubeletPeer, gpu_uuids: list[str]
) -> None:
    wanted = [gpu_uuids[5], gpu_uuids[2]]
    response = kubelet.allocate(RESOURCE, wanted)
    # The envvar strategy: the legacy runtime hook reads the list; no device nodes or mounts are passed.
    assert set(response.envs) == {"NVIDIA_VISIBLE_DEVICES"}
    assert sorted(response.envs["NVIDIA_VISIBLE_DEVICES"].split(",")) == sorted(wanted)
    assert list(response.devices) == []
    assert list(response.mounts) == []
    assert dict(response.annotations) == {}


def test_preferred_allocations_follow_the_mocks_pcie_topology(
    plugin: PluginProcess, kubelet: KubeletPeer, gpu_uuids: list[str]
) -> None:
    # The mock's topology: GPUs 2k and 2k+1 share a PCIe switch, 0-3 and 4-7 a CPU socket
    # (docs/fakenvidia.md); go-gpuallocator scores candidate sets by it.
    index = {uuid: i for i, uuid in enumerate(gpu_uuids)}

    def preferred(available: list[int], must: list[int], size: int) -> set[int]:
        got = kubelet.preferred(RESOURCE, [gpu_uuids[i] for i in available], [gpu_uuids[i] for i in must], size)
        assert len(got) == size, got
        return {index[uuid] for uuid in got}

    every = list(range(GPU_COUNT))
    assert preferred(every, [], 2) in [{0, 1}, {2, 3}, {4, 5}, {6, 7}]
    assert preferred(every, [6], 2) == {6, 7}
    assert preferred(every, [], 4) in [{0, 1, 2, 3}, {4, 5, 6, 7}]
    with_1 = preferred(every, [1], 3)
    assert {0, 1} < with_1 < {0, 1, 2, 3}
    # Of these four, only 4 and 5 share a switch.
    assert preferred([0, 2, 4, 5], [], 2) == {4, 5}


def test_a_critical_xid_marks_its_gpu_unhealthy_and_an_application_xid_does_not(
    plugin: PluginProcess, kubelet: KubeletPeer, driver_root: DriverRoot, gpu_uuids: list[str]
) -> None:
    application = fire_xid(driver_root.events_dir, 5, APPLICATION_XID)
    assert wait_delivered(application, EVENT_S), f"XID {APPLICATION_XID} never taken:\n{plugin.log_text()}"
    # Fired second and delivered in order, so once GPU 3 is unhealthy the plugin has read both.
    critical = fire_xid(driver_root.events_dir, 3, CRITICAL_XID)
    assert wait_delivered(critical, EVENT_S), f"XID {CRITICAL_XID} never taken:\n{plugin.log_text()}"
    devices = kubelet.wait_devices(
        RESOURCE, lambda devices: dict(devices).get(gpu_uuids[3]) == "Unhealthy", timeout_s=EVENT_S
    )
    assert dict(devices) == {uuid: "Unhealthy" if i == 3 else "Healthy" for i, uuid in enumerate(gpu_uuids)}
    log = plugin.log_text()
    assert f"XidCriticalError: Xid={CRITICAL_XID} on Device={gpu_uuids[3]}; marking device as unhealthy." in log
    assert f"EventData:{APPLICATION_XID} " in log


def test_a_gpu_the_vendor_marks_unhealthy_turns_its_spot_and_share_slots_unhealthy(
    plugin: PluginProcess, kubelet: KubeletPeer, driver_root: DriverRoot, gpu_uuids: list[str]
) -> None:
    """A critical XID on GPU 3: NVIDIA's plugin tells kubelet (its one ListAndWatch stream), kubelet
    stops listing GPU 3 as allocatable, and gpushare, which reads that from PodResources exactly as
    the agent's pass does, turns ``spot-<GPU 3>`` and the share slots of the shadow holding GPU 3
    Unhealthy at kubelet, with a Warning Event saying why. gpushare opened no stream of its own on
    NVIDIA's socket, so kubelet's got the health change (docs/nvidia.md)."""

    def allocatable() -> dict[str, list[str]]:
        # kubelet's GetAllocatableResources: the plugin's devices it last listed Healthy.
        last = kubelet.wait_devices(RESOURCE, lambda devices: len(devices) == GPU_COUNT, timeout_s=EVENT_S)
        return {RESOURCE: [i for i, health in last if health == "Healthy"]}

    shadow_row = row("gpushare-system/s2", "main", RESOURCE, gpu_uuids[3])
    with (
        PodResourcesServer(allocatable=allocatable) as server,
        PodResourcesClient(server.socket, timeout_s=10.0) as podres,
    ):
        server.allocate("gpushare-system", "s2", "main", RESOURCE, [gpu_uuids[3]])
        manager = PluginManager.for_gpushare(kubelet.dir, share_specs=(2,), dev_share_specs=())
        manager.start()
        try:

            def learn() -> dict[str, str]:
                for resource, known in kubelet_real_devices(podres.allocatable(), [shadow_row], (RESOURCE,)).items():
                    manager.set_real_devices(resource, [AdvertisedDevice(i, ok) for i, ok in known])
                return manager.vendor_unhealthy()

            spot = format_spot_id(gpu_uuids[3])
            assert learn() == {}
            manager.set_spot_health(gpu_uuids[3], True)  # the owner of GPU 3 is away: lendable
            kubelet.wait_devices(
                keys.RESOURCE_SPOT_GPU, lambda devices: dict(devices).get(spot) == "Healthy", timeout_s=EVENT_S
            )
            critical = fire_xid(driver_root.events_dir, 3, CRITICAL_XID)
            assert wait_delivered(critical, EVENT_S), f"XID {CRITICAL_XID} never taken:\n{plugin.log_text()}"
            kubelet.wait_devices(
                RESOURCE, lambda devices: dict(devices).get(gpu_uuids[3]) == "Unhealthy", timeout_s=EVENT_S
            )
            unhealthy = learn()
            assert unhealthy == {
                gpu_uuids[3]: f"is not allocatable at kubelet (its {RESOURCE} device plugin lists it Unhealthy)"
            }
            kubelet.wait_devices(
                keys.RESOURCE_SPOT_GPU, lambda devices: dict(devices).get(spot) == "Unhealthy", timeout_s=EVENT_S
            )

            cfg = Config(node_name=NODE, share_specs=(2,), dev_share_specs=(), real_resources=(RESOURCE,))
            pods = [shadow("s2", 2, resource=RESOURCE)]
            snapshot = dataclasses.replace(snap(pods, cfg), vendor_unhealthy=unhealthy)
            mapping = MappingCache.rebuild([shadow_row], snapshot.pods, cfg.real_resources)
            actions = plan_node_shares(snapshot, mapping, cfg)
            [listed] = [a for a in actions if isinstance(a, SetDevices)]
            manager.set_devices(listed.resource, [AdvertisedDevice(i, i not in listed.unhealthy) for i in listed.ids])
            share = kubelet.wait_devices(listed.resource, lambda devices: len(devices) == 2, timeout_s=EVENT_S)
            assert dict(share) == {"gpushare-system/s2-0": "Unhealthy", "gpushare-system/s2-1": "Unhealthy"}
            [event] = [a for a in actions if isinstance(a, RecordEvent)]
            assert gpu_uuids[3] in event.message and event.reason == "GPUUnhealthy"
        finally:
            manager.stop()


TIME_SLICING = """version: v1
flags:
  migStrategy: none
sharing:
  timeSlicing:
    resources:
      - name: nvidia.com/gpu
        replicas: 4
"""


def test_the_vendors_time_slicing_replicas_are_shared_but_never_lent(
    start_plugin: Starter, kubelet: KubeletPeer, gpu_uuids: list[str], tmp_path: Path
) -> None:
    """NVIDIA's own sharing: with time-slicing the plugin lists 4 replicas of each GPU and hands any
    of them out as the whole GPU. A shadow holding one therefore holds a time slice of a GPU that
    three other pods may use too; spot offers no replica (one holder idle says nothing of the GPU),
    and `gpushare doctor` says both."""
    config = tmp_path / "time-slicing.yaml"
    config.write_text(TIME_SLICING)
    with start_plugin(ENVVAR, NVML_PLATFORM, f"--config-file={config}") as running:
        deadline = time.monotonic() + REGISTER_S
        while not kubelet.registered(RESOURCE):
            assert running.proc.poll() is None and time.monotonic() < deadline, running.log_text()[-4000:]
            time.sleep(0.05)
        devices = dict(kubelet.wait_devices(RESOURCE, lambda d: len(d) == GPU_COUNT * 4, timeout_s=REGISTER_S))
        assert set(devices) == {f"{u}::{n}" for u in gpu_uuids for n in range(4)}
        answer = kubelet.allocate(RESOURCE, [f"{gpu_uuids[3]}::2"])
        assert dict(answer.envs)["NVIDIA_VISIBLE_DEVICES"] == gpu_uuids[3]  # the whole GPU, for a slice of its time

        offered = spot_devices({RESOURCE: list(devices)}, dict.fromkeys(devices, True))
        assert offered.devices == () and len(offered.skipped) == GPU_COUNT * 4

        with PodResourcesServer(allocatable=lambda: {RESOURCE: list(devices)}) as server:
            kubelet_fact = probe_kubelet(kubelet.dir, server.socket)
        found = probe_nvidia_plugin(kubelet_fact, ("/var/run/nvidia-container-devices",))
        assert found is not None and (found.strategy, found.replicas) == ("envvar", True)
        check = check_nvidia(
            found, ContainerdFact(version="2.4.2", runtime_binary="/usr/bin/nvidia-container-runtime.cdi")
        )
        assert check.status is Status.WARN and "spot lends no replica" in check.summary, check
