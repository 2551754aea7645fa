"""A share on a DRA node gets NVIDIA's own CDI edits for its GPU, the same as the GPU's exclusive
holder, with NVIDIA's real toolkit: ``nvidia-ctk cdi generate`` (v1.20.2) writes the node's spec
from fakenvidia's driver root, gpushare's DRA driver reads its GPUs from it, and containerd applies
it, hooks included, to the pods of the real scheduler and kubelet.

The measure is the GPU part of each container as runc received it (tests/harness/gpu_part.py):
device nodes, device-cgroup rules, the driver's mounts, NVIDIA's variables and the toolkit's
hooks. The exclusive holder of a GPU (a claim of the whole-GPU class) and a ``share-gpu-4`` pod
on the same GPU must have equal parts; the part must hold that GPU's device node and no other's.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from fakenvidia.driver_root import DriverRoot, build_driver_root
from fakenvidia.gpus import FakeGpus
from localcluster.cluster import Cluster
from localcluster.errors import ClusterUnavailable
from localcluster.paths import NvidiaBinaries
from tests.harness.gpu_part import GpuPart, diff, read_bundle_part
from tests.harness.worlds.dra import DraNode
from tests.integration.dra.conftest import NAMESPACE, Api, claim, claim_pod, results, share_pod
from tests.integration.nvidia.conftest import nvidia_ctk_generate

VENDOR_KIND = "nvidia.com/gpu"


class NvidiaDraNode(DraNode):
    """The DRA node with NVIDIA's stack on fakenvidia's driver root in place of the fake vendor."""

    def __init__(self, cluster: Cluster, nvidia: NvidiaBinaries, root: DriverRoot) -> None:
        super().__init__(cluster, gpus=2)
        self.nvidia = nvidia
        self.root = root

    def write_vendor(self) -> None:
        self.cdi_dir.mkdir(parents=True, exist_ok=True)
        # Both names of each GPU, as the DRA guide asks: the UUID is what the exporter knows it by.
        nvidia_ctk_generate(
            self.nvidia,
            self.root,
            self.cdi_dir / "nvidia.yaml",
            "--device-name-strategy=index",
            "--device-name-strategy=uuid",
        )

    def config_doc(self) -> dict[str, Any]:
        doc = super().config_doc()
        doc["dra"]["vendorKind"] = VENDOR_KIND
        return doc

    def teardown(self) -> None:
        super().teardown()
        (self.cdi_dir / "nvidia.yaml").unlink(missing_ok=True)


@pytest.fixture(scope="module")
def nvidia_dra(cluster: Cluster) -> Iterator[NvidiaDraNode]:
    try:
        nvidia = NvidiaBinaries.find()
    except ClusterUnavailable as exc:
        pytest.skip(str(exc))
    base = Path(tempfile.mkdtemp(prefix="gs-dra-nv", dir="/tmp"))
    root = build_driver_root(base / "root", FakeGpus(count=2, uuid_seed="dra-nvidia"))
    cluster.kubectl("create", "namespace", NAMESPACE, check=False)
    node = NvidiaDraNode(cluster, nvidia, root)
    try:
        node.setup()
        node.start_plugin()
        yield node
    finally:
        cluster.kubectl("delete", "pods,resourceclaims", "--all", "-n", NAMESPACE, "--wait=true", timeout_s=120)
        node.teardown()
        shutil.rmtree(base, ignore_errors=True)


def _part(cluster: Cluster, node: NvidiaDraNode, api: Api, pod: str) -> GpuPart:
    status = api.pod(pod)["status"]["containerStatuses"][0]
    container_id = str(status["containerID"]).split("://", 1)[1]
    state = cluster.layout.containerd_dir / "state"
    aliases = {str(node.root.path): "<driver-root>", str(node.nvidia.cdi_hook.parent): "<toolkit>"}
    return read_bundle_part(state, container_id, driver_root=str(node.root.path), aliases=aliases)


def test_a_share_gets_nvidias_own_edits_for_its_gpu(nvidia_dra: NvidiaDraNode, api: Api, cluster: Cluster) -> None:
    spec = yaml.safe_load((nvidia_dra.cdi_dir / "nvidia.yaml").read_text())
    uuids = sorted(d["name"] for d in spec["devices"] if str(d["name"]).startswith("GPU-"))
    assert len(uuids) == 2, spec["devices"]
    gpus = {cs["name"] for s in nvidia_dra.slices() for cs in s["spec"].get("sharedCounters", [])}
    assert gpus == {"gpu-0", "gpu-1"}

    api.apply(claim("nv-whole", "gpu.gpushare.k8s.io"))
    api.apply(claim_pod("nv-whole", "nv-whole"))
    api.wait_running(["nv-whole"])
    (whole,) = results(api.claim("nv-whole"))
    exclusive = _part(cluster, nvidia_dra, api, "nv-whole")
    api.delete_pods("nv-whole")
    cluster.kubectl("delete", "resourceclaim", "-n", NAMESPACE, "nv-whole")

    # The GPU is free again: the first share lands on it.
    api.apply(share_pod("nv-share", 4))
    api.wait_running(["nv-share"])
    claim_name = api.pod("nv-share")["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
    (slot,) = results(api.claim(claim_name))
    assert slot["device"].startswith(f"{whole['device']}-share4-"), (whole, slot)
    shared = _part(cluster, nvidia_dra, api, "nv-share")
    assert not diff(exclusive, shared), "\n".join(diff(exclusive, shared))

    index = int(whole["device"].removeprefix("gpu-"))
    nodes = [d.path for d in shared.devices]
    assert f"/dev/nvidia{index}" in nodes and f"/dev/nvidia{1 - index}" not in nodes, nodes
    assert shared.mounts and shared.hooks, shared.lines()
    print("GPU part of a share on a DRA node (NVIDIA toolkit v1.20.2 CDI spec):\n  " + "\n  ".join(shared.lines()))
    env = dict(line.split("=", 1) for line in api.exec("nv-share", "env").splitlines() if "=" in line)
    assert env["GPUSHARE_GPU_MILLI"] == "250"
    api.delete_pods("nv-share")
