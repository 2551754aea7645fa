"""A Synchronize over 16 MiB, made so by the environments of the node's pods, reaches a newly connected plugin.

Each test builds the node's state itself: pods whose containers carry about 1 MB of environment
each (the size of a Synchronize comes from what containerd knows of every pod and container),
and a created-but-not-started "pad" container whose one variable brings the Synchronize to an
exact size, measured by ``sync_probe`` (a throwaway plugin that reads the ttrpc headers as they
arrive). The limits are docs/nri.md's "How large a Synchronize can be":

- containerd 1.7.24 sends Synchronize as one message and can finish sending at most 16 MiB + 4086
  bytes; one byte more and it fails the send ("message too long").
- containerd 2.4.2 sends pieces of at most 4 MiB (``more=true`` on all but the last), shrinking
  them down to 4 pods + 4 containers; if such a piece is still over 4 MiB it gives up and closes
  the plugin's connection.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import pytest

from localcluster.containerd import Containerd
from localcluster.cri import CriClient, Pod
from tests.harness.devices import FakeDevice
from tests.harness.plugin_process import PluginProcess, gpushare_command
from tests.integration.containerd.common import expected_node, probe, run_source, same_pod_annotation
from tests.integration.containerd.sync_probe import SYNC_FAILED, SyncSize, measure_sync

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MIB = 1 << 20
MOST_1_7 = 16 * MIB + 4086  # the largest message containerd 1.7.24 can finish sending
PIECE_2X = 4 * MIB  # ttrpc's limit, which containerd 2.4.2 checks before it sends
ENV_VAR_MAX = 98_000  # per variable of a started container: Linux refuses an env string over 128 KiB
TOO_BIG_1_7 = "message too long"  # containerd 1.7's log, after SYNC_FAILED
TOO_BIG_2X = "failed to synchronize plugin with split messages"  # containerd 2.4.2's log, after SYNC_FAILED
PLUGIN_REFUSED_1_7 = "exceeds 16781302, the most a supported containerd can send"
PLUGIN_DROPPED_2X = "containerd closed the connection after Configure, before Synchronize completed"


def env_of(total: int, prefix: str) -> dict[str, str]:
    """Variables whose values add up to ``total`` bytes, none over ``ENV_VAR_MAX``."""
    out, i = {}, 0
    while total > 0:
        n = min(total, ENV_VAR_MAX)
        out[f"{prefix}_{i:02d}"] = "e" * n
        total -= n
        i += 1
    return out


def run_bulk(cri: CriClient, pods: int, env_bytes: int) -> list[Pod]:
    """``pods`` running pods, each with one container carrying ``env_bytes`` of environment."""
    out = []
    for i in range(pods):
        pod = cri.run_pod(f"bulk-{i:02d}")
        cri.run_container(pod, "app", envs=env_of(env_bytes, "BULK"))
        out.append(pod)
    return out


class Pad:
    """A pod with one created, never started container whose single variable sets the sync's size.

    Only the container is replaced, always with the same name and no process, so everything of
    the sync but that variable stays byte for byte the same between two settings."""

    def __init__(self, cri: CriClient) -> None:
        self.cri = cri
        self.pod = cri.run_pod("pad")
        self.env = 0
        self.container = ""

    def set(self, env_bytes: int) -> None:
        assert env_bytes > 0, f"pad would need {env_bytes} bytes of env; the bulk is too large"
        if self.container:
            self.cri.remove_container(self.container)
        self.container = self.cri.create_container(self.pod, "pad", envs={"PAD": "p" * env_bytes})
        self.env = env_bytes


def pad_to(containerd: Containerd, pad: Pad, target: int) -> SyncSize:
    """Bring the one-message Synchronize to exactly ``target`` bytes of ttrpc data, measured."""
    size = measure_sync(containerd)
    for _ in range(6):
        assert len(size.lengths) == 1, f"expected one Synchronize message, got {size}"
        if size.lengths[0] == target:
            return size
        pad.set(pad.env + target - size.lengths[0])
        size = measure_sync(containerd)
    raise AssertionError(f"could not bring the Synchronize to {target} bytes; last {size}")


def connected_line(plugin: PluginProcess, since: int) -> tuple[int, int]:
    """(sync_messages, sync_bytes) of the plugin's 'nri: connected' line."""
    line = plugin.wait_for("nri: connected", since=since, timeout_s=30)
    found = re.search(r"sync_messages=(\d+) sync_bytes=(\d+)", line)
    assert found, line
    return int(found.group(1)), int(found.group(2))


