"""Client of kubelet's pod-resources v1 API: which device IDs each container was allocated.

It is the ``nri_plugin.AllocationOracle`` the NRI plugin consults for cross-pod instructions
(design §8). Calls ``Get`` for one pod (kubelet feature gate ``KubeletPodResourcesGet``) and
falls back to ``List`` for good once kubelet answers UNIMPLEMENTED. Answers are cached for
``ttl_s`` when positive (a container's allocation never changes while it exists); anything else is
asked again. Every call has a timeout; gRPC errors become
``PodResourcesError`` (an ``OracleUnavailable``) naming the socket and the likely fix.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import TypeVar

import grpc

from controller._pb import podresources_pb2, podresources_pb2_grpc
from nri_plugin.errors import OracleUnavailable

log = logging.getLogger(__name__)

Allocation = Mapping[str, frozenset[str]]
_T = TypeVar("_T")

# kubelet serves the pod-resources API at 100 calls a second with a burst of 10, for all its
# clients together, and refuses the rest (RESOURCE_EXHAUSTED). The agent Lists on every pass,
# and a busy cluster's pod events outran that: the node part of those passes was skipped, and
# the NRI plugin's Get for a container created meanwhile would have been refused (the container
# fails closed). Calls are spaced this far apart instead: the caller waits, kubelet never refuses.
CALL_INTERVAL_S = 0.012


class PodResourcesError(OracleUnavailable):
    """kubelet's pod-resources API could not answer."""


def _allocation_of(pod: podresources_pb2.PodResources, container: str) -> dict[str, frozenset[str]] | None:
    for ctr in pod.containers:
        if ctr.name == container:
            out: dict[str, set[str]] = {}
            for dev in ctr.devices:
                out.setdefault(dev.resource_name, set()).update(dev.device_ids)
            return {k: frozenset(v) for k, v in out.items()}
    return None


class PodResourcesClient:
    """``allocated_ids(namespace, pod, container)`` over the kubelet pod-resources socket."""

    def __init__(
        self,
        socket_path: str,
        *,
        timeout_s: float = 0.5,
        ttl_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.socket_path = socket_path
        self._timeout_s = timeout_s
        self._ttl_s = ttl_s
        self._clock = clock
        self._channel = grpc.insecure_channel(
            f"unix://{socket_path}", options=[("grpc.max_receive_message_length", 16 << 20)]
        )
        self._stub = podresources_pb2_grpc.PodResourcesListerStub(self._channel)  # type: ignore[no-untyped-call]
        self._lock = threading.Lock()
        self._get_supported = True
        self._pace = threading.Lock()  # held only while waiting for a call's turn
        self._last_call = float("-inf")  # time.monotonic() of the last call's start
        self._pods: dict[tuple[str, str], tuple[float, podresources_pb2.PodResources]] = {}

    def allocated_ids(self, namespace: str, pod: str, container: str) -> Allocation:
        """``{resource: device IDs}`` of one container; empty when kubelet does not list it.

        Only a positive answer (the container holds devices) is served from the cache; anything
        else asks kubelet again, so an allocation made after an earlier question is seen at once.
        """
        cached = self._cached(namespace, pod)
        if cached is not None:
            hit = _allocation_of(cached, container)
            if hit:
                return hit
        found = self._fetch(namespace, pod)
        if found is None:
            return {}
        return _allocation_of(found, container) or {}

    def list(self) -> list[podresources_pb2.PodResources]:
        """Every pod kubelet knows, fresh (also refreshes the cache)."""
        resp = self._call(
            "List", lambda: self._stub.List(podresources_pb2.ListPodResourcesRequest(), timeout=self._timeout_s)
        )
        now = self._clock()
        with self._lock:
            self._pods = {(p.namespace, p.name): (now, p) for p in resp.pod_resources}
        return list(resp.pod_resources)

    def allocatable(self) -> dict[str, tuple[str, ...]]:
        """Resource -> the device IDs kubelet can allocate: every registered plugin's devices that it
        lists Healthy. This is how gpushare learns a vendor's GPUs and their health without opening a
        ListAndWatch stream of its own on the vendor's socket (docs/nvidia.md, "When a GPU turns
        unhealthy")."""
        resp = self._call(
            "GetAllocatableResources",
            lambda: self._stub.GetAllocatableResources(
                podresources_pb2.AllocatableResourcesRequest(), timeout=self._timeout_s
            ),
        )
        out: dict[str, list[str]] = {}
        for d in resp.devices:
            out.setdefault(d.resource_name, []).extend(d.device_ids)
        return {r: tuple(ids) for r, ids in out.items()}

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> PodResourcesClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _cached(self, namespace: str, name: str) -> podresources_pb2.PodResources | None:
        with self._lock:
            cached = self._pods.get((namespace, name))
        if cached is not None and self._clock() - cached[0] <= self._ttl_s:
            return cached[1]
        return None

    def _fetch(self, namespace: str, name: str) -> podresources_pb2.PodResources | None:
        if self._get_supported:
            try:
                req = podresources_pb2.GetPodResourcesRequest(pod_name=name, pod_namespace=namespace)
                resp = self._call("Get", lambda: self._stub.Get(req, timeout=self._timeout_s))
            except _Unimplemented:
                log.info("podresources: kubelet does not serve Get; using List from now on")
                self._get_supported = False
            except _NotFound:
                return None
            else:
                with self._lock:
                    self._pods[(namespace, name)] = (self._clock(), resp.pod_resources)
                pod: podresources_pb2.PodResources = resp.pod_resources
                return pod
        for pod in self.list():
            if (pod.namespace, pod.name) == (namespace, name):
                return pod
        return None

    def _wait_turn(self) -> None:
        with self._pace:
            wait = self._last_call + CALL_INTERVAL_S - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            self._last_call = time.monotonic()

    def _call(self, method: str, fn: Callable[[], _T]) -> _T:
        self._wait_turn()
        try:
            return fn()
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else None
            if code == grpc.StatusCode.UNIMPLEMENTED and method == "Get":
                raise _Unimplemented() from exc
            if code == grpc.StatusCode.NOT_FOUND and method == "Get":
                raise _NotFound() from exc
            details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            hint = (
                "is kubelet running and the pod-resources directory mounted?"
                if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
                else "see kubelet's log"
            )
            raise PodResourcesError(
                f"gpushare: kubelet pod-resources {method} on {self.socket_path} failed "
                f"({code.name if code else 'error'}: {details}); {hint}"
            ) from exc


class _Unimplemented(PodResourcesError):
    """Get is not served (feature gate off): fall back to List."""


class _NotFound(PodResourcesError):
    """Get: kubelet does not know the pod."""
