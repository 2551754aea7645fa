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
from collections.abc import Iterator
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from cli import agent_endpoint
from cli.doctor.diagnosis import AgentFact, KubeletFact, NriFact, SocketFact
from controller._pb import podresources_pb2
from controller.io.podresources import PodResourcesClient, PodResourcesError
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


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= len(buf) or shift > 63:
            raise ValueError("truncated varint")
        b = buf[i]
        value |= (b & 0x7F) << shift
        i += 1
        shift += 7
        if not b & 0x80:
            return value, i


def _fields(buf: bytes) -> Iterator[tuple[int, bytes | None]]:
    """(field number, payload of a length-delimited field, else None) of one protobuf message."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, i = _varint(buf, i)
            yield number, None
        elif wire == 2:
            size, i = _varint(buf, i)
            if i + size > len(buf):
                raise ValueError("truncated field")
            yield number, buf[i : i + size]
            i += size
        elif wire in (1, 5):
            i += 8 if wire == 1 else 4
            yield number, None
        else:
            raise ValueError(f"unsupported wire type {wire}")
    if i != len(buf):
        raise ValueError("truncated fixed-width field")


def decode_allocatable(raw: bytes) -> dict[str, int]:
    """``AllocatableResourcesResponse`` bytes -> device count per resource; ValueError when malformed."""
    counts: dict[str, int] = {}
    for number, payload in _fields(raw):
        if number == 1 and payload is not None:
            try:
                devices = podresources_pb2.ContainerDevices.FromString(payload)
            except DecodeError as exc:
                raise ValueError(f"bad ContainerDevices: {exc}") from exc
            counts[devices.resource_name] = counts.get(devices.resource_name, 0) + len(devices.device_ids)
    return counts


def _allocatable(path: str, timeout_s: float) -> dict[str, int]:
    with grpc.insecure_channel(f"unix://{path}") as channel:
        call = channel.unary_unary(_GET_ALLOCATABLE, request_serializer=lambda _: b"", response_deserializer=bytes)
        return decode_allocatable(call(None, timeout=timeout_s))


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
    pods = list_error = devices = devices_error = None
    try:
        with PodResourcesClient(pod_resources, timeout_s=timeout_s) as client:
            pods = len(client.list())
    except PodResourcesError as exc:
        list_error = str(exc)
    try:
        devices = _allocatable(pod_resources, timeout_s)
    except (grpc.RpcError, ValueError) as exc:
        code = exc.code() if isinstance(exc, grpc.Call) else None
        devices_error = f"{code.name if code else 'error'}: {exc.details() if isinstance(exc, grpc.Call) else exc}"
    return KubeletFact(plugin_dir, exists, registration, vendor, pr, pods, list_error, devices, devices_error)


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


__all__ = ["decode_allocatable", "probe_agent", "probe_kubelet", "probe_nri", "probe_socket"]
