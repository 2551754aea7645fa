"""kubelet's pod-resources List answer as rows."""

from __future__ import annotations

from types import SimpleNamespace

from controller._pb import podresources_pb2 as pb
from controller.core.model import PodResourcesEntry
from controller.io.podresources_entries import entries_from_pod_resources


def test_entries_from_pod_resources_one_row_per_container_and_resource() -> None:
    dev = SimpleNamespace
    answer = [
        dev(
            namespace="default",
            name="p",
            containers=[
                dev(
                    name="c",
                    devices=[
                        dev(resource_name="example.com/gpu", device_ids=["g0"]),
                        dev(resource_name="example.com/gpu", device_ids=["g1"]),
                        dev(resource_name="gpushare/share-gpu-4", device_ids=["gpushare-system/s-0"]),
                    ],
                )
            ],
        )
    ]
    assert entries_from_pod_resources(answer) == [
        PodResourcesEntry("default", "p", "c", "example.com/gpu", ("g0", "g1")),
        PodResourcesEntry("default", "p", "c", "gpushare/share-gpu-4", ("gpushare-system/s-0",)),
    ]


def test_kubelets_messages_keep_its_device_order_and_a_container_without_devices_has_no_rows() -> None:
    answer = [
        pb.PodResources(
            namespace="default",
            name="p",
            containers=[
                pb.ContainerResources(
                    name="c", devices=[pb.ContainerDevices(resource_name="example.com/gpu", device_ids=["g1", "g0"])]
                ),
                pb.ContainerResources(name="sidecar"),
            ],
        )
    ]
    assert entries_from_pod_resources(answer) == [
        PodResourcesEntry("default", "p", "c", "example.com/gpu", ("g1", "g0")),
    ]


def test_dra_devices_of_gpushares_driver_are_rows_by_the_vendors_id() -> None:
    def claim_resource(device: str, vendor: str, driver: str = "gpushare.k8s.io") -> pb.ClaimResource:
        names = [vendor, f"k8s.gpushare.k8s.io/claim=uid-{device}"]
        return pb.ClaimResource(
            driver_name=driver, pool_name="n", device_name=device, cdi_devices=[pb.CDIDevice(name=n) for n in names]
        )

    pods = [
        pb.PodResources(
            namespace="team",
            name="owner",
            containers=[
                pb.ContainerResources(
                    name="main",
                    dynamic_resources=[
                        pb.DynamicResource(
                            claim_name="c",
                            claim_namespace="team",
                            claim_resources=[claim_resource("gpu-1", "nvidia.com/gpu=GPU-b")],
                        )
                    ],
                )
            ],
        ),
        pb.PodResources(
            namespace="spot",
            name="borrower",
            containers=[
                pb.ContainerResources(
                    name="main",
                    dynamic_resources=[
                        pb.DynamicResource(
                            claim_name="s",
                            claim_namespace="spot",
                            claim_resources=[
                                claim_resource("gpu-1-spot", "nvidia.com/gpu=GPU-b"),
                                claim_resource("gpu-0-share4-1", "nvidia.com/gpu=GPU-a"),
                                claim_resource("gpu-0", "nvidia.com/gpu=GPU-a", driver="gpu.nvidia.com"),
                            ],
                        )
                    ],
                )
            ],
        ),
    ]
    rows = entries_from_pod_resources(pods)
    assert [(r.namespace, r.pod, r.resource, r.device_ids) for r in rows] == [
        ("team", "owner", "deviceclass.resource.kubernetes.io/gpu.gpushare.k8s.io", ("GPU-b",)),
        ("spot", "borrower", "gpushare/spot-gpu", ("spot-GPU-b",)),
    ]
