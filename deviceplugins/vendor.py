"""A client of another device plugin's socket, as kubelet would dial it.

Spot learns the node's real device IDs from the vendor's own plugin (design §6): a
``VendorWatch`` thread keeps a ``ListAndWatch`` stream open on the vendor socket and hands
every full list upward. The stream is reopened every ``resync_s`` (a silent stream is not
trusted: it may have died without an error) and after any error, with back-off. While the vendor plugin is
unreachable its devices are reported Unhealthy, so nothing is lent on a GPU whose driver
side we cannot see (fail closed).

``read_plugin`` is the one-shot form for ``gpushare deviceplugins list``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from deviceplugins._pb import api_pb2, api_pb2_grpc
from deviceplugins.errors import SocketError
from deviceplugins.policies import HEALTHY, AdvertisedDevice
from deviceplugins.server import dial, job_name_for
from gpushare.log import kv

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PluginSnapshot:
    options: api_pb2.DevicePluginOptions
    devices: tuple[AdvertisedDevice, ...]


def _to_devices(msg: api_pb2.ListAndWatchResponse) -> tuple[AdvertisedDevice, ...]:
    return tuple(sorted(AdvertisedDevice(d.ID, d.health == HEALTHY) for d in msg.devices))


def read_plugin(socket_path: str, timeout_s: float = 5.0) -> PluginSnapshot:
    """Dial a plugin socket, read its options and its first (full) device list."""
    with dial(socket_path) as channel:
        stub = api_pb2_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]
        try:
            options = stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=timeout_s)
            stream = stub.ListAndWatch(api_pb2.Empty(), timeout=timeout_s)
            first = next(iter(stream))
            stream.cancel()
        except grpc.RpcError as exc:
            raise SocketError(socket_path, f"device plugin did not answer: {exc}") from exc
        except StopIteration as exc:
            raise SocketError(socket_path, "ListAndWatch ended without a device list") from exc
    return PluginSnapshot(options, _to_devices(first))


class VendorWatch:
    """Follows one vendor plugin's device list; ``on_devices(resource, devices)`` on every change."""

    def __init__(
        self,
        resource: str,
        socket_path: str,
        on_devices: Callable[[str, tuple[AdvertisedDevice, ...]], None],
        stop: threading.Event,
        *,
        resync_s: float = 300.0,
        retry_min_s: float = 0.1,
        retry_max_s: float = 5.0,
    ) -> None:
        self.resource = resource
        self.socket_path = socket_path
        self._on_devices = on_devices
        self._stop = stop
        self._resync_s = resync_s
        self._retry_min_s = retry_min_s
        self._retry_max_s = retry_max_s
        self._call_lock = threading.Lock()
        self._call: grpc.RpcContext | None = None
        self._last: tuple[AdvertisedDevice, ...] | None = None
        self._reachable = True  # log the loss and the return once each, not every retry
        self._thread = threading.Thread(target=self._run, name=f"gpushare-dp-vendor-{job_name_for(resource)}")

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        """Cancel the open stream (stop, or a forced resync); the loop reopens unless stopping."""
        with self._call_lock:
            call = self._call
        if call is not None:
            call.cancel()  # type: ignore[no-untyped-call]

    def join(self, timeout_s: float | None = None) -> None:
        self.wake()
        self._thread.join(timeout_s)

    def _emit(self, devices: tuple[AdvertisedDevice, ...]) -> None:
        if devices != self._last:
            self._last = devices
            self._on_devices(self.resource, devices)

    def _run(self) -> None:
        delay = self._retry_min_s
        while not self._stop.is_set():
            try:
                got_any = self._follow_once()
            except Exception:  # top of a thread loop: log, fail closed, retry
                log.exception("vendor watch crashed", extra=kv(resource=self.resource, socket=self.socket_path))
                got_any = False
            if self._stop.is_set():
                return
            if got_any:
                delay = self._retry_min_s
                continue  # a resync or a clean end: reopen at once
            if self._last:
                self._emit(tuple(AdvertisedDevice(d.id, False) for d in self._last))
            self._stop.wait(delay)
            delay = min(delay * 2, self._retry_max_s)

    def _follow_once(self) -> bool:
        """One stream; True if it delivered at least one list before ending."""
        got_any = False
        with dial(self.socket_path) as channel:
            stub = api_pb2_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]
            call = stub.ListAndWatch(api_pb2.Empty(), timeout=self._resync_s)
            with self._call_lock:
                self._call = call
            if self._stop.is_set():
                call.cancel()
            try:
                for msg in call:
                    if not self._reachable:
                        log.info("vendor device plugin reachable again", extra=kv(resource=self.resource))
                    self._reachable = got_any = True
                    self._emit(_to_devices(msg))
            except grpc.RpcError as exc:
                code = exc.code() if isinstance(exc, grpc.Call) else None
                if code not in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED):
                    if self._reachable:
                        log.warning(
                            "vendor device plugin unreachable; its GPUs are not lent",
                            extra=kv(resource=self.resource, socket=self.socket_path, code=getattr(code, "name", "?")),
                        )
                    self._reachable = False
                    return False
            finally:
                with self._call_lock:
                    self._call = None
        return got_any
