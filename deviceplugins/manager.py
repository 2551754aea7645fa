"""Run every device plugin of the node in one process, each with its own restart loop.

Threads (all named ``gpushare-dp-<job>``, all joined by ``stop``):

- one per plugin (``gpushare-dp-share-gpu-4``, ``gpushare-dp-spot-gpu``, ...): the restart
  loop. A run is serve → dial our own socket → Register; then wait until a restart is
  requested or the manager stops. A failed run is retried with back-off (0.1 s doubling to
  ``retry_max_s``), and is retried at once when kubelet.sock appears.
- ``gpushare-dp-watch``: detects a kubelet restart from the truth, not from one event
  (a plugin that trusts one inotify event can sit registered with 0 devices): every
  ``check_interval_s``, and at once on any inotify event in the directory, it compares
  kubelet.sock's identity (inode, ctime) with the one each plugin registered against, and
  checks that each plugin's own socket is still its own. Either change restarts that
  plugin, which re-serves and re-registers.
- kubelet ending a plugin's ListAndWatch (the last stream of a run) restarts that plugin
  too: kubelet has dropped it and will not come back unless we register again.
- ``gpushare-dp-vendor-<resource>``: spot's clients of the vendor plugins (``vendor.py``).

One ``threading.Event`` stops everything; only the CLI installs signal handlers.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from deviceplugins import policies
from deviceplugins._dirwatch import DirWatch
from deviceplugins.errors import DevicePluginError, SocketReplaced
from deviceplugins.plugins import SharePlugin, SpotPlugin
from deviceplugins.policies import AdvertisedDevice, ShadowSlots
from deviceplugins.server import KUBELET_SOCKET_NAME, DevicePluginServer, socket_identity
from deviceplugins.vendor import VendorWatch
from gpushare import keys
from gpushare.config import Config
from gpushare.log import kv

log = logging.getLogger(__name__)

_RETRY_MIN_S = 0.1


class _Runner:
    """The restart loop of one plugin.

    ``wake`` ends a registered run (restart or stop); ``kick`` only cuts a back-off short.
    A restart request carries the run number it was made for, so a check that raced with
    the start of a new run cannot restart that new run for the old run's reason.
    """

    def __init__(self, plugin: DevicePluginServer, mgr: PluginManager) -> None:
        self.plugin = plugin
        self.mgr = mgr
        self.wake = threading.Event()
        self.kick = threading.Event()
        self.lock = threading.Lock()
        self.run_no = 0
        self.reason = "start"
        self.registered = False
        self.backing_off = False
        self.kubelet_identity: tuple[int, int, int] | None = None
        self.attempt_identity: tuple[int, int, int] | None = None
        self.registrations = 0
        self.last_error = ""
        self.thread = threading.Thread(target=self._loop, name=f"gpushare-dp-{plugin.job}")
        # The server only reports ends of its current run's streams.
        plugin.on_stream_end = lambda: self.restart("kubelet ended ListAndWatch")

    def restart(self, reason: str, run_no: int | None = None) -> None:
        with self.lock:
            if run_no is not None and run_no != self.run_no:
                return
            self.reason = reason
            self.wake.set()
            self.kick.set()

    def stop(self) -> None:
        self.wake.set()
        self.kick.set()

    def _back_off(self, delay: float) -> float:
        self._safe_stop_serving()
        if socket_identity(self.mgr.kubelet_socket) != self.attempt_identity:
            return delay  # kubelet.sock changed during the attempt: try the new kubelet at once
        self.backing_off = True
        self.kick.wait(delay)
        self.backing_off = False
        return min(delay * 2, self.mgr.retry_max_s)

    def _loop(self) -> None:
        mgr = self.mgr
        delay = _RETRY_MIN_S
        replaced = False
        while not mgr.stop_event.is_set():
            with self.lock:
                self.run_no += 1
                self.registered = False
                self.wake.clear()
                self.kick.clear()
            identity = socket_identity(mgr.kubelet_socket)
            if identity != self.attempt_identity:
                delay = _RETRY_MIN_S  # a new kubelet starts with a fresh back-off
            self.attempt_identity = identity
            try:
                self.plugin.serve()
                self.plugin.register(mgr.kubelet_socket, mgr.register_timeout_s)
            except SocketReplaced as exc:
                # Not a failure: kubelet is starting and wiped the directory under us. Serve
                # again at once (once; a second time in a row backs off like any failure).
                log.info("socket replaced during Register", extra=kv(resource=self.plugin.resource, error=str(exc)))
                if not replaced:
                    replaced = True
                    self._safe_stop_serving()
                    continue
                delay = self._back_off(delay)
                continue
            except DevicePluginError as exc:
                if str(exc) != self.last_error:  # one line per new problem, not per retry
                    log.warning(
                        "plugin not registered; retrying", extra=kv(resource=self.plugin.resource, error=str(exc))
                    )
                self.last_error = str(exc)
                delay = self._back_off(delay)
                continue
            except Exception:  # top of a thread loop: log, clean up, back off
                log.exception("plugin run crashed; restarting", extra=kv(resource=self.plugin.resource))
                delay = self._back_off(delay)
                continue
            delay = _RETRY_MIN_S
            replaced = False
            self.last_error = ""
            with self.lock:
                # Read after Register: the kubelet.sock we reached is the one there now. (A kubelet
                # restart in between also ends our stream and wipes our socket, so it is not missed.)
                self.kubelet_identity = socket_identity(mgr.kubelet_socket)
                self.registered = True
                self.registrations += 1
            log.info(
                "registered with kubelet",
                extra=kv(
                    decision="register",
                    resource=self.plugin.resource,
                    endpoint=self.plugin.endpoint,
                    reason=self.reason,
                    devices=len(self.plugin.devices()),
                ),
            )
            mgr._registered_cond_notify()
            self.wake.wait()
            with self.lock:
                self.registered = False
            if not mgr.stop_event.is_set():
                log.info("restarting plugin", extra=kv(resource=self.plugin.resource, reason=self.reason))
        self._safe_stop_serving()

    def _safe_stop_serving(self) -> None:
        try:
            self.plugin.stop_serving()
        except DevicePluginError as exc:
            log.warning("stopping plugin", extra=kv(resource=self.plugin.resource, error=str(exc)))


class PluginManager:
    """Every device plugin of the node in one process (design §2).

    Build it with ``for_gpushare`` / ``from_config`` (share, share-dev and spot) or with any
    list of ``DevicePluginServer``; ``start`` returns at once; ``stop`` ends every thread.
    The public setters may be called from any thread at any time, before or after start.
    """

    def __init__(
        self,
        plugins: Sequence[DevicePluginServer],
        plugin_dir: str,
        *,
        spot_sources: Mapping[str, str] | None = None,
        stop: threading.Event | None = None,
        register_timeout_s: float = 10.0,
        check_interval_s: float = 0.5,
        retry_max_s: float = 5.0,
        vendor_resync_s: float = 300.0,
    ) -> None:
        names = [p.resource for p in plugins]
        if len(set(names)) != len(names):
            raise DevicePluginError(f"gpushare: a resource is served twice: {names}")
        self.plugin_dir = plugin_dir
        self.kubelet_socket = os.path.join(plugin_dir, KUBELET_SOCKET_NAME)
        self.stop_event = stop if stop is not None else threading.Event()
        self.register_timeout_s = register_timeout_s
        self.check_interval_s = check_interval_s
        self.retry_max_s = retry_max_s
        self._plugins = {p.resource: p for p in plugins}
        self._runners = [_Runner(p, self) for p in plugins]
        self._lock = threading.Lock()
        self._shadows: tuple[ShadowSlots, ...] = ()
        self._registered_cond = threading.Condition()
        self._wake_r, self._wake_w = -1, -1
        self._watch_thread: threading.Thread | None = None
        self._started = False
        spot = self._plugins.get(keys.RESOURCE_SPOT_GPU)
        self._spot = spot if isinstance(spot, SpotPlugin) else None
        self._vendors: list[VendorWatch] = []
        for resource, socket_path in sorted((spot_sources or {}).items()):
            if self._spot is None:
                raise DevicePluginError("gpushare: spot sources were given but no spot-gpu plugin is served")
            self._vendors.append(
                VendorWatch(
                    resource, socket_path, self._spot.set_real_devices, self.stop_event, resync_s=vendor_resync_s
                )
            )

    # --- construction -------------------------------------------------------------------

    @classmethod
    def for_gpushare(
        cls,
        plugin_dir: str,
        *,
        share_specs: Iterable[int] = (2, 3, 4, 5),
        dev_share_specs: Iterable[int] = (2, 4, 8, 16),
        spot: bool = True,
        spot_sources: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> PluginManager:
        """share-gpu-N for each share spec, share-dev-gpu-N for each dev spec, and spot-gpu."""
        plugins: list[DevicePluginServer] = [SharePlugin(keys.KIND_SHARE, n, plugin_dir) for n in share_specs]
        plugins += [SharePlugin(keys.KIND_SHARE_DEV, n, plugin_dir) for n in dev_share_specs]
        if spot:
            plugins.append(SpotPlugin(plugin_dir))
        return cls(plugins, plugin_dir, spot_sources=spot_sources, **kwargs)

    @classmethod
    def from_config(cls, cfg: Config, *, spot_sources: Mapping[str, str] | None = None, **kwargs: Any) -> PluginManager:
        return cls.for_gpushare(
            cfg.kubelet.device_plugin_dir,
            share_specs=cfg.share_specs,
            dev_share_specs=cfg.dev_share_specs,
            spot_sources=spot_sources,
            **kwargs,
        )

    # --- public setters -----------------------------------------------------------------

    @property
    def resources(self) -> list[str]:
        return sorted(self._plugins)

    def plugin(self, resource: str) -> DevicePluginServer:
        try:
            return self._plugins[resource]
        except KeyError:
            raise DevicePluginError(
                f"gpushare: {resource!r} is not served by this manager (serving: {', '.join(self.resources)})"
            ) from None

    def set_devices(self, resource: str, devices: Iterable[AdvertisedDevice]) -> None:
        """Replace one resource's whole device list; ListAndWatch pushes it at once."""
        self.plugin(resource).set_devices(devices)

    def set_shadows(self, shadows: Iterable[ShadowSlots]) -> None:
        """The running shadow pods of this node (the whole set); every share list is recomputed.

        Refuses the whole set with ``InvalidShadow`` (nothing changes) if any shadow is bad.
        """
        new = tuple(shadows)
        share_plugins = [p for p in self._plugins.values() if isinstance(p, SharePlugin)]
        policies.check_shadows(new, served=[p.resource for p in share_plugins])
        with self._lock:
            self._shadows = new
            for p in share_plugins:
                p.set_devices(policies.share_devices(new, p.resource))

    def shadows(self) -> tuple[ShadowSlots, ...]:
        with self._lock:
            return self._shadows

    def _spot_plugin(self) -> SpotPlugin:
        if self._spot is None:
            raise DevicePluginError("gpushare: spot-gpu is not served by this manager")
        return self._spot

    def set_spot_health(self, real_id: str, healthy: bool) -> None:
        """``spot-<real_id>`` Healthy (owner away) or Unhealthy (owner busy/back); pushed at once."""
        self._spot_plugin().set_health(real_id, healthy)

    def set_spot_lent(self, real_ids: Iterable[str]) -> None:
        """Real IDs currently lent to spot pods: GetPreferredAllocation puts them last."""
        self._spot_plugin().set_lent(real_ids)

    def set_real_devices(self, real_resource: str, devices: Iterable[AdvertisedDevice]) -> None:
        """Feed spot's real devices directly (when no vendor socket is followed)."""
        self._spot_plugin().set_real_devices(real_resource, devices)

    def real_devices(self) -> dict[str, tuple[str, ...]]:
        """What spot learned from the vendor plugins: real resource -> real IDs."""
        return self._spot.real_devices() if self._spot is not None else {}

    def vendor_unhealthy(self) -> dict[str, str]:
        """Real ID -> why, for each device a followed vendor plugin lists Unhealthy."""
        return self._spot.vendor_unhealthy() if self._spot is not None else {}

    def status(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for r in self._runners:
            devs = r.plugin.devices()
            out[r.plugin.resource] = {
                "registered": r.registered,
                "registrations": r.registrations,
                "socket": r.plugin.socket_path,
                "devices": len(devs),
                "healthy": sum(d.healthy for d in devs),
                "error": r.last_error,
            }
        return out

    # --- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        if self._started:
            raise DevicePluginError("gpushare: PluginManager.start called twice")
        self._started = True
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        for v in self._vendors:
            v.start()
        for r in self._runners:
            r.thread.start()
        self._watch_thread = threading.Thread(target=self._watch_loop, name="gpushare-dp-watch")
        self._watch_thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Set the stop event, end every stream and server, remove our sockets, join every thread."""
        self.stop_event.set()
        if not self._started:
            return
        os.write(self._wake_w, b"x")
        for r in self._runners:
            r.stop()
        for v in self._vendors:
            v.join(timeout_s)
        for r in self._runners:
            r.thread.join(timeout_s)
        if self._watch_thread is not None:
            self._watch_thread.join(timeout_s)
        os.close(self._wake_r)
        os.close(self._wake_w)
        self._started = False

    def wait_registered(self, timeout_s: float) -> bool:
        """Block until every plugin is registered (tests, the CLI's readiness line)."""
        with self._registered_cond:
            return self._registered_cond.wait_for(lambda: all(r.registered for r in self._runners), timeout_s)

    def _registered_cond_notify(self) -> None:
        with self._registered_cond:
            self._registered_cond.notify_all()

    def _watch_loop(self) -> None:
        watch = DirWatch(self.plugin_dir)
        try:
            while not self.stop_event.is_set():
                fds = [self._wake_r] + ([watch.fileno()] if watch.fileno() >= 0 else [])
                with contextlib.suppress(InterruptedError):
                    select.select(fds, [], [], self.check_interval_s)
                watch.drain()
                if self.stop_event.is_set():
                    return
                try:
                    self._check(watch)
                except Exception:  # top of a thread loop: log and keep watching
                    log.exception("device-plugin watch check failed")
        finally:
            watch.close()

    def _check(self, watch: DirWatch) -> None:
        watch.rearm()
        kubelet = socket_identity(self.kubelet_socket)
        for r in self._runners:
            with r.lock:
                registered, run_no, registered_with = r.registered, r.run_no, r.kubelet_identity
            if registered:
                if kubelet is not None and kubelet != registered_with:
                    r.restart("kubelet.sock recreated (kubelet restarted)", run_no)
                elif not r.plugin.socket_is_ours():
                    r.restart("own socket removed", run_no)
            elif r.backing_off and kubelet is not None and kubelet != r.attempt_identity:
                r.reason = "kubelet.sock appeared"
                r.kick.set()
