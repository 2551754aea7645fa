"""NRI reconnect: containerd restarted under the plugin; the plugin reconnects and keeps adjusting pods."""

from __future__ import annotations

import time

import pytest

from localcluster.containerd import Containerd
from localcluster.cri import CriClient
from tests.harness.devices import FakeDevice
from tests.harness.plugin_process import READY_LINE, PluginProcess
from tests.integration.containerd.common import probe, run_source, same_pod_annotation


@pytest.mark.parametrize("down_s", [0.0, 3.0], ids=["restart", "down-3s"])
def test_plugin_reconnects_after_containerd_restart(
    containerd: Containerd, cri: CriClient, plugin: PluginProcess, fake_gpu: FakeDevice, down_s: float
) -> None:
    """Restarted at once, or down long enough for the plugin's connect back-off to grow."""
    before = cri.run_pod(f"before-restart-{int(down_s)}", annotations=same_pod_annotation("dind", "main"))
    run_source(cri, before, fake_gpu)
    mark, registered = plugin.mark(), plugin.registrations()

    containerd.stop()
    time.sleep(down_s)
    containerd.start()
    plugin.wait_for(READY_LINE, since=mark, timeout_s=30)  # a new registration + Synchronize
    plugin.wait_registered(more_than=registered)  # and containerd has added it
    assert plugin.is_running()

    with CriClient(containerd.address, cgroup_parent=containerd.cgroup_parent) as fresh:
        pod = fresh.run_pod(f"after-restart-{int(down_s)}", annotations=same_pod_annotation("dind", "main"))
        run_source(fresh, pod, fake_gpu)
        assert probe(fresh, fresh.run_container(pod, "dind"), fake_gpu).cgroup_allows
        # A source created before the restart is known again from Synchronize.
        assert probe(fresh, fresh.run_container(before, "dind"), fake_gpu).cgroup_allows
        fresh.remove_pod(pod.id)
        fresh.remove_pod(before.id)
