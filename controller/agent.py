"""The node agent: the reconcile loop, the device plugins, the NRI plugin and the HTTP endpoint in one process.

One ``threading.Event`` stops everything; only the CLI installs signal
handlers and sets it. Start order follows what each part needs from the one before:

1. the device plugins (kubelet must see share-gpu-N before any sharer can be placed);
2. the NRI plugin with a PodResources-backed oracle (it must be connected before a shadow's
   ``main`` container is created, since it learns the shadow's devices there; on a reconnect
   containerd's Synchronize replays existing containers);
3. the reconcile loop (watches, Lease, passes);
4. the endpoint (``/metrics``, ``/healthz``; ``/status`` on loopback; docs/security.md).

Shutdown runs in reverse; each join is bounded.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Mapping
from typing import Any, Protocol

from controller.applier import DevicePlugins
from controller.http_endpoint import Endpoint
from controller.io.access_reviews import AccessReviewer, ReviewClient
from controller.io.dra_devices import DraDevices
from controller.io.kube_client import KubeClient
from controller.io.lease import LeaseElector
from controller.io.pod_rules import CachedPodRules
from controller.io.podresources import PodResourcesClient
from controller.io.shadow_devices import ShadowDevices
from controller.io.state import StateStore
from controller.io.vendor_allocate import KubeletHolders, VendorAllocateResolver
from controller.loop import ReconcileLoop
from controller.metrics.exposition import AgentMetrics
from controller.spot.lend_state import AgentLendState
from controller.spot.runtime import SpotRuntime
from controller.spot.solver import GpuSpot
from deviceplugins import DevicePluginError, PluginManager
from draplugin.plugin import DraPlugin, api_client, settings_from_config
from gpumetrics.model import DeviceMetrics
from gpushare import keys
from gpushare.config import METRICS_ACCESS_RBAC, Config
from gpushare.log import kv
from nri_plugin import Injector, Stub
from nri_plugin.gpu_parts import NodeGpuParts

log = logging.getLogger(__name__)


class NodeDevices(DevicePlugins, Protocol):
    """The node's devices as the agent starts and stops them."""

    def start(self) -> None: ...
    def stop(self) -> None: ...


