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
