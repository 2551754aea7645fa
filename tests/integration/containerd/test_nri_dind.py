"""DinD: the same-pod pod annotation gives container `dind` the devices of container `main`.

Real containerd + runc + `gpushare nri run`; the GPU is a fake char node (tests.harness.devices).
"""

from __future__ import annotations

import pytest

from localcluster.cri import CriClient, CriError
from tests.harness.devices import FakeDevice
from tests.harness.plugin_process import PluginProcess
from tests.integration.containerd.common import (
    GPU_ID,
    Seen,
    expected_node,
    probe,
    run_source,
    same_pod_annotation,
)


@pytest.mark.parametrize("source", ["main", "_/_/main"], ids=["short-form", "long-form"])
def test_dind_gets_main_devices(cri: CriClient, plugin: PluginProcess, fake_gpu: FakeDevice, source: str) -> None:
    pod = cri.run_pod(f"dind-{'long' if '/' in source else 'short'}", annotations=same_pod_annotation("dind", source))
    main = run_source(cri, pod, fake_gpu)
    mark = plugin.mark()
    dind = cri.run_container(pod, "dind")
    sidecar = cri.run_container(pod, "sidecar")  # not named by the annotation: untouched

    line = plugin.wait_for("container=dind", since=mark)
    assert "decision=inject" in line and "devices=1" in line, line
    want = Seen(expected_node(fake_gpu), can_open=True, cgroup_allows=True, visible_env=GPU_ID)
    assert probe(cri, main, fake_gpu) == want
    assert probe(cri, dind, fake_gpu) == want
    assert probe(cri, sidecar, fake_gpu) == Seen("", False, False, None)
    cri.remove_pod(pod.id)


def test_without_annotation_dind_gets_nothing(cri: CriClient, plugin: PluginProcess, fake_gpu: FakeDevice) -> None:
    pod = cri.run_pod("dind-none")
    run_source(cri, pod, fake_gpu)
    dind = cri.run_container(pod, "dind")
    assert probe(cri, dind, fake_gpu) == Seen("", can_open=False, cgroup_allows=False, visible_env=None)
    assert plugin.is_running()
    cri.remove_pod(pod.id)


def test_target_before_source_is_refused_then_converges(
    cri: CriClient, plugin: PluginProcess, fake_gpu: FakeDevice
) -> None:
    """kubelet creates containers in order and retries a failed one: dind first fails, then works."""
    pod = cri.run_pod("dind-early", annotations=same_pod_annotation("dind", "main"))
    with pytest.raises(CriError) as info:
        cri.create_container(pod, "dind")
    assert "gpushare:" in info.value.details and '"main"' in info.value.details, info.value.details
    assert "not created yet" in info.value.details
    run_source(cri, pod, fake_gpu)
    dind = cri.run_container(pod, "dind")  # the retry
    assert probe(cri, dind, fake_gpu).cgroup_allows
    cri.remove_pod(pod.id)


def test_removed_source_is_forgotten(cri: CriClient, plugin: PluginProcess, fake_gpu: FakeDevice) -> None:
    """The plugin follows RemoveContainer: a removed source no longer lends its devices."""
    pod = cri.run_pod("dind-removed", annotations=same_pod_annotation("dind", "main"))
    main = run_source(cri, pod, fake_gpu)
    cri.stop_container(main)
    cri.remove_container(main)
    with pytest.raises(CriError) as info:
        cri.create_container(pod, "dind")
    assert '"main"' in info.value.details and "not created yet" in info.value.details, info.value.details
    cri.remove_pod(pod.id)
