"""Bad NRI instructions: each refused instruction fails only its own container, with a clear message.

After every refusal the test checks that the rest of the pod is unaffected (the source keeps its
device, a bystander container is created and starts) and that the plugin is still connected (no
reconnect logged, and a valid instruction afterwards is honoured).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from gpushare import keys
from localcluster.cri import CriClient, CriError, DeviceSpec, Pod
from tests.harness.devices import FakeDevice, make_fake_device
from tests.harness.plugin_process import PluginProcess
from tests.integration.containerd.common import GPU_ID, probe, run_source, same_pod_annotation

ONE_MIB = 1024 * 1024


@dataclass(frozen=True)
class Case:
    pod_annotations: dict[str, str]
    container_annotations: dict[str, str]
    setup: Callable[[CriClient, Pod, FakeDevice], None]  # creates the source side
    message: tuple[str, ...]  # fragments the CreateContainer error must contain


def _main_with_gpu(cri: CriClient, pod: Pod, dev: FakeDevice) -> None:
    run_source(cri, pod, dev)


def _main_outside_dev(cri: CriClient, pod: Pod, dev: FakeDevice) -> None:
    # No visibility variable either: with one, a runtime could still add the GPU, and main would be a source.
    cri.run_container(pod, "main", devices=[DeviceSpec("/opt/fakegpu0", str(dev.path))])


def _main_block_device(cri: CriClient, pod: Pod, dev: FakeDevice) -> None:
    with make_fake_device("fakedisk0", block=True) as disk:
        cri.run_container(pod, "main", devices=[DeviceSpec("/dev/fakedisk0", str(disk.path))])


def _main_without_devices(cri: CriClient, pod: Pod, dev: FakeDevice) -> None:
    # A variable gpushare does not carry is no GPU (VISIBLE itself would be: a runtime may read it).
    cri.run_container(pod, "main", envs={"NOT_A_GPU": GPU_ID})


CASES = {
    "malformed-json": Case(
        {}, {keys.ANNOTATION_DEVICES_FROM: '{"gpushare-system/shadow/main": '}, _main_with_gpu, ("not valid JSON",)
    ),
    "unknown-source": Case(same_pod_annotation("dind", "sidecar"), {}, _main_with_gpu, ('"sidecar"',)),
    "other-pod-from-pod-annotation": Case(
        same_pod_annotation("dind", "other-ns/other-pod/main"), {}, _main_with_gpu, ("not a container of this pod",)
    ),
    "device-not-under-dev": Case(
        same_pod_annotation("dind", "main"), {}, _main_outside_dev, ("/opt/fakegpu0", "not under /dev")
    ),
    "block-device": Case(same_pod_annotation("dind", "main"), {}, _main_block_device, ("/dev/fakedisk0", "block")),
    "one-mib-annotation": Case(
        {},
        {keys.ANNOTATION_DEVICES_FROM: json.dumps({"gpushare-system/shadow/main": {"*": ["x" * ONE_MIB]}})},
        _main_with_gpu,
        ("limit",),
    ),
    "one-mib-pod-annotation": Case(
        same_pod_annotation("dind", "m" * ONE_MIB), {}, _main_with_gpu, ("container-devices-from.dind",)
    ),
    "source-without-devices": Case(
        same_pod_annotation("dind", "main"), {}, _main_without_devices, ('"main"', "no character device")
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_refused_only_that_container(cri: CriClient, plugin: PluginProcess, fake_gpu: FakeDevice, case: Case) -> None:
    pod = cri.run_pod("bad-input", annotations=case.pod_annotations)
    case.setup(cri, pod, fake_gpu)
    mark = plugin.mark()

    with pytest.raises(CriError) as info:
        cri.create_container(pod, "dind", annotations=case.container_annotations)
    details = info.value.details
    assert "gpushare:" in details, details
    for fragment in case.message:
        assert fragment in details, f"{fragment!r} not in the error: {details[:400]}"
    assert len(details) < 4096, "the message must stay readable (no echo of a 1 MiB annotation)"
    assert "decision=refuse" in plugin.wait_for("container=dind", since=mark)

    # Only that container failed: the rest of the pod is created and runs as before.
    bystander = cri.run_container(pod, "bystander")
    assert cri.exec_sync(bystander, ["true"]).exit_code == 0
    assert "main" not in pod.containers or probe(cri, pod.containers["main"], fake_gpu).can_open == (
        case.setup is _main_with_gpu
    )
    cri.remove_pod(pod.id)
    # ...and the plugin stayed connected and keeps deciding.
    assert plugin.is_running()
    assert not [line for line in plugin.lines[mark:] if "disconnected" in line]
    good = cri.run_pod("after-bad-input", annotations=same_pod_annotation("dind", "main"))
    run_source(cri, good, fake_gpu)
    assert probe(cri, cri.run_container(good, "dind"), fake_gpu).cgroup_allows
    cri.remove_pod(good.id)
