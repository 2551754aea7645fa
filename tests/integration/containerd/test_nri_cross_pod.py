"""Cross-pod injection (design §8): a sharer's container annotation naming a shadow pod's `main`.

Refused without PodResources; honoured when a real gRPC PodResources server (standing in for
kubelet) confirms the container holds those virtual IDs; refused when it does not.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpushare import keys
from gpushare.codecs import encode_devices_from
from gpushare.ids import virtual_ids_of
from localcluster.containerd import Containerd
from localcluster.cri import CriClient, CriError, Pod
from tests.harness.devices import FakeDevice
from tests.harness.plugin_process import PluginProcess
from tests.harness.podresources_server import PodResourcesServer
from tests.integration.containerd.common import GPU_ID, Seen, expected_node, probe, run_source

SHADOW = "shadow-t4-0"
RESOURCE = keys.share_resource(keys.KIND_SHARE, 4)
VIDS = virtual_ids_of(keys.DEFAULT_NAMESPACE, SHADOW, 4)


@pytest.fixture
def shadow(cri: CriClient, fake_gpu: FakeDevice) -> Iterator[Pod]:
    """A shadow pod on this node: labelled as a shadow, its `main` holds the (fake) GPU."""
    pod = cri.run_pod(
        SHADOW,
        keys.DEFAULT_NAMESPACE,
        labels={keys.LABEL_ROLE: keys.ROLE_SHADOW, keys.LABEL_SHARE_SPEC: "4", keys.LABEL_SHARE_KIND: keys.KIND_SHARE},
    )
    run_source(cri, pod, fake_gpu, name=keys.SHADOW_CONTAINER)
    yield pod
    cri.remove_pod(pod.id)


def _sharer(cri: CriClient, name: str, vids: list[str], *, mirror_on_pod: bool = False) -> tuple[Pod, dict[str, str]]:
    annotation = {keys.ANNOTATION_DEVICES_FROM: encode_devices_from(keys.DEFAULT_NAMESPACE, SHADOW, vids)}
    return cri.run_pod(name, "team-a", annotations=annotation if mirror_on_pod else {}), annotation


def test_refused_without_pod_resources(
    containerd: Containerd, cri: CriClient, shadow: Pod, fake_gpu: FakeDevice
) -> None:
    with PluginProcess.gpushare(containerd) as plugin:
        pod, annotation = _sharer(cri, "sharer-nopr", VIDS[:1])
        with pytest.raises(CriError) as info:
            cri.create_container(pod, "app", annotations=annotation)
        assert "gpushare:" in info.value.details and "PodResources" in info.value.details, info.value.details
        assert plugin.is_running()
        cri.remove_pod(pod.id)


@pytest.fixture
def podres_plugin(containerd: Containerd) -> Iterator[tuple[PodResourcesServer, PluginProcess]]:
    with (
        PodResourcesServer() as server,
        PluginProcess.gpushare(containerd, pod_resources_socket=server.socket) as plugin,
    ):
        yield server, plugin


def test_accepted_when_pod_resources_confirms(
    cri: CriClient, shadow: Pod, fake_gpu: FakeDevice, podres_plugin: tuple[PodResourcesServer, PluginProcess]
) -> None:
    server, plugin = podres_plugin
    server.allocate("team-a", "sharer-ok", "app", RESOURCE, VIDS[1:2])
    pod, annotation = _sharer(cri, "sharer-ok", VIDS[1:2])
    mark = plugin.mark()
    app = cri.run_container(pod, "app", annotations=annotation)
    assert "decision=inject" in plugin.wait_for("container=app", since=mark)
    assert probe(cri, app, fake_gpu) == Seen(expected_node(fake_gpu), True, True, GPU_ID)
    assert sum(server.calls.values()) >= 1  # the plugin really asked
    cri.remove_pod(pod.id)


@pytest.mark.parametrize("variant", ["other-ids", "not-allocated", "mirrored-on-pod", "not-a-shadow"])
def test_refused_when_not_confirmed(
    cri: CriClient,
    shadow: Pod,
    fake_gpu: FakeDevice,
    podres_plugin: tuple[PodResourcesServer, PluginProcess],
    variant: str,
) -> None:
    server, plugin = podres_plugin
    name = f"sharer-{variant}"
    if variant == "other-ids":
        server.allocate("team-a", name, "app", RESOURCE, VIDS[3:4])  # holds slot 3, claims slot 2
    elif variant != "not-allocated":
        server.allocate("team-a", name, "app", RESOURCE, VIDS[2:3])
    if variant == "not-a-shadow":  # same name in another namespace, no shadow label
        fake = cri.run_pod(SHADOW, "team-b")
        run_source(cri, fake, fake_gpu, name=keys.SHADOW_CONTAINER)
        annotation = {keys.ANNOTATION_DEVICES_FROM: encode_devices_from("team-b", SHADOW, [f"team-b/{SHADOW}-2"])}
        server.allocate("team-a", name, "app", RESOURCE, [f"team-b/{SHADOW}-2"])
        pod = cri.run_pod(name, "team-a")
    else:
        pod, annotation = _sharer(cri, name, VIDS[2:3], mirror_on_pod=variant == "mirrored-on-pod")
    mark = plugin.mark()
    with pytest.raises(CriError) as info:
        cri.create_container(pod, "app", annotations=annotation)
    assert "gpushare:" in info.value.details, info.value.details
    assert "decision=refuse" in plugin.wait_for("container=app", since=mark)
    # The same pod's other containers are unaffected.
    assert cri.exec_sync(cri.run_container(pod, "bystander"), ["true"]).exit_code == 0
    cri.remove_pod(pod.id)
    if variant == "not-a-shadow":
        cri.remove_pod(fake.id)
