"""``Stub``: owns the wire between a plugin object and containerd's NRI.

- Dials the runtime socket (external plugin) or adopts an inherited fd (pre-connected plugin,
  containerd 2.x ``plugin_path``: fd 3, ``NRI_PLUGIN_SOCKET=3``).
- Multiplexes it: conn 1 serves ``nri.pkg.api.v1alpha1.Plugin`` (we are the ttrpc server), conn 2
  calls ``nri.pkg.api.v1alpha1.Runtime`` (we are the client).
- Registers (name, two-digit index), answers Configure with the event mask derived from the
  plugin's methods (capped to the 11 v0.6.1 events, never a bit outside 0x7FF), collects
  Synchronize (also split sync), dispatches each event with the caller's deadline.
- ``run`` reconnects with exponential back-off when the socket closes (containerd restart); a
  pre-connected plugin cannot redial, so ``run`` returns when its socket closes.
- A partial ``connect`` never leaks: every step's resource is released if a later step fails.
  ``close`` is idempotent.

Plugin object methods (all optional, at least one event method required):
``configure(req)``, ``synchronize(pods, containers)``, ``shutdown()``, and per event
``run_pod_sandbox(pod)``, ``stop_pod_sandbox(pod)``, ``remove_pod_sandbox(pod)``,
``create_container(pod, container) -> ContainerAdjustment | None``, ``post_create_container``,
``start_container``, ``post_start_container``, ``update_container``, ``post_update_container``,
``stop_container``, ``remove_container`` (each ``(pod, container)``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from google.protobuf.message import DecodeError, Message

from gpushare.errors import InstructionRefused
from gpushare.log import kv
from nri_plugin._pb import nri_pb2
from nri_plugin.errors import (
    ConnectionClosed,
    DeadlineExceeded,
    NriError,
    ProtocolError,
    RpcStatusError,
    TransportError,
)
from nri_plugin.transport.mux import PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN, Mux
from nri_plugin.transport.ttrpc import Code, Handler, TtrpcClient, TtrpcServer

log = logging.getLogger(__name__)

PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"

# NRI v0.6.1 events: method name → Event enum value (bit value-1 of the mask).
EVENT_METHODS: dict[str, int] = {
    "run_pod_sandbox": nri_pb2.RUN_POD_SANDBOX,
    "stop_pod_sandbox": nri_pb2.STOP_POD_SANDBOX,
    "remove_pod_sandbox": nri_pb2.REMOVE_POD_SANDBOX,
    "create_container": nri_pb2.CREATE_CONTAINER,
    "post_create_container": nri_pb2.POST_CREATE_CONTAINER,
    "start_container": nri_pb2.START_CONTAINER,
    "post_start_container": nri_pb2.POST_START_CONTAINER,
    "update_container": nri_pb2.UPDATE_CONTAINER,
    "post_update_container": nri_pb2.POST_UPDATE_CONTAINER,
    "stop_container": nri_pb2.STOP_CONTAINER,
    "remove_container": nri_pb2.REMOVE_CONTAINER,
}
VALID_EVENTS_MASK = 0x7FF  # what every runtime from NRI v0.6.1 on accepts
_POD_EVENTS = {nri_pb2.RUN_POD_SANDBOX, nri_pb2.STOP_POD_SANDBOX, nri_pb2.REMOVE_POD_SANDBOX}
_EVENT_NAMES = {v: k for k, v in EVENT_METHODS.items()}

ENV_PLUGIN_SOCKET = "NRI_PLUGIN_SOCKET"
ENV_PLUGIN_NAME = "NRI_PLUGIN_NAME"
ENV_PLUGIN_IDX = "NRI_PLUGIN_IDX"
_HANDSHAKE_POLL_S = 0.05  # how soon a connection closed during the handshake is noticed


def derive_mask(plugin: object) -> int:
    """The subscription mask: one bit per event method the plugin has, never outside 0x7FF."""
    mask = 0
    for name, event in EVENT_METHODS.items():
        if callable(getattr(plugin, name, None)):
            mask |= 1 << (event - 1)
    mask &= VALID_EVENTS_MASK
    if mask == 0:
        # 0 would mean "all events" to the runtime; a plugin that handles nothing is a bug.
        raise NriError(f"gpushare: plugin {type(plugin).__name__} handles no NRI event; nothing to subscribe to")
    return mask


def _parse(cls: type[Any], payload: bytes) -> Any:
    msg = cls()
    try:
        msg.ParseFromString(payload)
    except (DecodeError, ValueError, RecursionError) as exc:
        raise RpcStatusError(Code.INVALID_ARGUMENT, f"undecodable {cls.__name__}: {exc}") from exc
    return msg


def _refusal_as_status(handler: Handler) -> Handler:
    """A refused instruction becomes FAILED_PRECONDITION here, so the transport sees only
    status codes: containerd then fails just that container and the plugin stays connected."""

    def handle(payload: bytes) -> bytes:
        try:
            return handler(payload)
        except InstructionRefused as exc:
            raise RpcStatusError(Code.FAILED_PRECONDITION, str(exc)) from exc

    return handle


class _Session:
    """One live connection: mux + ttrpc server (conn 1) + ttrpc client (conn 2)."""

    def __init__(self, sock: socket.socket, handlers: dict[tuple[str, str], Handler], timeout_s: float) -> None:
        self.closed = threading.Event()
        self.reason: TransportError | None = None
        self.mux = Mux(sock, send_timeout_s=timeout_s)
        try:
            self.server = TtrpcServer(lambda b: self.mux.send(PLUGIN_SERVICE_CONN, b), handlers)
        except BaseException:
            self.mux.close()
            raise
        self.client = TtrpcClient(lambda b: self.mux.send(RUNTIME_SERVICE_CONN, b))
        self.mux.attach(PLUGIN_SERVICE_CONN, self.server.feed)
        self.mux.attach(RUNTIME_SERVICE_CONN, self.client.feed)

    def start(self) -> None:
        self.mux.start(on_close=self._on_close)

    def _on_close(self, reason: TransportError) -> None:
        self.reason = reason
        self.client.fail_all(reason)
        self.closed.set()

    def close(self) -> None:
        self.mux.close()
        self.server.close()


class Stub:
    """Connects a plugin object to the runtime. See the module docstring."""

    def __init__(
        self,
        plugin: object,
        *,
        socket_path: str | None = None,
        fd: int | None = None,
        name: str = "gpushare",
        index: str = "10",
        timeout_s: float = 5.0,
        backoff_initial_s: float = 0.1,
        backoff_max_s: float = 5.0,
        dialer: Callable[[], socket.socket] | None = None,
        on_connect: Callable[[], None] | None = None,
    ) -> None:
        if (socket_path is None) == (fd is None) and dialer is None:
            raise NriError("gpushare: give the Stub exactly one of socket_path or fd")
        if len(index) != 2 or not index.isdigit():
            raise NriError(f"gpushare: plugin index {index!r} must be two digits, e.g. '10'")
        if not name:
            raise NriError("gpushare: plugin name must not be empty")
        self.plugin = plugin
        self.mask = derive_mask(plugin)
        self.name = name
        self.index = index
        self.socket_path = socket_path
        self._fd = fd
        self._fd_adopted = False
        self._dialer = dialer
        self._timeout_s = timeout_s
        self._backoff_initial_s = backoff_initial_s
        self._backoff_max_s = backoff_max_s
        self._on_connect = on_connect
        self._lock = threading.Lock()
        self._session: _Session | None = None
        self._configured = threading.Event()
        self._synced = threading.Event()
        self._sync_pods: list[Any] = []
        self._sync_containers: list[Any] = []
        self._sync_pieces = 0
        self._sync_bytes = 0
        self._closed = False
        self.connections = 0  # successful handshakes so far (tests, logs)

    @classmethod
    def from_environment(cls, plugin: object, **kwargs: Any) -> Stub:
        """Pre-connected mode: containerd passed the socket as the fd in NRI_PLUGIN_SOCKET (3)."""
        fd_text = os.environ.get(ENV_PLUGIN_SOCKET, "")
        if not fd_text.isdigit():
            raise NriError(f"gpushare: {ENV_PLUGIN_SOCKET} is {fd_text!r}; expected the inherited socket fd (3)")
        kwargs.setdefault("name", os.environ.get(ENV_PLUGIN_NAME) or "gpushare")
        kwargs.setdefault("index", os.environ.get(ENV_PLUGIN_IDX) or "10")
        return cls(plugin, fd=int(fd_text), **kwargs)

    @property
    def preconnected(self) -> bool:
        return self._fd is not None

    # --- handlers (run on the ttrpc handler pool) ---

    def _handlers(self) -> dict[tuple[str, str], Handler]:
        h: dict[str, Handler] = {
            "Configure": self._configure,
            "Synchronize": self._synchronize,
            "Shutdown": self._shutdown,
            "CreateContainer": self._create_container,
            "UpdateContainer": self._update_container,
            "StopContainer": self._stop_container,
            "StateChange": self._state_change,
        }
        # NRI v0.12 dedicated per-event RPCs. Answering them (rather than UNIMPLEMENTED) spares
        # containerd 2.3+ its StateChange fallback and the deprecation warning it logs.
        for name, event in EVENT_METHODS.items():
            rpc = "".join(part.capitalize() for part in name.split("_"))
            if rpc not in h:
                h[rpc] = self._dedicated_handler(name, event in _POD_EVENTS)
        return {(PLUGIN_SERVICE, m): _refusal_as_status(f) for m, f in h.items()}

    def _dedicated_handler(self, name: str, is_pod_event: bool) -> Handler:
        def handle(payload: bytes) -> bytes:
            if is_pod_event:
                req = _parse(nri_pb2.RemovePodSandboxRequest, payload)
                self._call_event(name, req.pod)
            else:
                creq = _parse(nri_pb2.RemoveContainerRequest, payload)
                self._call_event(name, creq.pod, creq.container)
            return b""

        return handle

    def _configure(self, payload: bytes) -> bytes:
        req = _parse(nri_pb2.ConfigureRequest, payload)
        log.debug("nri: configure", extra=kv(runtime=req.runtime_name, version=req.runtime_version))
        fn = getattr(self.plugin, "configure", None)
        if callable(fn):
            fn(req)
        self._configured.set()
        return nri_pb2.ConfigureResponse(events=self.mask).SerializeToString()

    def _synchronize(self, payload: bytes) -> bytes:
        req = _parse(nri_pb2.SynchronizeRequest, payload)
        self._sync_pieces += 1
        self._sync_bytes += len(payload)
        self._sync_pods.extend(req.pods)
        self._sync_containers.extend(req.containers)
        if req.more:
            # Split sync (NRI v0.8+): every chunk but the last is answered more=true, no updates.
            return nri_pb2.SynchronizeResponse(more=True).SerializeToString()
        pods, containers = self._sync_pods, self._sync_containers
        self._sync_pods, self._sync_containers = [], []
        fn = getattr(self.plugin, "synchronize", None)
        if callable(fn):
            fn(pods, containers)
        self._synced.set()
        return nri_pb2.SynchronizeResponse().SerializeToString()

    def _shutdown(self, payload: bytes) -> bytes:
        fn = getattr(self.plugin, "shutdown", None)
        if callable(fn):
            fn()
        return b""

    def _create_container(self, payload: bytes) -> bytes:
        req = _parse(nri_pb2.CreateContainerRequest, payload)
        fn = getattr(self.plugin, "create_container", None)
        resp = nri_pb2.CreateContainerResponse()
        if callable(fn):
            adj = fn(req.pod, req.container)
            if adj is not None:
                resp.adjust.CopyFrom(adj)
        return resp.SerializeToString()

    def _update_container(self, payload: bytes) -> bytes:
        req = _parse(nri_pb2.UpdateContainerRequest, payload)
        self._call_event("update_container", req.pod, req.container)
        return nri_pb2.UpdateContainerResponse().SerializeToString()

    def _stop_container(self, payload: bytes) -> bytes:
        req = _parse(nri_pb2.StopContainerRequest, payload)
        self._call_event("stop_container", req.pod, req.container)
        return nri_pb2.StopContainerResponse().SerializeToString()

    def _state_change(self, payload: bytes) -> bytes:
        ev = _parse(nri_pb2.StateChangeEvent, payload)
        name = _EVENT_NAMES.get(ev.event)
        if name is None:
            raise RpcStatusError(Code.INVALID_ARGUMENT, f"StateChange with unknown event {ev.event}")
        if ev.event in _POD_EVENTS:
            self._call_event(name, ev.pod)
        else:
            self._call_event(name, ev.pod, ev.container)
        return b""

    def _call_event(self, name: str, *args: Message) -> None:
        fn = getattr(self.plugin, name, None)
        if callable(fn):
            fn(*args)

    # --- connection lifecycle ---

    def _open_socket(self) -> socket.socket:
        if self._dialer is not None:
            return self._dialer()
        if self._fd is not None:
            if self._fd_adopted:
                raise ConnectionClosed("gpushare: the inherited NRI socket was already used and closed")
            try:
                sock = socket.socket(fileno=self._fd)
                self._fd_adopted = True  # the socket object owns the fd from now on
                return sock
            except OSError as exc:
                raise ConnectionClosed(f"gpushare: inherited NRI socket fd {self._fd} is unusable: {exc}") from exc
        assert self.socket_path is not None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self._timeout_s)
        try:
            sock.connect(self.socket_path)
        except OSError as exc:
            sock.close()
            raise ConnectionClosed(
                f"gpushare: cannot connect to the NRI socket {self.socket_path}: {exc.strerror or exc}; is containerd "
                "running with NRI enabled (disable = false) and this socket_path?"
            ) from exc
        return sock

    def connect(self) -> None:
        """One full handshake: socket, RegisterPlugin, Configure, Synchronize. Raises on failure
        and leaves nothing behind."""
        with self._lock:
            if self._closed:
                raise ConnectionClosed("gpushare: stub is closed")
            if self._session is not None:
                raise NriError("gpushare: stub is already connected")
        sock = self._open_socket()
        try:
            session = _Session(sock, self._handlers(), self._timeout_s)
        except BaseException:
            sock.close()
            raise
        self._configured.clear()
        self._synced.clear()
        self._sync_pods, self._sync_containers = [], []
        self._sync_pieces = self._sync_bytes = 0
        try:
            session.start()
            req = nri_pb2.RegisterPluginRequest(plugin_name=self.name, plugin_idx=self.index)
            session.client.call(RUNTIME_SERVICE, "RegisterPlugin", req.SerializeToString(), self._timeout_s)
            self._wait_synced(session)
        except BaseException:
            session.close()
            raise
        with self._lock:
            if self._closed:
                session.close()
                raise ConnectionClosed("gpushare: stub was closed during the handshake")
            self._session = session
        self.connections += 1
        log.info(
            "nri: connected",
            extra=kv(
                socket=self.socket_path or f"fd:{self._fd}",
                name=self.name,
                index=self.index,
                events=hex(self.mask),
                sync_messages=self._sync_pieces,
                sync_bytes=self._sync_bytes,
            ),
        )
        if self._on_connect is not None:
            self._on_connect()

    def _wait_synced(self, session: _Session) -> None:
        """Until the last Synchronize piece is answered; a connection closed meanwhile fails at once."""
        deadline = time.monotonic() + self._timeout_s
        while not self._synced.wait(_HANDSHAKE_POLL_S):
            if session.closed.is_set():
                break
            if time.monotonic() > deadline:
                raise DeadlineExceeded(
                    f"gpushare: containerd did not Configure and Synchronize within {self._timeout_s:.1f}s"
                )
        if self._synced.is_set() or not session.closed.is_set():
            # Synchronized: the handshake is done, even if the runtime closed the connection right
            # after (the serve loop then sees it closed, as any later close).
            return
        reason = session.reason or ConnectionClosed("gpushare: NRI connection closed during handshake")
        if self._configured.is_set() and not self._synced.is_set() and not isinstance(reason, ProtocolError):
            # containerd closes a plugin it cannot synchronize and logs why only on its side; 2.x
            # does so when it cannot cut its state into pieces under ttrpc's 4 MiB.
            raise ConnectionClosed(
                f"gpushare: containerd closed the connection after Configure, before Synchronize completed "
                f"({reason}); containerd's log says why after 'failed to synchronize plugin' (docs/nri.md)"
            ) from reason
        raise reason

    def wait_closed(self, timeout_s: float | None = None) -> bool:
        """Block until the current connection closes; True if it did."""
        session = self._session
        return True if session is None else session.closed.wait(timeout_s)

    def disconnect(self) -> None:
        """Tear down the current connection (if any); the stub can connect again."""
        with self._lock:
            session, self._session = self._session, None
        if session is not None:
            session.close()

    def run(self, stop: threading.Event) -> None:
        """Connect, serve, and reconnect with back-off until ``stop`` is set.

        A pre-connected plugin returns as soon as its socket closes (containerd will start it
        again with a fresh socket when it restarts)."""
        delay = self._backoff_initial_s
        failures = 0
        while not stop.is_set() and not self._closed:
            try:
                self.connect()
            except TransportError as exc:
                if self.preconnected:
                    log.error("nri: pre-connected handshake failed: %s", exc)
                    return
                # Rate-limited: the first failure, then about once a minute at the 5 s cap.
                level = logging.WARNING if failures % 12 == 0 else logging.DEBUG
                log.log(level, "nri: connect failed (%d in a row): %s; retrying in %.1fs", failures + 1, exc, delay)
                failures += 1
                stop.wait(delay)
                delay = min(delay * 2, self._backoff_max_s)
                continue
            delay = self._backoff_initial_s
            failures = 0
            while not stop.is_set() and not self.wait_closed(0.2):
                pass
            session = self._session
            reason = session.reason if session is not None else None
            self.disconnect()
            if stop.is_set() or self._closed:
                break
            if self.preconnected:
                log.warning("nri: pre-connected socket closed (%s); exiting", reason)
                return
            log.warning("nri: disconnected (%s); reconnecting in %.1fs", reason, delay)
            stop.wait(delay)

    def close(self) -> None:
        """Idempotent: disconnect and refuse further connects."""
        with self._lock:
            self._closed = True
        self.disconnect()
        if self._fd is not None and not self._fd_adopted:
            self._fd_adopted = True
            with contextlib.suppress(OSError):
                os.close(self._fd)
