"""The vendor's own Allocate answer for exactly the lent GPUs, and kubelet's holder of a real ID.

``VendorAllocateResolver`` is driven against the real fake vendor plugin (``FakeGpuPlugin``, the
one ``gpushare fake-gpus`` serves) over a gRPC socket in a private device-plugin directory. Its
fake GPU "nodes" are links to four distinct harmless character devices (/dev/null, zero, full,
random), so each GPU has numbers of its own without mknod. ``KubeletHolders`` is driven with
PodResources rows.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller._pb import podresources_pb2 as pb
from controller.io.podresources import PodResourcesError
from controller.io.vendor_allocate import KubeletHolders, VendorAllocateResolver
from deviceplugins import FakeGpuPlugin
from nri_plugin import DeviceResolver, HolderOracle
from nri_plugin.model import DeviceNode
from nri_plugin.oracle import Holder

RESOURCE = "example.com/gpu"
VIS = ("FAKE_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")
TARGETS = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random")  # only stat'ed, never opened


def _node(i: int) -> DeviceNode:
    st = os.stat(TARGETS[i])
    return DeviceNode(
        f"/dev/fakegpu{i}", "c", os.major(st.st_rdev), os.minor(st.st_rdev), stat.S_IMODE(st.st_mode), 0, 0
    )


@pytest.fixture
def vendor() -> Iterator[tuple[FakeGpuPlugin, Path]]:
    """The fake vendor plugin for 4 GPUs, each node a distinct device, serving in a private plugin dir."""
    root = Path(tempfile.mkdtemp(prefix="gs-va-", dir="/tmp"))
    (root / "dp").mkdir()
    (root / "dev").mkdir()
    for i, target in enumerate(TARGETS):
        os.symlink(target, root / "dev" / f"fakegpu{i}")
    plugin = FakeGpuPlugin(RESOURCE, str(root / "dp"), str(root / "dev"), 4)
    plugin.serve()
    try:
        yield plugin, root
    finally:
        plugin.stop_serving()
        shutil.rmtree(root, ignore_errors=True)


def _resolver(root: Path, **kw: object) -> VendorAllocateResolver:
    return VendorAllocateResolver(str(root / "dp"), visibility_env=VIS, host_root="", **kw)  # type: ignore[arg-type]


def test_allocate_answers_each_gpu_with_its_own_node(vendor: tuple[FakeGpuPlugin, Path]) -> None:
    plugin, root = vendor
    resolver = _resolver(root, sockets={RESOURCE: plugin.socket_path})
    assert isinstance(resolver, DeviceResolver)
    for i in range(4):
        bundle = resolver.resolve(RESOURCE, (f"fakegpu{i}",))
        assert bundle is not None
        assert bundle.devices == (_node(i),)
        assert bundle.env == (("FAKE_VISIBLE_DEVICES", f"fakegpu{i}"),)
    two = resolver.resolve(RESOURCE, ("fakegpu3", "fakegpu1"))
    assert two is not None and two.devices == (_node(3), _node(1))


def test_the_socket_is_found_by_its_device_list(vendor: tuple[FakeGpuPlugin, Path]) -> None:
    plugin, root = vendor
    # Not dialled: kubelet's own socket and gpushare's are skipped by name; a dead socket is passed over.
    for name in ("kubelet.sock", "gpushare-spot-gpu.sock", "aaa-dead.sock"):
        (root / "dp" / name).touch()
    other = FakeGpuPlugin("other.example/gpu", str(root / "dp"), str(root / "dev"), 1)  # lists fakegpu0 only
    other.serve()
    try:
        resolver = _resolver(root)
        assert resolver.socket_for(RESOURCE, ["fakegpu3"]) == plugin.socket_path
        bundle = resolver.resolve(RESOURCE, ("fakegpu3",))
        assert bundle is not None and bundle.devices == (_node(3),)
        assert resolver.socket_for("nope.example/gpu", ["fakegpu9"]) is None
    finally:
        other.stop_serving()


def test_answers_are_cached_and_failures_are_none(vendor: tuple[FakeGpuPlugin, Path]) -> None:
    plugin, root = vendor
    resolver = _resolver(root, sockets={RESOURCE: plugin.socket_path})
    assert resolver.resolve(RESOURCE, ("fakegpu9",)) is None  # the plugin refuses an unknown ID
    first = resolver.resolve(RESOURCE, ("fakegpu2",))
    os.unlink(root / "dev" / "fakegpu1")
    assert resolver.resolve(RESOURCE, ("fakegpu1",)) is None  # no node on this node: no partial answer
    plugin.stop_serving()
    assert resolver.resolve(RESOURCE, ("fakegpu2",)) == first  # from the cache, inside the CreateContainer budget
    assert resolver.resolve(RESOURCE, ("fakegpu0",)) is None  # the plugin is gone


def _pod(ns: str, name: str, **containers: dict[str, list[str]]) -> pb.PodResources:
    return pb.PodResources(
        namespace=ns,
        name=name,
        containers=[
            pb.ContainerResources(
                name=c, devices=[pb.ContainerDevices(resource_name=r, device_ids=ids) for r, ids in res.items()]
            )
            for c, res in containers.items()
        ],
    )


class Lister:
    def __init__(self, pods: list[pb.PodResources]) -> None:
        self.pods = pods
        self.calls = 0
        self.fail = False

    def list(self) -> list[pb.PodResources]:
        self.calls += 1
        if self.fail:
            raise PodResourcesError("gpushare: kubelet pod-resources List failed")
        return self.pods


def test_holders_come_from_kubelets_rows() -> None:
    now = [0.0]
    lister = Lister(
        [
            _pod("team", "owner", main={RESOURCE: ["fakegpu0", "fakegpu1"]}, side={"other/x": ["fakegpu1"]}),
            _pod("spot", "job", job={"gpushare/spot-gpu": ["spot-fakegpu1"]}),
        ]
    )
    holders = KubeletHolders(lister, ttl_s=1.0, clock=lambda: now[0])
    assert isinstance(holders, HolderOracle)
    owner = Holder("team", "owner", "main", frozenset({"fakegpu0", "fakegpu1"}))
    assert holders.holder_of(RESOURCE, "fakegpu1") == owner
    assert holders.holder_of(RESOURCE, "fakegpu0") == owner and lister.calls == 1  # cached
    assert holders.holder_of(RESOURCE, "fakegpu7") is None and lister.calls == 2  # a miss asks again
    lister.pods = []
    now[0] = 2.0
    assert holders.holder_of(RESOURCE, "fakegpu1") is None  # stale: asked again, the owner is gone
    lister.fail = True
    with pytest.raises(PodResourcesError):
        holders.holder_of(RESOURCE, "fakegpu1")
