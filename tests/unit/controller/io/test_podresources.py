"""PodResourcesClient against a small real gRPC server on a private Unix socket."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from controller._pb import podresources_pb2 as pb
from controller._pb import podresources_pb2_grpc as pb_grpc
from controller.io.podresources import PodResourcesClient, PodResourcesError
from nri_plugin import AllocationOracle, OracleUnavailable

PODS = [
    pb.PodResources(
        namespace="team",
        name="tenant",
        containers=[
            pb.ContainerResources(
                name="app",
                devices=[
                    pb.ContainerDevices(resource_name="gpushare/share-gpu-4", device_ids=["gpushare-system/s-0"]),
                    pb.ContainerDevices(resource_name="gpushare/share-gpu-4", device_ids=["gpushare-system/s-1"]),
                ],
            ),
            pb.ContainerResources(name="sidecar"),
        ],
    )
]


class Lister(pb_grpc.PodResourcesListerServicer):
    def __init__(self, *, serve_get: bool) -> None:
        self.serve_get = serve_get
        self.pods = list(PODS)
        self.calls: list[str] = []

    def List(  # noqa: N802 (the gRPC method name)
        self, request: pb.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> pb.ListPodResourcesResponse:
        self.calls.append("List")
        return pb.ListPodResourcesResponse(pod_resources=self.pods)

    def Get(  # noqa: N802 (the gRPC method name)
        self, request: pb.GetPodResourcesRequest, context: grpc.ServicerContext
    ) -> pb.GetPodResourcesResponse:
        self.calls.append("Get")
        if not self.serve_get:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "feature gate KubeletPodResourcesGet is off")
        for p in self.pods:
            if (p.namespace, p.name) == (request.pod_namespace, request.pod_name):
                return pb.GetPodResourcesResponse(pod_resources=p)
        context.abort(grpc.StatusCode.NOT_FOUND, "pod not found")
        raise AssertionError("unreachable")


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="gs-pr-", dir="/tmp") as d:
        yield Path(d)


def _serve(lister: Lister, path: Path) -> grpc.Server:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="grpc-test"))
    pb_grpc.add_PodResourcesListerServicer_to_server(lister, server)
    server.add_insecure_port(f"unix://{path}")
    server.start()
    return server


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("serve_get", [True, False])
def test_allocated_ids_with_get_or_list_fallback(sock_dir: Path, serve_get: bool) -> None:
    lister = Lister(serve_get=serve_get)
    server = _serve(lister, sock_dir / "kubelet.sock")
    clock = Clock()
    try:
        with PodResourcesClient(str(sock_dir / "kubelet.sock"), clock=clock, ttl_s=2.0) as client:
            assert isinstance(client, AllocationOracle)
            want = {"gpushare/share-gpu-4": frozenset({"gpushare-system/s-0", "gpushare-system/s-1"})}
            assert client.allocated_ids("team", "tenant", "app") == want
            assert client.allocated_ids("team", "tenant", "sidecar") == {}
            assert client.allocated_ids("team", "tenant", "nope") == {}
            calls = len(lister.calls)
            clock.now += 1.0  # within the TTL: answered from the cache
            assert client.allocated_ids("team", "tenant", "app") == want
            assert len(lister.calls) == calls
            clock.now += 5.0  # expired: asks again
            assert client.allocated_ids("team", "tenant", "app") == want
            assert len(lister.calls) == calls + 1
            assert client.allocated_ids("team", "unknown", "app") == {}
    finally:
        server.stop(None).wait()
    assert ("Get" in lister.calls) is True
    if not serve_get:
        # UNIMPLEMENTED once, then List only.
        assert lister.calls.count("Get") == 1


def test_unreachable_socket_is_our_error_naming_the_socket(sock_dir: Path) -> None:
    path = str(sock_dir / "missing.sock")
    with PodResourcesClient(path, timeout_s=0.2) as client:
        with pytest.raises(PodResourcesError, match=r"missing\.sock") as err:
            client.allocated_ids("team", "tenant", "app")
        assert isinstance(err.value, OracleUnavailable)
        assert "UNAVAILABLE" in str(err.value) or "DEADLINE_EXCEEDED" in str(err.value)


def test_a_negative_answer_is_not_cached(sock_dir: Path) -> None:
    lister = Lister(serve_get=True)
    lister.pods = []
    server = _serve(lister, sock_dir / "kubelet.sock")
    try:
        with PodResourcesClient(str(sock_dir / "kubelet.sock"), ttl_s=60.0) as client:
            assert client.allocated_ids("team", "tenant", "app") == {}
            lister.pods = list(PODS)  # kubelet admits the pod after our first question
            assert client.allocated_ids("team", "tenant", "app") != {}
    finally:
        server.stop(None).wait()


class KubeletLimit(Lister):
    """kubelet's limit on the pod-resources API: a token bucket of 10, refilled at 100 a second."""

    def __init__(self) -> None:
        super().__init__(serve_get=True)
        self.tokens, self.at, self.refused = 10.0, time.monotonic(), 0

    def List(  # noqa: N802 (the gRPC method name)
        self, request: pb.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> pb.ListPodResourcesResponse:
        now = time.monotonic()
        self.tokens, self.at = min(10.0, self.tokens + (now - self.at) * 100), now
        if self.tokens < 1:
            self.refused += 1
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "rejected by rate limit")
        self.tokens -= 1
        return super().List(request, context)


def test_calls_are_spaced_under_kubelets_limit_not_refused(sock_dir: Path) -> None:
    lister = KubeletLimit()
    server = _serve(lister, sock_dir / "kubelet.sock")
    try:
        with PodResourcesClient(str(sock_dir / "kubelet.sock"), timeout_s=5) as client:
            for _ in range(60):  # a pass per pod event of a busy cluster, back to back
                assert client.list()
        assert lister.refused == 0 and lister.calls.count("List") == 60
    finally:
        server.stop(0)