class Agent:
    """Build with the config, ``start()``, then ``stop.set()`` and ``close()`` (or ``run()`` for both)."""

    def __init__(
        self,
        cfg: Config,
        *,
        kubeconfig: str | None = None,
        spot_sources: Mapping[str, str] | None = None,
        spot_runtime: SpotRuntime | None = None,
        period_s: float = 2.0,
        use_lease: bool = True,
        stop: threading.Event | None = None,
    ) -> None:
        if cfg.dra.enabled:
            # On a DRA node an owner holds a whole GPU of the driver's class (controller/io/dra_devices.py).
            cfg = dataclasses.replace(cfg, real_resources=(*cfg.real_resources, keys.RESOURCE_DRA_GPU))
        self.cfg = cfg
        self.stop = stop if stop is not None else threading.Event()
        self.started_at = time.time()
        # Short watches: a stopping agent waits at most this long for its watch threads.
        self.client = KubeClient.from_kubeconfig(kubeconfig, timeout_s=10.0, watch_timeout_s=10)
        # Refuse an unusable state file at start (StateError names it); the loop thread reopens it.
        StateStore(cfg.state_dir).close()
        # spot-gpu learns the vendors' GPUs and their health from kubelet each pass (the loop's
        # _learn_real_devices), never from a ListAndWatch of its own on a vendor socket, which
        # NVIDIA's plugin would let take a health change from kubelet (docs/nvidia.md).
        # ``spot_sources`` only names the socket the NRI plugin asks Allocate on.
        # A DRA node serves its devices through gpushare's DRA driver, in this process, and never
        # through device plugins: one node is in one mode (docs/dra.md).
        self.dra = (
            DraDevices(DraPlugin(settings_from_config(cfg), api_client(kubeconfig)), self.stop)
            if cfg.dra.enabled
            else None
        )
        self.plugins: NodeDevices = self.dra if self.dra is not None else PluginManager.from_config(cfg, stop=self.stop)
        self.podresources = PodResourcesClient(cfg.kubelet.pod_resources_socket)
        self.shadow_devices = ShadowDevices()
        self.injector = self._injector(cfg, spot_sources)
        self.stub = Stub(
            self.injector, socket_path=cfg.nri.socket, name=cfg.nri.plugin_name, index=cfg.nri.plugin_index
        )
        elector = LeaseElector(self.client, holder=cfg.node_name) if use_lease else None
        # Spot: the runtime's threads wake the loop on a kernel notice or an idle-state change.
        self.spot_runtime = spot_runtime
        self.loop = ReconcileLoop(
            cfg,
            client=self.client,
            plugins=self.plugins,
            podresources=self.podresources,
            state_dir=cfg.state_dir,
            elector=elector,
            spot=spot_runtime.hooks() if spot_runtime is not None else None,
            period_s=period_s,
            shadow_devices=self.shadow_devices,
        )
        self.metrics = AgentMetrics(
            self.loop.last_report,
            nri_connected=self.nri_connected,
            collectors=[spot_runtime.counters] if spot_runtime is not None else [],
            node=cfg.node_name,
            vendor=cfg.metrics.vendor,
            devices=self._scraped_devices,
        )
        # The endpoint's reviews go through a client of their own: its clients can never take a
        # connection of the loop's pool.
        self.reviews = ReviewClient.for_endpoint(kubeconfig) if cfg.metrics.access == METRICS_ACCESS_RBAC else None
        self.endpoint = Endpoint(
            cfg.metrics.listen,
            report=self.loop.last_report,
            status=self.status,
            metrics=self.metrics.render,
            max_age_s=max(30.0, 10 * period_s),
            access=cfg.metrics.access,
            authorize=AccessReviewer(self.reviews).verdict if self.reviews is not None else None,
            max_connections=cfg.metrics.max_connections,
            tls=cfg.metrics.tls,
        )
        if spot_runtime is not None:
            spot_runtime.wake_target = self.loop.wake
            # A kernel notice closes the owner's spot devices itself, before the pass it wakes.
            spot_runtime.spot_health_target = self.plugins.set_spot_health
        self._nri_thread = threading.Thread(target=self.stub.run, args=(self.stop,), name="gpushare-nri-run")

    def _on_nri_decision(self, kind: str, *details: Any) -> None:
        """The injector's callback (kind, pod, container, decision, took_ms): only the latency is kept."""
        self.metrics.observe_nri_decision(kind, float(details[-1]) / 1000.0)

    def _on_nri_refusal(self, reason: str) -> None:
        self.metrics.count_nri_refusal(reason)

    def _shadow_created(self, shadow: str, uid: str) -> None:
        """A shadow's main container is in the NRI plugin's cache: pass now, so its slots are offered."""
        self.shadow_devices.note_created(shadow, uid)
        self._wake_loop()

    def _shadow_started(self, shadow: str, container_id: str, pid: int, uid: str) -> None:
        """A shadow's main container started: read its devices (a GPU-less one closes its slots)."""
        self.shadow_devices.note(shadow, container_id, pid, uid)
        self._wake_loop()

    def _wake_loop(self) -> None:
        loop = getattr(self, "loop", None)  # the NRI plugin is made before the loop
        if loop is not None:
            loop.wake()

    def _scraped_devices(self) -> tuple[DeviceMetrics, ...]:
        watcher = self.spot_runtime.watcher if self.spot_runtime is not None else None
        return watcher.last_devices() if watcher is not None else ()

    def _injector(self, cfg: Config, spot_sources: Mapping[str, str] | None) -> Injector:
        """The NRI plugin: for a spot borrower, the vendor's own Allocate answer for the lent GPU, else
        kubelet's holder of it, and only while the lend is active (design §8; docs/nri.md)."""
        gpu_parts = NodeGpuParts.from_config(cfg)
        resolver = VendorAllocateResolver(
            cfg.kubelet.device_plugin_dir,
            visibility_env=cfg.visibility_env,
            cdi_registry=lambda: gpu_parts.registry,
            sockets=spot_sources,
        )
        return Injector(
            cfg,
            gpu_parts=gpu_parts,
            oracle=self.podresources,
            resolver=resolver,
            holders=KubeletHolders(self.podresources),
            lend_state=AgentLendState(self._spot_gpus, self._spot_healthy, self._spot_reclaimed),
            pod_rules=CachedPodRules(self._node_pod, cfg.real_resources),
            on_decision=self._on_nri_decision,
            on_refusal=self._on_nri_refusal,
            on_shadow_started=self._shadow_started,
            on_shadow_created=self._shadow_created,
        )

    def _node_pod(self, key: str) -> Mapping[str, Any] | None:
        # The loop is built after the injector; CreateContainer comes only once both run.
        return self.loop.node_pod(key)

    def _spot_gpus(self) -> tuple[GpuSpot, ...] | None:
        report = self.loop.last_report()
        return report.spot if report.passes else None

    def _spot_healthy(self, device_id: str) -> bool:
        if self.dra is not None:
            return self.dra.spot_healthy(device_id)
        assert isinstance(self.plugins, PluginManager)
        try:
            device = self.plugins.plugin(keys.RESOURCE_SPOT_GPU).advertised().get(device_id)
        except DevicePluginError:  # spot-gpu not served: nothing is lent
            return False
        return device is not None and device.healthy

    def _spot_reclaimed(self, pod_uid: str) -> bool:
        return self.spot_runtime is not None and self.spot_runtime.was_reclaimed(pod_uid)

    def nri_connected(self) -> bool:
        return self.stub.connections > 0 and not self.stub.wait_closed(0)

    def start(self) -> None:
        self.plugins.start()
        self._nri_thread.start()
        if self.spot_runtime is not None:
            self.spot_runtime.start(self.stop)  # gpukmod Register before the first pass plans a watch
        self.loop.start(self.stop)
        self.endpoint.start()
        log.info(
            "agent started",
            extra=kv(
                node=self.cfg.node_name,
                plugin_dir=self.cfg.kubelet.device_plugin_dir,
                nri=self.cfg.nri.socket,
                pod_resources=self.cfg.kubelet.pod_resources_socket,
                endpoint=self.endpoint.address,
            ),
        )

    def close(self) -> None:
        """Stop everything, newest first; safe to call twice."""
        self.stop.set()
        self.endpoint.close()
        self.loop.join()
        if self.spot_runtime is not None:
            self.spot_runtime.close()
        self.stub.close()
        if self._nri_thread.ident is not None:  # started
            self._nri_thread.join(5.0)
        self.plugins.stop()
        self.podresources.close()
        if self.reviews is not None:
            self.reviews.close()
        self.client.close()
        log.info("agent stopped")

    def run(self) -> None:
        """Start, wait for ``stop``, close."""
        self.start()
        try:
            while not self.stop.wait(1.0):
                pass
        finally:
            self.close()

    def status(self) -> dict[str, Any]:
        """What ``gpushare status`` prints; built from immutable values only."""
        report = self.loop.last_report()
        return {
            "source": "agent",
            "node": self.cfg.node_name,
            "agent": {"started_at": self.started_at, "pid": os.getpid()},
            "nri": {
                "connected": self.nri_connected(),
                "connections": self.stub.connections,
                "socket": self.cfg.nri.socket,
            },
            **report.to_json(),
            **({"spot_runtime": self.spot_runtime.status()} if self.spot_runtime is not None else {}),
        }


__all__ = ["Agent"]
