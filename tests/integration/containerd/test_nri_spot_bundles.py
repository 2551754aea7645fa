"""Spot borrowers get exactly the lent GPU, from the vendor's answer or kubelet's holder (design §8).

Real containerd + runc, the NRI plugin in-process as the agent builds it: the PodResources client
against a real gRPC stand-in for kubelet, the vendor resolver against the real fake vendor plugin
(`FakeGpuPlugin`, what `gpushare fake-gpus` serves) on its own socket, and a lend state standing
in for the agent's spot state. The owner holds four fake GPUs, `/dev/fakegpu0..3` (char nodes
10:229, told apart by path).

- one GPU of the four-GPU owner goes to each borrower, and only that one (vendor answer, and the
  holder's nodes by the vendor rule);
- a tenant whose env names a lent GPU is never the holder: kubelet says who is;
- a privileged holder's host devices (`/dev/kmsg`) are never copied;
- a lend that ended is refused with a message naming it.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from controller.io.podresources import PodResourcesClient
from controller.io.vendor_allocate import KubeletHolders, VendorAllocateResolver
from deviceplugins import FakeGpuPlugin
from gpushare import keys
from gpushare.codecs import encode_devices_ids
from gpushare.config import load_config
from localcluster._pb import cri_api_pb2 as cri_pb
from localcluster.containerd import Containerd
from localcluster.cri import CriClient, CriError, DeviceSpec, Pod
from nri_plugin import Injector, Stub
from nri_plugin.decide import Decision
from nri_plugin.model import ContainerInfo, PodInfo
from tests.harness.devices import FUSE_MAJOR, FUSE_MINOR
from tests.harness.podresources_server import PodResourcesServer
from tests.integration.containerd.common import connected_stub

RESOURCE = "example.com/gpu"
GPUS = [f"fakegpu{i}" for i in range(4)]
VISIBLE = "FAKE_VISIBLE_DEVICES"
LS = ["sh", "-c", f'ls /dev; echo "{VISIBLE}=${{{VISIBLE}-<unset>}}"']


@dataclass
class Lends:
    """The agent's answer: every lend active unless named here with why it ended."""

    ended: dict[str, str] = field(default_factory=dict)

    def lend_ended(self, real_id: str, namespace: str, pod: str, uid: str) -> str | None:
        return self.ended.get(real_id)


@dataclass
class Node:
    server: PodResourcesServer
    vendor: FakeGpuPlugin
    dev_dir: Path
    lends: Lends
    decisions: list[tuple[str, str, Decision | None]]

    def owner_devices(self) -> list[DeviceSpec]:
        return [DeviceSpec(f"/dev/{g}", str(self.dev_dir / g)) for g in GPUS]


@dataclass
class Plugin:
    node: Node
    source: str  # how a borrower's decision names where its bundle came from
    stub: Stub


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    """kubelet's PodResources stand-in and the fake vendor plugin for four GPUs, in private dirs."""
    root = Path(tempfile.mkdtemp(prefix="gs-spotb-", dir="/tmp"))
    (root / "dp").mkdir()
    (root / "dev").mkdir()
    for g in GPUS:
        os.mknod(root / "dev" / g, stat.S_IFCHR | 0o666, os.makedev(FUSE_MAJOR, FUSE_MINOR))
        os.chmod(root / "dev" / g, 0o666)
    vendor = FakeGpuPlugin(RESOURCE, str(root / "dp"), str(root / "dev"), len(GPUS))
    vendor.serve()
    try:
        with PodResourcesServer() as server:
            yield Node(server, vendor, root / "dev", Lends(), [])
    finally:
        vendor.stop_serving()
        shutil.rmtree(root, ignore_errors=True)


