"""The device plugins against the real kubelet of the one-node cluster (localcluster).

The same checks as the protocol-peer tier, but the peer is kubelet v1.34 itself: node
allocatable, a pod's container annotation as containerd received it, a health flip, and a
kubelet restart. The cluster fixture skips (naming the build command) when the binaries
are missing or the tests do not run as root.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from controller._pb import podresources_pb2, podresources_pb2_grpc
from controller.io.podresources import PodResourcesClient
from deviceplugins import AdvertisedDevice, FakeGpuPlugin, PluginManager, ShadowSlots, create_fake_gpu_nodes
from deviceplugins.server import socket_identity
from localcluster.cluster import Cluster
from localcluster.cri import CriClient
from localcluster.errors import ClusterError
from localcluster.images import BUSYBOX_IMAGE
from tests.harness.cluster_fixture import cluster  # noqa: F401  (session-scoped fixture)

NS = "gpushare-system"
SHARE4 = "gpushare/share-gpu-4"
SLEEP_FOREVER = "trap 'exit 0' TERM; sleep 3600 & wait"


def share4_slots(sh_b_open: bool) -> list[AdvertisedDevice]:
    """share-gpu-4's list with sh-b's slots open or closed to new sharers (sh-a's always open)."""
    return [AdvertisedDevice(f"{NS}/sh-a-{i}") for i in range(4)] + [
        AdvertisedDevice(f"{NS}/sh-b-{i}", sh_b_open) for i in range(4)
    ]


def allocatable(c: Cluster, resource: str) -> int:
    value = c.node().get("status", {}).get("allocatable", {}).get(resource, "0")
    return int(value)


@pytest.fixture
def plugins(cluster: Cluster) -> Iterator[PluginManager]:  # noqa: F811
    mgr = PluginManager.for_gpushare(
        str(cluster.device_plugin_dir), share_specs=(2, 4), dev_share_specs=(8,), check_interval_s=0.5
    )
    mgr.start()
    try:
        assert mgr.wait_registered(10), mgr.status()
        yield mgr
    finally:
        mgr.stop()


def test_real_kubelet_allocatable_pod_annotation_health_restart(
    cluster: Cluster,  # noqa: F811
    plugins: PluginManager,
) -> None:
    mgr = plugins
    # 1. allocatable = shadows x N
    mgr.set_shadows([ShadowSlots(NS, "sh-a", 4), ShadowSlots(NS, "sh-b", 4), ShadowSlots(NS, "sh-c", 2)])
    cluster.wait_for("share-gpu-4 allocatable 8", lambda: allocatable(cluster, SHARE4) == 8, 30)
    cluster.wait_for("share-gpu-2 allocatable 2", lambda: allocatable(cluster, "gpushare/share-gpu-2") == 2, 30)

    # 2. a pod asking for gpushare/share-gpu-4: 1 gets the annotation on its container
    name = f"dp-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("apply", "-f", "-", input=json.dumps(_pod(name, SHARE4)))
    try:
        container_id = _container_id(cluster.wait_pod_phase(name, ["Running"], timeout_s=90))
        with CriClient(str(cluster.cri_socket)) as cri:
            annotations = dict(cri.container_status(container_id).annotations)
        value = annotations["gpushare.k8s.io/container-devices-from"]
        doc = json.loads(value)
        ((source, spec),) = doc.items()
        assert source in (f"{NS}/sh-a/main", f"{NS}/sh-b/main")
        (vid,) = spec["*"]
        assert vid.startswith(source.rsplit("/", 1)[0] + "-")
        # Exactly what the plugin answered (canonical JSON of gpushare.codecs).
        assert value == json.dumps({source: {"*": [vid]}}, sort_keys=True, separators=(",", ":"))
    finally:
        cluster.kubectl("delete", "pod", name, "--wait=false", check=False)

    # 3. a health flip changes allocatable
    mgr.set_devices(SHARE4, share4_slots(False))
    cluster.wait_for("share-gpu-4 allocatable 4", lambda: allocatable(cluster, SHARE4) == 4, 30)
    mgr.set_devices(SHARE4, share4_slots(True))
    cluster.wait_for("share-gpu-4 allocatable 8 again", lambda: allocatable(cluster, SHARE4) == 8, 30)
    # The flip as kubelet itself sees it (a separate process), polled through PodResources.
    flips: list[float] = []
    for i in range(10):
        healthy = i % 2 == 1
        want = 8 if healthy else 4
        t = time.monotonic()
        mgr.set_devices(SHARE4, share4_slots(healthy))
        while len(kubelet_allocatable(cluster).get(SHARE4, ())) != want:
            assert time.monotonic() - t < 5, "kubelet never saw the flip"
        flips.append(time.monotonic() - t)
    flips.sort()
    print(f"real kubelet health flip -> allocatable: p50 {flips[5] * 1000:.1f} ms, max {flips[-1] * 1000:.1f} ms")
    assert flips[5] < 0.050

    # 4. a kubelet restart leaves allocatable intact: kubelet's own live view (PodResources
    # GetAllocatableResources) lists all 8 slots again within a second of the new kubelet.sock.
    sock = cluster.device_plugin_dir / "kubelet.sock"
    old = socket_identity(str(sock))  # inode numbers are reused; (inode, ctime) is not
    samples: list[tuple[float, int]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            with contextlib.suppress(ClusterError):  # a transient read error is not a sample
                samples.append((time.monotonic(), allocatable(cluster, SHARE4)))
            stop.wait(0.2)

    sampler = threading.Thread(target=sample, name="gpushare-test-sampler")
    sampler.start()
    try:
        cluster.stop_kubelet()
        cluster.start_kubelet(wait=False)
        deadline = time.monotonic() + 60
        while socket_identity(str(sock)) in (None, old):
            assert time.monotonic() < deadline, "kubelet did not recreate kubelet.sock"
            time.sleep(0.005)
        appeared = time.monotonic()
        while len(kubelet_allocatable(cluster).get(SHARE4, ())) != 8:
            assert time.monotonic() - appeared < 60, (kubelet_allocatable(cluster), mgr.status())
            time.sleep(0.005)
        took = time.monotonic() - appeared
        cluster.wait_node_ready(60)
        time.sleep(10)  # two node-status periods (4 s) after Ready
    finally:
        stop.set()
        sampler.join()
    dips = [t for t, n in samples if n != 8]
    dip_s = (max(dips) - min(dips) + 0.2) if dips else 0.0
    print(
        f"real kubelet restart: kubelet lists all share-gpu-4 slots {took * 1000:.0f} ms after kubelet.sock "
        f"appeared; node-status allocatable dip {dip_s:.1f} s"
    )
    # The node object is kubelet's to publish (every 4 s here): if kubelet posted its checkpoint
    # view before our plugins were back, the dip ends at a later status update, long before now.
    assert allocatable(cluster, SHARE4) == 8, [n for _, n in samples]


# kubelet's PodResources GetAllocatableResources, decoded with a two-message runtime schema
# (only the fields we read; protobuf skips the rest) so no other part's proto is touched.
def _allocatable_response_type() -> Any:
    fdp = descriptor_pb2.FileDescriptorProto(name="gs_dp_test_alloc.proto", package="gsdptest", syntax="proto3")
    devices = fdp.message_type.add(name="ContainerDevices")
    devices.field.add(name="resource_name", number=1, type=9, label=1)  # string
    devices.field.add(name="device_ids", number=2, type=9, label=3)  # repeated string
    resp = fdp.message_type.add(name="AllocatableResourcesResponse")
    resp.field.add(name="devices", number=1, type=11, label=3, type_name=".gsdptest.ContainerDevices")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("gsdptest.AllocatableResourcesResponse"))


_ALLOCATABLE = _allocatable_response_type()


def kubelet_allocatable(c: Cluster) -> dict[str, tuple[str, ...]]:
    """resource -> healthy device IDs, as kubelet's device manager sees them now ({} if not answering)."""
    with grpc.insecure_channel(f"unix:{c.pod_resources_socket}") as channel:
        call = channel.unary_unary(
            "/v1.PodResourcesLister/GetAllocatableResources",
            request_serializer=lambda _: b"",
            response_deserializer=_ALLOCATABLE.FromString,
        )
        try:
            resp = call(None, timeout=2)
        except grpc.RpcError:
            return {}
    out: dict[str, tuple[str, ...]] = {}
    for d in resp.devices:
        out[d.resource_name] = out.get(d.resource_name, ()) + tuple(d.device_ids)
    return out


def _pod(name: str, resource: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "hostNetwork": True,
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": BUSYBOX_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", SLEEP_FOREVER],
                    "resources": {"limits": {resource: 1}, "requests": {resource: 1}},
                }
            ],
        },
    }


