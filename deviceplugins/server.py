"""One kubelet device-plugin server per resource (design §2; NVIDIA's ``internal/plugin/server.go`` habit).

A ``DevicePluginServer`` owns one extended resource and one unix socket in the
device-plugin directory. One *run* is: ``serve`` (remove a stale socket, listen, dial our
own socket to prove it is up), ``register`` with kubelet, then answer kubelet until
``stop_serving``. Per-run state (gRPC server, worker pool, stream count) is rebuilt on every
run; the device list survives runs so a re-registration advertises at once what we had.

The device list is an immutable snapshot swapped under a condition variable: every open
``ListAndWatch`` stream wakes on ``set_devices`` and sends the whole list (no polling tick).
Subclasses decide ``allocate`` and ``preferred`` through ``policies.py``.

The restart policy lives in ``manager.py``; a server only reports upward through
``on_stream_end`` (kubelet ended ListAndWatch and will not dial us again until we re-register).
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc

from deviceplugins._pb import api_pb2, api_pb2_grpc
from deviceplugins.errors import (
    DevicePluginError,
    DevicesRefused,
    RegistrationFailed,
    SocketError,
    SocketReplaced,
    UnknownDevices,
)
from deviceplugins.policies import MAX_DEVICE_ID_CHARS, AdvertisedDevice, Allocation
from gpushare import keys
from gpushare.log import kv

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
KUBELET_SOCKET_NAME = "kubelet.sock"
# sockaddr_un.sun_path is 108 bytes including the terminating NUL.
MAX_SOCKET_PATH = 107
# A wake-up bound for idle streams; correctness never depends on it (set_devices notifies).
_STREAM_IDLE_RECHECK_S = 30.0
# How often a pending Register checks that our socket still exists.
_REGISTER_POLL_S = 0.05


def socket_name_for(resource: str) -> str:
    """``gpushare/share-gpu-4`` -> ``gpushare-share-gpu-4.sock`` (one socket per resource)."""
    return resource.replace("/", "-") + ".sock"


def job_name_for(resource: str) -> str:
    """Short name for thread names: ``gpushare/share-gpu-4`` -> ``share-gpu-4``."""
    return resource.removeprefix(keys.RESOURCE_PREFIX).replace("/", "-")


def unix_target(path: str) -> str:
    return "unix:" + path


# grpcio shares subchannels between channels to one target process-wide: a new channel to a
# socket path would inherit the reconnect back-off (~1 s) of an older channel that failed on
# a since-deleted socket at that path. Each dial here is fresh, like a Go grpc.Dial.
CHANNEL_OPTIONS = [("grpc.use_local_subchannel_pool", 1)]


def dial(path: str) -> grpc.Channel:
    """A fresh channel to a unix socket (see ``CHANNEL_OPTIONS``)."""
    return grpc.insecure_channel(unix_target(path), options=CHANNEL_OPTIONS)


def socket_identity(path: str) -> tuple[int, int, int] | None:
    """(device, inode, ctime) of a socket file, or None when absent: a recreated file differs."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISSOCK(st.st_mode):
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


class _Run:
    """State of one serve..stop_serving run; a stream of an old run never restarts a new one."""

    def __init__(self, server: grpc.Server, executor: ThreadPoolExecutor, identity: tuple[int, int, int] | None):
        self.server = server
        self.executor = executor
        self.identity = identity
        self.closing = False


