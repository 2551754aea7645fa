"""A small real gRPC server speaking kubelet's pod-resources v1 API on a private unix socket.

It stands in for kubelet in the containerd tier (the kubelet tier uses the real one): the test
states which devices each container was allocated, and the NRI plugin asks, exactly as it asks
kubelet (`Get`, or `List`).
"""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Callable
from concurrent import futures
from pathlib import Path

import grpc

from controller._pb import podresources_pb2 as pb
from controller._pb import podresources_pb2_grpc as pb_grpc
from localcluster.lifecycle import Lifecycle

# (namespace, pod) -> container -> resource -> device ids
Allocations = dict[tuple[str, str], dict[str, dict[str, list[str]]]]


class _Lister(pb_grpc.PodResourcesListerServicer):
    def __init__(self, server: PodResourcesServer) -> None:
        self._server = server

    def _pod(self, key: tuple[str, str]) -> pb.PodResources:
        containers = self._server.allocations.get(key, {})
        return pb.PodResources(
            namespace=key[0],
            name=key[1],
            containers=[
                pb.ContainerResources(
                    name=name,
                    devices=[pb.ContainerDevices(resource_name=r, device_ids=ids) for r, ids in sorted(res.items())],
                )
                for name, res in sorted(containers.items())
            ],
        )

    def List(  # noqa: N802 -- gRPC method name
        self,
        request: pb.ListPodResourcesRequest,
        context: grpc.ServicerContext,
    ) -> pb.ListPodResourcesResponse:
        self._server.count("List")
        return pb.ListPodResourcesResponse(pod_resources=[self._pod(k) for k in sorted(self._server.allocations)])

    def Get(  # noqa: N802 -- gRPC method name
        self,
        request: pb.GetPodResourcesRequest,
        context: grpc.ServicerContext,
    ) -> pb.GetPodResourcesResponse:
        self._server.count("Get")
        key = (request.pod_namespace, request.pod_name)
        if key not in self._server.allocations:
            context.abort(grpc.StatusCode.NOT_FOUND, f"pod {key[0]}/{key[1]} not found")
        return pb.GetPodResourcesResponse(pod_resources=self._pod(key))

    def GetAllocatableResources(  # noqa: N802 -- gRPC method name
        self,
        request: pb.AllocatableResourcesRequest,
        context: grpc.ServicerContext,
    ) -> pb.AllocatableResourcesResponse:
        self._server.count("GetAllocatableResources")
        devices = self._server.allocatable()
        return pb.AllocatableResourcesResponse(
            devices=[pb.ContainerDevices(resource_name=r, device_ids=ids) for r, ids in sorted(devices.items())]
        )


class PodResourcesServer(Lifecycle):
    """``allocatable``: what GetAllocatableResources answers, resource -> IDs (kubelet: the registered
    plugins' Healthy devices); a callable, so a test can answer from a live device list."""

    def __init__(
        self,
        allocations: Allocations | None = None,
        allocatable: Callable[[], dict[str, list[str]]] | None = None,
    ) -> None:
        self.allocations: Allocations = dict(allocations or {})
        self.allocatable = allocatable or dict
        self._dir = Path(tempfile.mkdtemp(prefix="gs-pr-", dir="/tmp"))
        self.socket = str(self._dir / "kubelet.sock")
        self.calls: dict[str, int] = {}
        self._lock = threading.Lock()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="grpc-podres"))
        pb_grpc.add_PodResourcesListerServicer_to_server(_Lister(self), self._server)  # type: ignore[no-untyped-call]
        self._server.add_insecure_port(f"unix://{self.socket}")

    def count(self, method: str) -> None:
        with self._lock:
            self.calls[method] = self.calls.get(method, 0) + 1

    def allocate(self, namespace: str, pod: str, container: str, resource: str, ids: list[str]) -> None:
        self.allocations.setdefault((namespace, pod), {}).setdefault(container, {})[resource] = list(ids)

    def start(self) -> None:
        self._server.start()

    def stop(self) -> None:
        self._server.stop(grace=None).wait(5)
        for f in self._dir.iterdir():
            f.unlink()
        self._dir.rmdir()

    def close(self) -> None:
        self.stop()