def _container_id(pod: dict[str, Any]) -> str:
    return str(pod["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1])


def test_real_kubelet_fake_gpus_and_spot(cluster: Cluster, tmp_path: Any) -> None:  # noqa: F811
    """The fake vendor plugin works like a vendor's under real kubelet + containerd, and spot follows it."""
    dev_dir = str(tmp_path / "dev")
    create_fake_gpu_nodes(dev_dir, 2)
    plugin_dir = str(cluster.device_plugin_dir)
    fake = FakeGpuPlugin("example.com/gpu", plugin_dir, dev_dir, 2)
    vendor = PluginManager([fake], plugin_dir, check_interval_s=0.5)
    spot = PluginManager.for_gpushare(
        plugin_dir,
        share_specs=(2,),
        dev_share_specs=(2,),
        spot_sources={"example.com/gpu": fake.socket_path},
        check_interval_s=0.5,
    )
    names: list[str] = []
    vendor.start()
    spot.start()
    try:
        assert vendor.wait_registered(10) and spot.wait_registered(10)
        cluster.wait_for("example.com/gpu allocatable 2", lambda: allocatable(cluster, "example.com/gpu") == 2, 30)
        # spot-<id> exists for both GPUs but is Unhealthy until the controller says the owner is away.
        cluster.wait_for(
            "spot-gpu capacity 2",
            lambda: cluster.node()["status"].get("capacity", {}).get("gpushare/spot-gpu") == "2",
            30,
        )
        assert allocatable(cluster, "gpushare/spot-gpu") == 0

        # A vendor-style pod: the node and the visibility variable arrive in the container.
        name = f"fake-{uuid.uuid4().hex[:8]}"
        names.append(name)
        cluster.kubectl("apply", "-f", "-", input=json.dumps(_pod(name, "example.com/gpu")))
        cid = _container_id(cluster.wait_pod_phase(name, ["Running"], timeout_s=90))
        with CriClient(str(cluster.cri_socket)) as cri:
            res = cri.exec_sync(cid, ["sh", "-c", 'echo "$FAKE_VISIBLE_DEVICES"; ls /dev | grep fakegpu'])
        lines = res.stdout.split()
        assert res.exit_code == 0, res
        assert len(lines) == 2 and lines[0] in ("fakegpu0", "fakegpu1") and lines[1] == lines[0], res.stdout

        # The owner goes away: spot becomes allocatable, and a spot pod gets the real ID.
        spot.set_spot_health("fakegpu1", True)
        cluster.wait_for("spot-gpu allocatable 1", lambda: allocatable(cluster, "gpushare/spot-gpu") == 1, 30)
        name = f"spot-{uuid.uuid4().hex[:8]}"
        names.append(name)
        cluster.kubectl("apply", "-f", "-", input=json.dumps(_pod(name, "gpushare/spot-gpu")))
        cid = _container_id(cluster.wait_pod_phase(name, ["Running"], timeout_s=90))
        with CriClient(str(cluster.cri_socket)) as cri:
            annotations = dict(cri.container_status(cid).annotations)
        assert annotations["gpushare.k8s.io/container-devices-ids"] == '{"example.com/gpu":["fakegpu1"]}'
        # The owner is back: not allocatable any more (the running spot pod is the controller's to evict).
        spot.set_spot_health("fakegpu1", False)
        cluster.wait_for("spot-gpu allocatable 0", lambda: allocatable(cluster, "gpushare/spot-gpu") == 0, 30)
    finally:
        for n in names:
            cluster.kubectl("delete", "pod", n, "--wait=false", check=False)
        spot.stop()
        vendor.stop()


def test_podresources_calls_stay_under_the_real_kubelets_limit(cluster: Cluster) -> None:  # noqa: F811
    """kubelet refuses pod-resources calls past 100/s (burst 10); the agent's client waits its turn instead."""
    refused = 0
    with grpc.insecure_channel(f"unix:{cluster.pod_resources_socket}") as channel:
        stub = podresources_pb2_grpc.PodResourcesListerStub(channel)  # type: ignore[no-untyped-call]
        for _ in range(60):  # back to back, as passes on every pod event of a busy cluster were
            try:
                stub.List(podresources_pb2.ListPodResourcesRequest(), timeout=5)
            except grpc.RpcError as exc:
                if not isinstance(exc, grpc.Call) or exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                    raise
                refused += 1
    assert refused > 0  # the limit is kubelet's own, not the test's
    time.sleep(0.2)  # its bucket refills
    with PodResourcesClient(str(cluster.pod_resources_socket), timeout_s=5) as client:
        for _ in range(60):
            client.list()  # a refusal raises PodResourcesError, naming RESOURCE_EXHAUSTED