def log_since(containerd: Containerd, mark: int) -> str:
    return containerd.log_text()[mark:]


def wait_log(containerd: Containerd, mark: int, needle: str, timeout_s: float = 30.0) -> str:
    deadline = time.monotonic() + timeout_s
    while needle not in (text := log_since(containerd, mark)):
        assert time.monotonic() < deadline, f"containerd did not log {needle!r}; it logged:\n{text[-3000:]}"
        time.sleep(0.1)
    return text


def dind_pod(cri: CriClient, name: str, dev: FakeDevice) -> Pod:
    pod = cri.run_pod(name, annotations=same_pod_annotation("dind", "main"))
    run_source(cri, pod, dev)
    return pod


def assert_injected(cri: CriClient, pod: Pod, dev: FakeDevice) -> None:
    seen = probe(cri, cri.run_container(pod, "dind"), dev)
    assert seen.node == expected_node(dev) and seen.can_open and seen.cgroup_allows, seen


def assert_not_injected(cri: CriClient, pod: Pod, dev: FakeDevice) -> None:
    seen = probe(cri, cri.run_container(pod, "dind"), dev)
    assert seen.node == "" and not seen.cgroup_allows and seen.visible_env is None, seen


@pytest.fixture
def node(containerd: Containerd, cri: CriClient) -> Iterator[CriClient]:
    """The module's containerd with no pods, before and after the test."""
    for pod_id in cri.list_pod_ids():
        cri.remove_pod(pod_id)
    yield cri
    for pod_id in cri.list_pod_ids():
        cri.remove_pod(pod_id)


def unready_plugin(containerd: Containerd) -> PluginProcess:
    """`gpushare nri run` started without waiting for it to connect (it is expected not to)."""
    proc = PluginProcess(gpushare_command(containerd.nri_socket), ready_line=None)
    proc.start()
    return proc


def is_1_7(containerd: Containerd) -> bool:
    return containerd.install.version.startswith("1.7")


def test_synchronize_over_16_mib_reaches_a_newly_connected_plugin(
    containerd: Containerd, node: CriClient, fake_gpu: FakeDevice
) -> None:
    """17 pods with 980 kB of env each, a DinD pod and the pad: the plugin started now gets it all.

    On 1.7.24 the pad makes it exactly the largest message containerd can send; on 2.4.2 it
    comes in pieces of at most 4 MiB, and the plugin collects them."""
    cri = node
    started = time.monotonic()
    source = dind_pod(cri, "big-sync", fake_gpu)  # its main is known to the plugin only from Synchronize
    run_bulk(cri, 17, 980_000)
    pad = Pad(cri)
    pad.set(1000)
    built = time.monotonic()
    if is_1_7(containerd):
        size = pad_to(containerd, pad, MOST_1_7)
        assert size.complete and size.lengths == (MOST_1_7,)
    else:
        size = measure_sync(containerd)
        assert size.complete and len(size.lengths) > 4 and max(size.lengths) <= PIECE_2X, size
    assert size.total > 16 * MIB
    measured = time.monotonic()

    with PluginProcess.gpushare(containerd) as plugin:
        messages, payload = connected_line(plugin, 0)
        # 2.4.2 cuts its pieces again for each plugin (its listing's order varies), so only "several".
        assert (messages == 1 if is_1_7(containerd) else messages > 4) and payload > 16 * MIB
        plugin.wait_for("nri: synchronized pods=19 containers=19")
        assert_injected(cri, source, fake_gpu)
    print(
        f"\nsync {size.lengths} total {size.total}; build {built - started:.1f}s, "
        f"measure {measured - built:.1f}s, plugin {time.monotonic() - measured:.1f}s"
    )