class DevicePluginServer:
    """Base of every plugin: one resource, one socket, the five DevicePlugin RPCs.

    Subclasses override ``allocate`` (and ``preferred`` when ``preferred_allocation``).
    ``max_streams`` ListAndWatch streams may be open at once (kubelet opens one; the rest is
    for diagnosis); each pins a worker, so the pool is ``max_streams + unary_workers``.
    """

    def __init__(
        self,
        resource: str,
        plugin_dir: str,
        *,
        socket_name: str | None = None,
        preferred_allocation: bool = False,
        max_streams: int = 4,
        unary_workers: int = 4,
        dial_timeout_s: float = 5.0,
    ) -> None:
        self.resource = resource
        self.plugin_dir = plugin_dir
        self.endpoint = socket_name or socket_name_for(resource)
        self.socket_path = os.path.join(plugin_dir, self.endpoint)
        self.job = job_name_for(resource)
        self.preferred_allocation = preferred_allocation
        self.max_streams = max_streams
        self.unary_workers = unary_workers
        self.dial_timeout_s = dial_timeout_s
        # Called (from a gRPC thread) when kubelet ends the last ListAndWatch stream of a run.
        self.on_stream_end: Callable[[], None] = lambda: None
        self._cond = threading.Condition()
        self._devices: tuple[AdvertisedDevice, ...] = ()
        self._by_id: Mapping[str, AdvertisedDevice] = {}
        self._version = 0
        self._streams = 0
        self._run: _Run | None = None
        self._run_lock = threading.Lock()

    # --- device list --------------------------------------------------------------------

    def set_devices(self, devices: Iterable[AdvertisedDevice]) -> bool:
        """Replace the whole list; open streams send it at once. Returns False if nothing changed.

        Raises ``DevicePluginError`` (nothing changes) on an ID kubelet would refuse.
        """
        new = tuple(sorted(devices))
        ids = [d.id for d in new]
        problems = [i for i in ids if not i or len(i) > MAX_DEVICE_ID_CHARS]
        if problems:
            raise DevicePluginError(
                f"gpushare: {self.resource}: device ID(s) {problems!r:.200} are empty or longer than "
                f"{MAX_DEVICE_ID_CHARS} characters; kubelet would refuse the list"
            )
        if len(set(ids)) != len(ids):
            raise DevicePluginError(f"gpushare: {self.resource}: a device ID is listed twice in {ids!r:.200}")
        with self._cond:
            if new == self._devices:
                return False
            self._devices = new
            self._by_id = {d.id: d for d in new}
            self._version += 1
            self._cond.notify_all()
        log.debug("devices changed", extra=kv(resource=self.resource, devices=len(new)))
        return True

    def devices(self) -> tuple[AdvertisedDevice, ...]:
        with self._cond:
            return self._devices

    def advertised(self) -> Mapping[str, AdvertisedDevice]:
        """ID -> AdvertisedDevice of the current snapshot (never mutated; safe to read without the lock)."""
        with self._cond:
            return self._by_id

    def _republish(self) -> None:
        """Send the current list again (the proto's rule after a failed Allocate)."""
        with self._cond:
            self._version += 1
            self._cond.notify_all()

    # --- decisions (subclasses) ---------------------------------------------------------

    def options(self) -> api_pb2.DevicePluginOptions:
        return api_pb2.DevicePluginOptions(
            pre_start_required=False, get_preferred_allocation_available=self.preferred_allocation
        )

    def allocate(self, ids: Sequence[str]) -> Allocation:
        raise NotImplementedError

    def preferred(self, available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
        return list(must_include) + [i for i in available if i not in must_include][: max(0, size - len(must_include))]

    # --- one run: serve, register, stop -------------------------------------------------

    def socket_is_ours(self) -> bool:
        """False once our socket file is gone or replaced (kubelet wipes the dir on start)."""
        run = self._run
        return run is not None and run.identity is not None and socket_identity(self.socket_path) == run.identity

    def serve(self) -> None:
        """Listen on our socket and prove it answers; raises ``SocketError`` naming the path."""
        self.stop_serving()
        if len(self.socket_path.encode()) > MAX_SOCKET_PATH:
            raise SocketError(self.socket_path, f"path longer than {MAX_SOCKET_PATH} bytes; use a shorter plugin dir")
        if not os.path.isdir(self.plugin_dir):
            raise SocketError(self.socket_path, "the device-plugin directory does not exist (is kubelet installed?)")
        _remove_socket(self.socket_path)
        executor = ThreadPoolExecutor(
            max_workers=self.max_streams + self.unary_workers, thread_name_prefix=f"gpushare-dp-rpc-{self.job}"
        )
        server = grpc.server(executor)
        api_pb2_grpc.add_DevicePluginServicer_to_server(_Servicer(self), server)  # type: ignore[no-untyped-call]
        try:
            server.add_insecure_port(unix_target(self.socket_path))
            server.start()
        except RuntimeError as exc:
            server.stop(None)
            executor.shutdown(wait=True)
            raise SocketError(self.socket_path, f"cannot listen ({exc}); check permissions on the directory") from exc
        run = _Run(server, executor, socket_identity(self.socket_path))
        with self._run_lock:
            self._run = run
        # kubelet dials us during Register: prove the socket answers first (serve, then register).
        # A real RPC, not channel_ready_future: that one polls connectivity every 200 ms.
        with dial(self.socket_path) as channel:
            stub = api_pb2_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]
            probe = stub.GetDevicePluginOptions.future(
                api_pb2.Empty(), timeout=self.dial_timeout_s, wait_for_ready=True
            )
            try:
                self._await(probe, self.dial_timeout_s + 1.0, "dialling it ourselves")
            except (grpc.FutureTimeoutError, grpc.RpcError) as exc:
                self.stop_serving()
                reason = f"our own socket did not answer within {self.dial_timeout_s}s ({exc})"
                raise SocketError(self.socket_path, reason) from exc
            except SocketReplaced:
                self.stop_serving()
                raise

    def _await(self, future: grpc.Future[Any], timeout_s: float, doing: str) -> Any:
        """Wait for ``future``, but give up at once if our socket is deleted meanwhile.

        A starting kubelet wipes the directory: a dial of the deleted path would only time
        out, and a kubelet still dialling it would reach whatever we serve there next.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return future.result(timeout=min(_REGISTER_POLL_S, max(0.0, deadline - time.monotonic())))
            except grpc.FutureTimeoutError:
                if not self.socket_is_ours():
                    future.cancel()
                    raise SocketReplaced(
                        self.socket_path, f"removed while {doing} (kubelet restarting?); serving again"
                    ) from None
                if time.monotonic() >= deadline:
                    future.cancel()
                    raise

    def register(self, kubelet_socket: str, timeout_s: float) -> None:
        """One Register call; fails fast (UNAVAILABLE) when nothing listens on kubelet.sock."""
        request = api_pb2.RegisterRequest(
            version=API_VERSION, endpoint=self.endpoint, resource_name=self.resource, options=self.options()
        )
        with dial(kubelet_socket) as channel:
            stub = api_pb2_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
            future = stub.Register.future(request, timeout=timeout_s, wait_for_ready=False)
            try:
                self._await(future, timeout_s + 1.0, "registering")
            except grpc.RpcError as exc:
                code = exc.code() if isinstance(exc, grpc.Call) else None
                details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
                name = code.name if code is not None else "error"
                raise RegistrationFailed(self.resource, kubelet_socket, f"{name}: {details}") from exc
            except grpc.FutureTimeoutError as exc:
                raise RegistrationFailed(self.resource, kubelet_socket, f"no answer within {timeout_s}s") from exc

    def stop_serving(self) -> None:
        """End every stream, stop the server, join its workers, remove our socket if still ours."""
        with self._run_lock:
            run, self._run = self._run, None
        if run is None:
            return
        with self._cond:
            run.closing = True
            self._cond.notify_all()
        run.server.stop(grace=0.5).wait()
        run.executor.shutdown(wait=True)
        if run.identity is not None and socket_identity(self.socket_path) == run.identity:
            _remove_socket(self.socket_path)

    # --- stream bookkeeping (called by the servicer) ------------------------------------

    def _open_stream(self) -> bool:
        with self._cond:
            if self._streams >= self.max_streams:
                return False
            self._streams += 1
            return True

    def _stream_ended(self, run: _Run | None) -> None:
        with self._cond:
            self._streams -= 1
            last = self._streams == 0
            self._cond.notify_all()
        if run is not None and not run.closing and run is self._run and last:
            log.info("kubelet ended ListAndWatch", extra=kv(resource=self.resource))
            self.on_stream_end()

    def _watch(self, context: grpc.ServicerContext, run: _Run | None) -> Iterator[api_pb2.ListAndWatchResponse]:
        seen = [-1]  # a cell, so the predicate reads the current value

        def ready() -> bool:
            return self._version != seen[0] or not context.is_active() or run is None or run.closing

        while True:
            with self._cond:
                self._cond.wait_for(ready, timeout=_STREAM_IDLE_RECHECK_S)
                if run is None or run.closing or not context.is_active():
                    return
                if self._version == seen[0]:
                    continue
                seen[0], devices = self._version, self._devices
            yield api_pb2.ListAndWatchResponse(devices=[api_pb2.Device(ID=d.id, health=d.health) for d in devices])


def _remove_socket(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise SocketError(path, f"cannot remove the stale socket ({exc.strerror})") from exc


def allocation_to_pb(alloc: Allocation) -> api_pb2.ContainerAllocateResponse:
    return api_pb2.ContainerAllocateResponse(
        envs=dict(alloc.envs),
        annotations=dict(alloc.annotations),
        devices=[
            api_pb2.DeviceSpec(container_path=n.container_path, host_path=n.host_path, permissions=n.permissions)
            for n in alloc.devices
        ],
    )


class _Servicer(api_pb2_grpc.DevicePluginServicer):
    """The gRPC face of one ``DevicePluginServer``: translate, log one line per decision."""

    def __init__(self, plugin: DevicePluginServer) -> None:
        self._plugin = plugin

    def GetDevicePluginOptions(  # noqa: N802 (gRPC method name)
        self, request: api_pb2.Empty, context: grpc.ServicerContext
    ) -> api_pb2.DevicePluginOptions:
        return self._plugin.options()

    def ListAndWatch(  # noqa: N802 (gRPC method name)
        self, request: api_pb2.Empty, context: grpc.ServicerContext
    ) -> Iterator[api_pb2.ListAndWatchResponse]:
        plugin = self._plugin
        if not plugin._open_stream():
            context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"gpushare: {plugin.resource}: already {plugin.max_streams} ListAndWatch streams open",
            )
        run = plugin._run
        # Fires on every end (client gone, server stopped, stream finished): wake our wait and count.
        context.add_callback(lambda: plugin._stream_ended(run))
        return plugin._watch(context, run)

    def GetPreferredAllocation(  # noqa: N802 (gRPC method name)
        self, request: api_pb2.PreferredAllocationRequest, context: grpc.ServicerContext
    ) -> api_pb2.PreferredAllocationResponse:
        out = []
        for creq in request.container_requests:
            ids = self._plugin.preferred(
                list(creq.available_deviceIDs), list(creq.must_include_deviceIDs), int(creq.allocation_size)
            )
            log.info(
                "preferred allocation",
                extra=kv(
                    decision="prefer", resource=self._plugin.resource, size=creq.allocation_size, ids=",".join(ids)
                ),
            )
            out.append(api_pb2.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return api_pb2.PreferredAllocationResponse(container_responses=out)

    def Allocate(  # noqa: N802 (gRPC method name)
        self, request: api_pb2.AllocateRequest, context: grpc.ServicerContext
    ) -> api_pb2.AllocateResponse:
        plugin = self._plugin
        start = time.perf_counter()
        out = []
        for creq in request.container_requests:
            ids = list(creq.devices_ids)
            try:
                alloc = plugin.allocate(ids)
            except (UnknownDevices, DevicesRefused) as exc:
                log.info("allocate refused", extra=kv(decision="refuse", resource=plugin.resource, reason=str(exc)))
                plugin._republish()
                code = (
                    grpc.StatusCode.NOT_FOUND
                    if isinstance(exc, UnknownDevices)
                    else grpc.StatusCode.FAILED_PRECONDITION
                )
                context.abort(code, str(exc))
            out.append(allocation_to_pb(alloc))
            log.info(
                "allocate",
                extra=kv(
                    decision="allocate",
                    resource=plugin.resource,
                    ids=",".join(ids),
                    took_ms=round((time.perf_counter() - start) * 1000, 2),
                ),
            )
        return api_pb2.AllocateResponse(container_responses=out)

    def PreStartContainer(  # noqa: N802 (gRPC method name)
        self, request: api_pb2.PreStartContainerRequest, context: grpc.ServicerContext
    ) -> api_pb2.PreStartContainerResponse:
        # pre_start_required is false: kubelet never calls this; answer politely if someone does.
        return api_pb2.PreStartContainerResponse()
