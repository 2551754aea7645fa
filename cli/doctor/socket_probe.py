"""`gpushare doctor`'s probes of the node's sockets: NRI, kubelet's, the vendor plugins', the agent's endpoint.

Each probe does the least that proves the peer serves: a Unix socket accepts a connection;
NRI completes a real handshake (register, Configure, Synchronize) as a short-lived plugin of
its own name and then leaves; PodResources answers ``List`` and ``GetAllocatableResources``;
the agent answers ``/healthz``. Every wait is bounded; a failure is recorded, never raised.
"""

from __future__ import annotations

import contextlib
import http.client
import logging
import os
import socket
import stat
import time
from typing import Any

import grpc

from cli import agent_endpoint
from cli.doctor.diagnosis import AgentFact, KubeletFact, NriFact, NvidiaPluginFact, SocketFact
from cli.doctor.nvidia_modes import strategy_of_answer
from controller.io.podresources import PodResourcesClient, PodResourcesError
from deviceplugins._pb import api_pb2, api_pb2_grpc
from deviceplugins.server import dial
from gpushare.ids import is_replica_id
from nri_plugin.errors import NriError, TransportError
from nri_plugin.stub import Stub

# Not in controller/proto (the NRI trust check never asks it): the method's path on the wire.
_GET_ALLOCATABLE = "/v1.PodResourcesLister/GetAllocatableResources"
_OWN_SOCKET_PREFIX = "gpushare-"  # gpushare's own device plugins (deviceplugins.server.socket_name)
_REGISTRATION = "kubelet.sock"
# An NRI index after every usual plugin's, so the handshake never runs ahead of a real one.
_DOCTOR_INDEX = "99"
_REPLY_GRACE_S = 0.2


def probe_socket(path: str, timeout_s: float = 1.0) -> SocketFact:
    """Whether ``path`` is a Unix socket that accepts a connection (closed again at once)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return SocketFact(path, "missing")
    except OSError as exc:
        return SocketFact(path, "refused", exc.strerror or str(exc))
    if not stat.S_ISSOCK(mode):
        return SocketFact(path, "not-socket")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout_s)
    try:
        sock.connect(path)
    except OSError as exc:
        return SocketFact(path, "refused", exc.strerror or str(exc))
    finally:
        sock.close()
    return SocketFact(path, "ok")


class _Listener:
    """The smallest NRI plugin: it keeps what Configure says about the runtime and handles nothing else."""

    def __init__(self) -> None:
        self.runtime: str | None = None
        self.version: str | None = None

    def configure(self, req: Any) -> None:
        self.runtime, self.version = str(req.runtime_name), str(req.runtime_version)

    def remove_container(self, pod: Any, container: Any) -> None:
        """Subscribed to because a mask of 0 means every event; after the fact, so it delays nothing."""


def probe_nri(path: str, timeout_s: float = 3.0) -> NriFact:
    """The NRI socket, and a real handshake on it that gives the runtime's name and version."""
    sock = probe_socket(path)
    if not sock.ok:
        return NriFact(sock)
    listener = _Listener()
    # The handshake logs "nri: connected" at INFO; the doctor's report says it instead.
    nri_log = logging.getLogger("nri_plugin")
    level = nri_log.level
    nri_log.setLevel(logging.WARNING)
    try:
        stub = Stub(
            listener, socket_path=path, name=f"gpushare-doctor-{os.getpid()}", index=_DOCTOR_INDEX, timeout_s=timeout_s
        )
        try:
            stub.connect()
            # connect() returns as the Synchronize handler returns, before its reply is on the wire;
            # closing at once makes containerd log "failed to synchronize plugin". Let the reply go out.
            time.sleep(_REPLY_GRACE_S)
        finally:
            stub.close()
    except (NriError, TransportError) as exc:
        return NriFact(sock, error=str(exc))
    finally:
        nri_log.setLevel(level)
    return NriFact(sock, listener.runtime, listener.version)