def _start(containerd: Containerd, node: Node, *, vendor: bool) -> Iterator[Plugin]:
    podres = PodResourcesClient(node.server.socket)
    resolver = (
        VendorAllocateResolver(str(node.vendor.plugin_dir), visibility_env=(VISIBLE,), sockets={}) if vendor else None
    )

    def record(kind: str, pod: PodInfo, ctr: ContainerInfo, decision: Decision | None, _ms: float) -> None:
        node.decisions.append((kind, f"{pod.ref}/{ctr.name}", decision))

    injector = Injector(
        load_config(None),
        oracle=podres,
        resolver=resolver,
        holders=KubeletHolders(podres),
        lend_state=node.lends,
        on_decision=record,
    )
    try:
        with connected_stub(containerd, injector) as stub:
            yield Plugin(node, f"vendor:{RESOURCE}" if vendor else "", stub)
    finally:
        podres.close()


@pytest.fixture(params=["vendor", "holder"])
def plugin(request: pytest.FixtureRequest, containerd: Containerd, node: Node) -> Iterator[Plugin]:
    """The plugin with the vendor resolver, or with kubelet's holder and the vendor rule alone."""
    yield from _start(containerd, node, vendor=request.param == "vendor")


@pytest.fixture
def holder_plugin(containerd: Containerd, node: Node) -> Iterator[Plugin]:
    yield from _start(containerd, node, vendor=False)


def _owner(cri: CriClient, node: Node, name: str = "owner", *, privileged: bool = False) -> Pod:
    """A pod holding all four GPUs the way kubelet gives them (CRI devices + the vendor's env)."""
    config = cri.pod_config(name, "team")
    config.linux.security_context.privileged = privileged
    # CriClient has no privileged switch: the same calls, with the flag kubelet sets for `privileged: true`.
    resp = cri._call("RunPodSandbox", cri_pb.RunPodSandboxRequest(config=config))
    assert isinstance(resp, cri_pb.RunPodSandboxResponse)
    pod = Pod(resp.pod_sandbox_id, config)
    ctr = cri.container_config("main", pod=pod, devices=node.owner_devices(), envs={VISIBLE: ",".join(GPUS)})
    ctr.linux.security_context.privileged = privileged
    created = cri._call(
        "CreateContainer", cri_pb.CreateContainerRequest(pod_sandbox_id=pod.id, config=ctr, sandbox_config=config)
    )
    assert isinstance(created, cri_pb.CreateContainerResponse)
    cri.start_container(created.container_id)
    pod.containers["main"] = created.container_id
    node.server.allocate("team", name, "main", RESOURCE, GPUS)
    return pod


def _borrow(cri: CriClient, node: Node, name: str, gpu: str) -> tuple[Pod, str]:
    node.server.allocate("spot", name, "job", keys.RESOURCE_SPOT_GPU, [f"spot-{gpu}"])
    pod = cri.run_pod(name, "spot")
    ann = {keys.ANNOTATION_DEVICES_IDS: encode_devices_ids({RESOURCE: [gpu]})}
    return pod, cri.run_container(pod, "job", annotations=ann)


def _remove(cri: CriClient, node: Node, *pods: Pod) -> None:
    """Remove pods; kubelet then lists them no more."""
    for pod in pods:
        cri.remove_pod(pod.id)
        node.server.allocations.pop((pod.namespace, pod.name), None)


def _seen(cri: CriClient, container_id: str) -> tuple[set[str], str]:
    out = cri.exec_sync(container_id, LS).stdout.split()
    env = next(w for w in out if w.startswith(VISIBLE + "="))
    return {w for w in out if w != env}, env.partition("=")[2]


def _source_of(node: Node, ref: str) -> str:
    found = [d for k, r, d in node.decisions if r == ref and k == "inject" and d is not None]
    assert found, f"no inject decision for {ref}: {node.decisions}"
    return found[-1].source


