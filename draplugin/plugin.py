"""One DRA kubelet plugin process: inventory, node service, slice publisher, until stopped.

The GPUs come from the vendor's CDI specs (``cdi_spec_dirs``, the devices of ``vendor_kind``);
the specs are re-read when a file changes (a driver upgrade, a GPU added) and the pool is
re-published. Claims already prepared keep what they were given.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import kubernetes

from draplugin.driver import Driver
from draplugin.inventory import Gpu, gpus_from_cdi
from draplugin.node_service import NodeService
from draplugin.pool import DeviceInfo, PoolShape, PoolSpec, build_pool, devices_of, spot_device, spot_taints
from draplugin.publisher import SlicePublisher
from draplugin.state import PreparedClaims
from gpushare import keys
from gpushare.cdi import dirs_signature, read_spec_dirs
from gpushare.config import Config
from gpushare.log import kv

log = logging.getLogger(__name__)

DRIVER_NAME = keys.DOMAIN
_RESCAN_S = 5.0


@dataclass(frozen=True)
class PluginSettings:
    node: str
    vendor_kind: str  # the vendor's CDI kind, e.g. nvidia.com/gpu
    kubelet_root: Path = Path("/var/lib/kubelet")
    cdi_root: Path = Path("/var/run/cdi")  # where claim specs are written
    cdi_spec_dirs: tuple[str, ...] = ("/etc/cdi", "/var/run/cdi")
    shape: PoolShape = field(default_factory=PoolShape)
    driver: str = DRIVER_NAME
    resync_s: float = 30.0

    @property
    def plugin_dir(self) -> Path:
        return self.kubelet_root / "plugins" / self.driver

    @property
    def registry_dir(self) -> Path:
        return self.kubelet_root / "plugins_registry"


class Inventory:
    """The node's GPUs and devices, re-read when the vendor's CDI specs change."""

    def __init__(self, settings: PluginSettings) -> None:
        self._settings = settings
        self._lock = threading.Lock()
        self._signature: tuple[tuple[str, int, int], ...] | None = None
        self._gpus: list[Gpu] = []
        self._devices: dict[str, DeviceInfo] = {}
        self._lendable: frozenset[str] = frozenset()
        self._reclaiming: frozenset[str] = frozenset()

    def rescan(self) -> bool:
        """Re-read the specs if a file changed; True when the GPUs changed."""
        signature = dirs_signature(self._settings.cdi_spec_dirs)
        with self._lock:
            if signature == self._signature:
                return False
            self._signature = signature
        registry = read_spec_dirs(self._settings.cdi_spec_dirs)
        gpus = gpus_from_cdi(registry.devices, self._settings.vendor_kind)
        with self._lock:
            changed = gpus != self._gpus
            self._gpus = gpus
            self._devices = devices_of(gpus, self._settings.shape)
        if changed:
            log.info("gpus %s", kv(vendor=self._settings.vendor_kind, gpus=",".join(g.cdi_name for g in gpus)))
        return changed

    def devices(self) -> Mapping[str, DeviceInfo]:
        with self._lock:
            return self._devices

    def gpus(self) -> Sequence[Gpu]:
        with self._lock:
            return list(self._gpus)

    def set_lend(self, lendable: Iterable[str], reclaiming: Iterable[str]) -> bool:
        """Which GPUs' spot devices take borrowers now, and which are being taken back."""
        lend, back = frozenset(lendable), frozenset(reclaiming)
        with self._lock:
            changed = (lend, back) != (self._lendable, self._reclaiming)
            self._lendable, self._reclaiming = lend, back
        return changed

    def blocked(self) -> dict[str, str]:
        """Spot devices a claim may not be prepared on now, with why."""
        with self._lock:
            return {
                spot_device(g.name): f"the owner of {g.name} is using it; spot waits until it is idle again"
                for g in self._gpus
                if g.name not in self._lendable
            }

    def pool(self) -> PoolSpec:
        s = self._settings
        with self._lock:
            return build_pool(
                s.driver, s.node, self._gpus, s.shape, spot_taints(self._gpus, self._lendable, self._reclaiming)
            )


def api_client(kubeconfig: str | None) -> kubernetes.client.ApiClient:
    """A client for ``kubeconfig``, or for the pod's service account when None."""
    if kubeconfig:
        client = kubernetes.config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
        return cast(kubernetes.client.ApiClient, client)
    kubernetes.config.load_incluster_config()  # type: ignore[no-untyped-call]
    return kubernetes.client.ApiClient()


def settings_from_config(cfg: Config, *, node: str | None = None) -> PluginSettings:
    """The plugin's settings from the agent's config file (``dra``, ``kubelet.rootDir``, the specs)."""
    return PluginSettings(
        node=node or cfg.node_name,
        vendor_kind=cfg.dra.vendor_kind,
        kubelet_root=Path(cfg.kubelet.root_dir),
        cdi_root=Path(cfg.dra.cdi_root),
        cdi_spec_dirs=tuple(cfg.cdi_spec_dirs),
        shape=PoolShape(share_specs=cfg.share_specs, dev_share_specs=cfg.dev_share_specs),
    )


def read_claim_with(api: kubernetes.client.ApiClient) -> Any:
    custom = kubernetes.client.CustomObjectsApi(api)

    def read(namespace: str, name: str) -> Mapping[str, Any]:
        obj = cast(
            dict[str, Any],
            custom.get_namespaced_custom_object(
                "resource.k8s.io", "v1", namespace, "resourceclaims", name, _request_timeout=10
            ),
        )
        return obj

    return read


class DraPlugin:
    def __init__(self, settings: PluginSettings, api: kubernetes.client.ApiClient) -> None:
        self.settings = settings
        self.inventory = Inventory(settings)
        self.inventory.rescan()
        self.state = PreparedClaims(settings.plugin_dir, settings.cdi_root, settings.driver)
        self.driver = Driver(
            driver=settings.driver,
            pool=settings.node,
            devices=self.inventory.devices,
            read_claim=read_claim_with(api),
            state=self.state,
            blocked=self.inventory.blocked,
        )
        self.service = NodeService(self.driver, plugin_dir=settings.plugin_dir, registry_dir=settings.registry_dir)
        self.publisher = SlicePublisher(
            api, driver=settings.driver, node=settings.node, desired=self.inventory.pool, resync_s=settings.resync_s
        )

    def set_lend(self, lendable: Iterable[str], reclaiming: Iterable[str] = ()) -> None:
        """Open the spot devices of ``lendable`` GPUs to borrowers; evict borrowers of ``reclaiming``."""
        if self.inventory.set_lend(lendable, reclaiming):
            self.publisher.poke()

    def run(self, stop: threading.Event) -> None:
        self.service.start()
        publisher = threading.Thread(target=self.publisher.run, args=(stop,), name="dra-publisher", daemon=True)
        publisher.start()
        try:
            while not stop.wait(_RESCAN_S):
                if self.inventory.rescan():
                    self.publisher.poke()
        finally:
            self.service.stop()