def probe_nvidia_plugin(
    kubelet: KubeletFact, device_list_dirs: tuple[str, ...], timeout_s: float = 3.0
) -> NvidiaPluginFact | None:
    """NVIDIA's device plugin and the strategy of its ``Allocate`` answer for one of its GPUs.

    Its GPUs come from kubelet (GetAllocatableResources: IDs named ``GPU-``/``MIG-``), never from a
    ListAndWatch of our own: NVIDIA's plugin hands a health change to whichever ListAndWatch stream
    reads it first, so a second stream, even one closed at once, can keep kubelet from learning that
    a GPU failed (docs/nvidia.md). ``Allocate`` is unary and only describes the devices; the socket
    that answers it for that GPU is NVIDIA's."""
    for resource, ids in sorted((kubelet.device_ids or {}).items()):
        gpus = [i for i in ids if i.startswith(("GPU-", "MIG-"))]
        if not gpus:
            continue
        for sock in kubelet.vendor_sockets:
            if not sock.ok:
                continue
            try:
                with dial(sock.path) as channel:
                    stub = api_pb2_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]
                    request = api_pb2.AllocateRequest(
                        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=gpus[:1])]
                    )
                    answers = stub.Allocate(request, timeout=timeout_s).container_responses
            except grpc.RpcError:
                continue  # not this plugin's device: another vendor's socket
            if len(answers) != 1:
                continue
            answer = answers[0]
            strategy = strategy_of_answer(
                dict(answer.envs),
                [m.container_path for m in answer.mounts],
                list(answer.annotations),
                [d.name for d in answer.cdi_devices],
                device_list_dirs,
            )
            return NvidiaPluginFact(sock.path, strategy, replicas=any(is_replica_id(i) for i in gpus))
        return NvidiaPluginFact("", None, f"no plugin socket answers Allocate of {resource} {gpus[0]}")
    return None


def probe_kubelet(plugin_dir: str, pod_resources: str, timeout_s: float = 3.0) -> KubeletFact:
    """The device-plugin directory and its sockets, and PodResources: List, then the allocatable devices."""
    exists = os.path.isdir(plugin_dir)
    try:
        names = sorted(os.listdir(plugin_dir)) if exists else []
    except OSError:
        names = []  # not ours to list: kubelet.sock is still probed by name
    vendor = tuple(
        probe_socket(os.path.join(plugin_dir, n))
        for n in names
        if n != _REGISTRATION and not n.startswith(_OWN_SOCKET_PREFIX) and n.endswith(".sock")
    )
    registration = probe_socket(os.path.join(plugin_dir, _REGISTRATION))
    pr = probe_socket(pod_resources)
    fact = KubeletFact(plugin_dir, exists, registration, vendor, pr)
    if not pr.ok:
        return fact
    pods = list_error = ids = devices_error = None
    with PodResourcesClient(pod_resources, timeout_s=timeout_s) as client:
        try:
            pods = len(client.list())
        except PodResourcesError as exc:
            list_error = str(exc)
        try:
            ids = client.allocatable()
        except PodResourcesError as exc:
            devices_error = str(exc)
    devices = {r: len(i) for r, i in ids.items()} if ids is not None else None
    return KubeletFact(plugin_dir, exists, registration, vendor, pr, pods, list_error, devices, devices_error, ids)


def probe_agent(listen: str, timeout_s: float = 3.0) -> AgentFact:
    """``/healthz`` on the agent's endpoint, and how its spot sees returns (``/status``, loopback only)."""
    try:
        code, _ = agent_endpoint.get(listen, "/healthz", timeout_s)
    except (OSError, ValueError, http.client.HTTPException) as exc:
        return AgentFact(listen, error=str(exc) or type(exc).__name__)
    spot: bool | None = None
    mode = None
    with contextlib.suppress(OSError, ValueError, AttributeError):
        runtime = agent_endpoint.fetch_status(listen, timeout_s).get("spot_runtime")  # present only while spot is on
        spot, mode = bool(runtime), (runtime or {}).get("mode")
    return AgentFact(listen, code, spot=spot, spot_mode=mode)


__all__ = ["probe_agent", "probe_kubelet", "probe_nri", "probe_nvidia_plugin", "probe_socket"]