def test_each_borrower_gets_only_its_gpu_of_a_four_gpu_owner(cri: CriClient, plugin: Plugin) -> None:
    node = plugin.node
    owner = _owner(cri, node)
    borrowers = [_borrow(cri, node, f"job-{g}", g) for g in ("fakegpu1", "fakegpu3")]
    for (pod, cid), gpu in zip(borrowers, ("fakegpu1", "fakegpu3"), strict=True):
        devs, env = _seen(cri, cid)
        assert {d for d in devs if d.startswith("fakegpu")} == {gpu} and env == gpu, (devs, env)
        assert cri.exec_sync(cid, ["sh", "-c", f"exec 3<>/dev/{gpu}"]).exit_code == 0  # the cgroup allows it
        assert _source_of(node, f"spot/{pod.name}/job") == (plugin.source or "team/owner/main")
        _remove(cri, node, pod)
    _remove(cri, node, owner)


def test_a_forged_visibility_variable_does_not_make_a_holder(cri: CriClient, holder_plugin: Plugin) -> None:
    node = holder_plugin.node
    # The thief names fakegpu2 in its env and even holds a node at that path; kubelet lists it for nothing.
    thief = cri.run_pod("thief", "team-b")
    cri.run_container(thief, "main", envs={VISIBLE: "fakegpu2"}, devices=node.owner_devices()[2:3])
    details = _borrow_refused(cri, node, "job-forged", "fakegpu2")
    assert "kubelet lists no container on this node holding example.com/gpu fakegpu2" in details, details
    # With the real owner created before the thief's twin, the borrower still gets the owner's node.
    owner = _owner(cri, node, "owner-real")
    twin = cri.run_pod("thief-late", "team-b")
    cri.run_container(twin, "main", envs={VISIBLE: ",".join(GPUS)}, devices=node.owner_devices())
    borrower, cid = _borrow(cri, node, "job-real", "fakegpu2")
    assert _source_of(node, "spot/job-real/job") == "team/owner-real/main"
    assert _seen(cri, cid)[1] == "fakegpu2"
    _remove(cri, node, borrower, twin, owner, thief)


def _borrow_refused(cri: CriClient, node: Node, name: str, gpu: str) -> str:
    """CreateContainer of a borrower that must be refused; the refusal as containerd reports it."""
    node.server.allocate("spot", name, "job", keys.RESOURCE_SPOT_GPU, [f"spot-{gpu}"])
    pod = cri.run_pod(name, "spot")
    ann = {keys.ANNOTATION_DEVICES_IDS: encode_devices_ids({RESOURCE: [gpu]})}
    with pytest.raises(CriError) as info:
        cri.create_container(pod, "job", annotations=ann)
    _remove(cri, node, pod)
    return info.value.details


def test_a_privileged_holders_host_devices_are_not_copied(cri: CriClient, holder_plugin: Plugin) -> None:
    node = holder_plugin.node
    owner = _owner(cri, node, "owner-priv", privileged=True)
    owner_devs, _ = _seen(cri, owner.containers["main"])
    assert "kmsg" in owner_devs, owner_devs  # the privileged holder really sees the host's devices
    pod, cid = _borrow(cri, node, "job-priv", "fakegpu1")
    devs, env = _seen(cri, cid)
    assert "kmsg" not in devs and "mem" not in devs, devs
    assert {d for d in devs if d.startswith("fakegpu")} == {"fakegpu1"} and env == "fakegpu1"
    _remove(cri, node, pod, owner)


def test_a_lend_that_ended_is_refused(cri: CriClient, plugin: Plugin) -> None:
    node = plugin.node
    owner = _owner(cri, node, "owner-back")
    node.lends.ended["fakegpu0"] = "the pod was reclaimed (its GPU's owner came back, left or stopped lending)"
    try:
        details = _borrow_refused(cri, node, "job-late", "fakegpu0")
    finally:
        node.lends.ended.clear()
    assert "gpushare: lend of GPU fakegpu0 to pod spot/job-late ended: the pod was reclaimed" in details, details
    _remove(cri, node, owner)
