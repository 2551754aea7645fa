"""A kubelet stand-in that speaks the device-plugin protocol over real unix sockets.

It does what kubelet's device manager does (k8s.io/kubelet pkg/apis/deviceplugin/v1beta1), and nothing more:

- serves ``v1beta1.Registration`` on ``<dir>/kubelet.sock``; on ``Register`` it checks the
  version and the resource name, dials ``<dir>/<endpoint>`` (blocking, 10 s), calls
  ``GetDevicePluginOptions`` *inside* the Register call, then opens ``ListAndWatch`` in the
  background and records every full list it receives;
- clients are kept per (resource, socket path) as current kubelets do: a second registration
  for the same endpoint adds a client; a client goes away when its stream ends;
- ``allocate`` / ``preferred`` dial the plugin socket like kubelet at admission;
- ``restart`` is a kubelet restart: the server and every client go away, every *socket* in
  the directory is deleted (regular files stay), and a fresh ``kubelet.sock`` is served.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import grpc

from deviceplugins._pb import api_pb2, api_pb2_grpc

# kubelet's Go grpc.Dial never shares a connection with an earlier dial of the same path;
# grpcio would (global subchannel pool), inheriting a dead socket's reconnect back-off.
_FRESH = [("grpc.use_local_subchannel_pool", 1)]
_RESOURCE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


@dataclass
class Registration:
    version: str
    endpoint: str
    resource_name: str
    options: api_pb2.DevicePluginOptions  # as sent in RegisterRequest
    options_rpc: api_pb2.DevicePluginOptions  # as answered by GetDevicePluginOptions
    at: float


@dataclass(eq=False)
class _Client:
    registration: Registration
    channel: grpc.Channel
    call: Any = None
    thread: threading.Thread | None = None
    lists: list[tuple[float, list[tuple[str, str]]]] = field(default_factory=list)
    ended: bool = False


class KubeletPeer:
    def __init__(self, plugin_dir: str) -> None:
        self.dir = plugin_dir
        self.socket = os.path.join(plugin_dir, "kubelet.sock")
        self.registrations: list[Registration] = []
        self.refusals: list[str] = []
        self.started_at = 0.0  # monotonic time the current kubelet.sock began serving
        self._stopping = threading.Event()
        self._clients: dict[str, list[_Client]] = {}
        self._cond = threading.Condition()
        self._server: grpc.Server | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._seq = 0

    # --- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        os.makedirs(self.dir, exist_ok=True)
        if os.path.exists(self.socket):
            os.unlink(self.socket)
        # kubelet (Go) has no worker limit; a Register blocked dialling a wiped socket must not starve others.
        self._executor = ThreadPoolExecutor(max_workers=64, thread_name_prefix="gpushare-kpeer-rpc")
        server = grpc.server(self._executor)
        api_pb2_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        server.add_insecure_port("unix:" + self.socket)
        self._stopping.clear()
        server.start()
        self.started_at = time.monotonic()
        self._server = server

    def stop(self) -> None:
        """kubelet exits: its server and every client stream end."""
        self._stopping.set()  # a Register still dialling its plugin gives up (the process is gone)
        if self._server is not None:
            self._server.stop(None).wait()
            self._server = None
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        with self._cond:
            clients = [c for cs in self._clients.values() for c in cs]
            self._clients.clear()
        for c in clients:
            self._close_client(c)

    def restart(self, *, wipe_dir: bool = False) -> None:
        """kubelet restarts: stop, delete every socket in the directory, serve a new kubelet.sock."""
        self.stop()
        if wipe_dir:
            # The plugins are live and may create a socket at any moment: move the directory
            # away in one step, then delete it; start() makes a fresh one.
            graveyard = f"{self.dir}.old"
            os.rename(self.dir, graveyard)
            shutil.rmtree(graveyard, ignore_errors=True)
        else:
            for name in os.listdir(self.dir):
                path = os.path.join(self.dir, name)
                # The plugins are live: a socket may vanish between listdir and unlink.
                with contextlib.suppress(FileNotFoundError):
                    if stat.S_ISSOCK(os.lstat(path).st_mode):
                        os.unlink(path)
        self.start()

    def _close_client(self, c: _Client) -> None:
        if c.call is not None:
            c.call.cancel()
        if c.thread is not None:
            c.thread.join(5)
        c.channel.close()

    # --- what kubelet does on Register --------------------------------------------------

    def _register(self, req: api_pb2.RegisterRequest, context: grpc.ServicerContext) -> api_pb2.Empty:
        if req.version != "v1beta1":
            self.refusals.append(f"version {req.version}")
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unsupported version {req.version!r}")
        if not _RESOURCE.match(req.resource_name) or req.resource_name.startswith("kubernetes.io/"):
            self.refusals.append(f"resource {req.resource_name}")
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"invalid resource name {req.resource_name!r}")
        channel = grpc.insecure_channel("unix:" + os.path.join(self.dir, req.endpoint), options=_FRESH)
        try:
            ready = grpc.channel_ready_future(channel)
            deadline = time.monotonic() + 10  # kubelet's blocking dial timeout
            while True:
                try:
                    ready.result(timeout=0.05)
                    break
                except grpc.FutureTimeoutError:
                    if self._stopping.is_set() or time.monotonic() > deadline:
                        ready.cancel()
                        raise
            stub = api_pb2_grpc.DevicePluginStub(channel)
            options = stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=10)
        except (grpc.FutureTimeoutError, grpc.RpcError) as exc:
            channel.close()
            context.abort(grpc.StatusCode.UNAVAILABLE, f"cannot dial plugin {req.endpoint}: {exc}")
        reg = Registration(req.version, req.endpoint, req.resource_name, req.options, options, time.monotonic())
        client = _Client(reg, channel)
        with self._cond:
            self._seq += 1
            self._clients.setdefault(req.resource_name, []).append(client)
            self.registrations.append(reg)
            self._cond.notify_all()
        client.call = stub.ListAndWatch(api_pb2.Empty())
        client.thread = threading.Thread(
            target=self._consume, args=(client,), name=f"gpushare-kpeer-law-{self._seq}", daemon=True
        )
        client.thread.start()
        return api_pb2.Empty()

    def _consume(self, client: _Client) -> None:
        try:
            for msg in client.call:
                with self._cond:
                    client.lists.append((time.monotonic(), [(d.ID, d.health) for d in msg.devices]))
                    self._cond.notify_all()
        except grpc.RpcError:
            pass  # cancelled by us, or the plugin went away: kubelet marks the resource unhealthy
        with self._cond:
            client.ended = True
            clients = self._clients.get(client.registration.resource_name, [])
            if client in clients:
                clients.remove(client)
            self._cond.notify_all()

    # --- test helpers -------------------------------------------------------------------

    def registered(self, resource: str) -> list[Registration]:
        with self._cond:
            return [r for r in self.registrations if r.resource_name == resource]

    def wait_registrations(self, resource: str, count: int, timeout_s: float = 10.0) -> list[Registration]:
        with self._cond:
            ok = self._cond.wait_for(lambda: len(self.registered_nolock(resource)) >= count, timeout_s)
            regs = self.registered_nolock(resource)
        assert ok, f"{resource}: {len(regs)} registration(s) after {timeout_s}s, expected {count}"
        return regs

    def registered_nolock(self, resource: str) -> list[Registration]:
        return [r for r in self.registrations if r.resource_name == resource]

    def _newest(self, resource: str) -> _Client | None:
        clients = self._clients.get(resource)
        return clients[-1] if clients else None

    def wait_devices(
        self, resource: str, predicate: Callable[[list[tuple[str, str]]], bool], timeout_s: float = 5.0
    ) -> list[tuple[str, str]]:
        def check() -> bool:
            c = self._newest(resource)
            return c is not None and bool(c.lists) and predicate(c.lists[-1][1])

        with self._cond:
            ok = self._cond.wait_for(check, timeout_s)
            c = self._newest(resource)
            last = c.lists[-1][1] if c is not None and c.lists else None
        assert ok, f"{resource}: latest list {last} never matched within {timeout_s}s"
        assert last is not None
        return last

    def wait_list_count(self, resource: str, count: int, timeout_s: float = 5.0) -> list[float]:
        """Arrival times of the lists received on the current stream, once there are ``count``."""

        def enough() -> bool:
            c = self._newest(resource)
            return c is not None and len(c.lists) >= count

        with self._cond:
            ok = self._cond.wait_for(enough, timeout_s)
            assert ok, f"{resource}: fewer than {count} lists within {timeout_s}s"
            c = self._newest(resource)
            assert c is not None
            return [t for t, _ in c.lists]

    def end_stream(self, resource: str) -> None:
        """kubelet drops the plugin's ListAndWatch (e.g. an internal error on its side)."""
        with self._cond:
            clients = self._clients.pop(resource, [])
        for c in clients:
            self._close_client(c)

    def _stub(self, resource: str) -> tuple[grpc.Channel, Any]:
        reg = self.registered(resource)[-1]
        channel = grpc.insecure_channel("unix:" + os.path.join(self.dir, reg.endpoint), options=_FRESH)
        return channel, api_pb2_grpc.DevicePluginStub(channel)

    def allocate(self, resource: str, ids: list[str]) -> api_pb2.ContainerAllocateResponse:
        channel, stub = self._stub(resource)
        with channel:
            req = api_pb2.AllocateRequest(container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)])
            resp = stub.Allocate(req, timeout=5)
        assert len(resp.container_responses) == 1
        return resp.container_responses[0]

    def preferred(self, resource: str, available: list[str], must_include: list[str], size: int) -> list[str]:
        channel, stub = self._stub(resource)
        with channel:
            creq = api_pb2.ContainerPreferredAllocationRequest(
                available_deviceIDs=available, must_include_deviceIDs=must_include, allocation_size=size
            )
            resp = stub.GetPreferredAllocation(api_pb2.PreferredAllocationRequest(container_requests=[creq]), timeout=5)
        return list(resp.container_responses[0].deviceIDs)


class _Registration(api_pb2_grpc.RegistrationServicer):
    def __init__(self, peer: KubeletPeer) -> None:
        self._peer = peer

    def Register(self, request: api_pb2.RegisterRequest, context: grpc.ServicerContext) -> api_pb2.Empty:  # noqa: N802
        return self._peer._register(request, context)
