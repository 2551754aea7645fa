"""The concrete plugins: share / share-dev (design §2 to §4), spot (§6) and the fake vendor plugin.

Each is a ``DevicePluginServer`` whose decisions are the pure functions of ``policies.py``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from deviceplugins import policies
from deviceplugins.policies import AdvertisedDevice, Allocation
from deviceplugins.server import DevicePluginServer
from gpushare import keys
from gpushare.ids import format_spot_id
from gpushare.log import kv

log = logging.getLogger(__name__)


class SharePlugin(DevicePluginServer):
    """``gpushare/share-gpu-N`` or ``gpushare/share-dev-gpu-N``: slots of shadow pods."""

    def __init__(self, kind: str, spec: int, plugin_dir: str, **kwargs: Any) -> None:
        super().__init__(keys.share_resource(kind, spec), plugin_dir, preferred_allocation=True, **kwargs)
        self.kind = kind
        self.spec = spec

    def allocate(self, ids: Sequence[str]) -> Allocation:
        return policies.allocate_share(self.resource, ids, self.advertised())

    def preferred(self, available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
        return policies.prefer_share(available, must_include, size)


class SpotPlugin(DevicePluginServer):
    """``gpushare/spot-gpu``: one ``spot-<realID>`` per real GPU, Healthy only while lendable."""

    def __init__(self, plugin_dir: str, **kwargs: Any) -> None:
        super().__init__(keys.RESOURCE_SPOT_GPU, plugin_dir, preferred_allocation=True, **kwargs)
        self._state_lock = threading.Lock()
        self._real: dict[str, tuple[AdvertisedDevice, ...]] = {}
        self._health: dict[str, bool] = {}
        self._lent: frozenset[str] = frozenset()
        self._owner: Mapping[str, str] = {}
        self._skip_logged: dict[str, str] = {}

    def set_real_devices(self, real_resource: str, devices: Iterable[AdvertisedDevice]) -> None:
        """The vendor plugin's current list (from its ListAndWatch); its health counts too."""
        with self._state_lock:
            self._real[real_resource] = tuple(devices)
            self._recompute()

    def set_health(self, real_id: str, healthy: bool) -> None:
        """The controller's verdict (design §6): Healthy while the owner is away."""
        with self._state_lock:
            self._health[real_id] = healthy
            self._recompute()

    def set_lent(self, real_ids: Iterable[str]) -> None:
        with self._state_lock:
            self._lent = frozenset(format_spot_id(r) for r in real_ids)

    def vendor_unhealthy(self) -> dict[str, str]:
        """Real ID -> why, for each real device handed in Unhealthy (kubelet lists it no more as allocatable)."""
        with self._state_lock:
            return {
                d.id: f"is not allocatable at kubelet (its {resource} device plugin lists it Unhealthy)"
                for resource, devs in self._real.items()
                for d in devs
                if not d.healthy
            }

    def real_devices(self) -> dict[str, tuple[str, ...]]:
        with self._state_lock:
            return {r: tuple(d.id for d in devs) for r, devs in self._real.items()}

    def _recompute(self) -> None:
        # A GPU is lendable only if the controller says so *and* its vendor plugin calls it Healthy.
        vendor_ok = {d.id: d.healthy for devs in self._real.values() for d in devs}
        health = {rid: ok and vendor_ok.get(rid, False) for rid, ok in self._health.items()}
        result = policies.spot_devices({r: [d.id for d in devs] for r, devs in self._real.items()}, health)
        for rid, why in result.skipped:
            if self._skip_logged.get(rid) != why:  # once per ID and reason, not once per update
                log.warning(
                    "real device not advertised as spot", extra=kv(resource=self.resource, real_id=rid, reason=why)
                )
        self._skip_logged = dict(result.skipped)
        self._owner = result.real_resource_of
        self.set_devices(result.devices)

    def allocate(self, ids: Sequence[str]) -> Allocation:
        with self._state_lock:
            owner = self._owner
        return policies.allocate_spot(self.resource, ids, self.advertised(), owner)

    def preferred(self, available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
        return policies.prefer_spot(available, must_include, size, self._lent)


class FakeGpuPlugin(DevicePluginServer):
    """A stand-in for a vendor plugin on machines without GPUs (tests, demo).

    Advertises ``fakegpu<i>`` for nodes ``<dev_dir>/fakegpu<i>`` and answers ``Allocate`` as a
    vendor does: one ``DeviceSpec`` per node and ``FAKE_VISIBLE_DEVICES=<ids>``.
    """

    def __init__(self, resource: str, plugin_dir: str, dev_dir: str, count: int, **kwargs: Any) -> None:
        super().__init__(resource, plugin_dir, **kwargs)
        self.dev_dir = dev_dir
        self.set_devices(AdvertisedDevice(i) for i in policies.fake_device_ids(count))

    def set_health(self, device_id: str, healthy: bool) -> None:
        """Flip one fake GPU's health (tests of vendor-side health)."""
        self.set_devices(AdvertisedDevice(d.id, healthy) if d.id == device_id else d for d in self.devices())

    def allocate(self, ids: Sequence[str]) -> Allocation:
        return policies.allocate_fake(self.resource, ids, self.advertised(), self.dev_dir)