def test_synchronize_containerd_cannot_send(containerd: Containerd, node: CriClient, fake_gpu: FakeDevice) -> None:
    """What an operator sees when containerd fails the Synchronize, and the bound on each side of its edge."""
    if is_1_7(containerd):
        _cannot_send_1_7(containerd, node, fake_gpu)
    else:
        _cannot_send_2x(containerd, node, fake_gpu)


def _cannot_send_1_7(containerd: Containerd, cri: CriClient, dev: FakeDevice) -> None:
    run_bulk(cri, 17, 980_000)
    pad = Pad(cri)
    pad.set(1000)
    size = pad_to(containerd, pad, MOST_1_7 + 1)
    assert not size.complete and size.lengths == (MOST_1_7 + 1,)

    mark = len(containerd.log_text())
    plugin = unready_plugin(containerd)
    try:
        refused = plugin.wait_for(PLUGIN_REFUSED_1_7, timeout_s=30)
        assert "connect failed" in refused and f"message of {MOST_1_7 + 1} bytes" in refused
        text = wait_log(containerd, mark, TOO_BIG_1_7)
        failed = re.search(rf".*{SYNC_FAILED}: .*{TOO_BIG_1_7}.*", text)
        assert failed, text[-3000:]
        print(f"\nplugin: {refused}\ncontainerd: {failed.group(0)}")
        # 1.7 has no validator: a container created now starts, without its device.
        outage = dind_pod(cri, "outage", dev)
        assert_not_injected(cri, outage, dev)
        assert "nri: connected" not in "\n".join(plugin.lines)
    finally:
        plugin.stop()

    # One byte less is what containerd can send: the plugin connects and injects.
    cri.remove_pod(outage.id)
    size = pad_to(containerd, pad, MOST_1_7)
    assert size.complete
    with PluginProcess.gpushare(containerd) as plugin:
        assert connected_line(plugin, 0)[1] > 16 * MIB
        assert_injected(cri, dind_pod(cri, "after", dev), dev)


def _cannot_send_2x(containerd: Containerd, cri: CriClient, dev: FakeDevice) -> None:
    # 14 pods with 1.2 MB of env each: over 16 MiB, and no 4 of their containers fit in 4 MiB.
    run_bulk(cri, 14, 1_200_000)
    outage = dind_pod(cri, "outage", dev)
    mark = len(containerd.log_text())
    plugin = unready_plugin(containerd)
    try:
        dropped = plugin.wait_for(PLUGIN_DROPPED_2X, timeout_s=30)
        assert "connect failed" in dropped
        text = wait_log(containerd, mark, TOO_BIG_2X)
        failed = re.search(rf".*{SYNC_FAILED}: .*{TOO_BIG_2X}.*", text)
        assert failed, text[-3000:]
        print(f"\nplugin: {dropped}\ncontainerd: {failed.group(0)}")
        assert_not_injected(cri, outage, dev)
        assert "nri: connected" not in "\n".join(plugin.lines)
    finally:
        plugin.stop()

    # The edge: 4 pods and 4 containers, the smallest piece containerd cuts, in exactly 4 MiB.
    for pod_id in cri.list_pod_ids():
        cri.remove_pod(pod_id)
    run_bulk(cri, 3, 1_300_000)
    pad = Pad(cri)
    pad.set(PIECE_2X - 3 * 1_320_000)
    size = pad_to(containerd, pad, PIECE_2X)
    assert size.complete
    with PluginProcess.gpushare(containerd) as plugin:
        assert connected_line(plugin, 0)[0] == 1
        plugin.wait_for("nri: synchronized pods=4 containers=4")

    # One byte more (the pad's variable; nothing else of the state changes) and containerd gives up.
    pad.set(pad.env + 1)
    mark = len(containerd.log_text())
    plugin = unready_plugin(containerd)
    try:
        plugin.wait_for(PLUGIN_DROPPED_2X, timeout_s=30)
        wait_log(containerd, mark, TOO_BIG_2X)
    finally:
        plugin.stop()
