"""The agent's device side on a DRA node: gpushare's DRA driver in place of its device plugins.

The loop and the applier talk to the node's devices through one interface
(``controller.applier.DevicePlugins``). On a DRA node it is this adapter over
``draplugin.plugin.DraPlugin``, running in the agent's process:

- share devices are not advertised: the scheduler places shares on the published slices, so
  ``set_devices`` has nothing to do;
- spot's per-GPU health becomes the spot device's taints: Healthy opens the GPU's spot device
  to borrowers, Unhealthy closes it (``gpushare.k8s.io/owner-active``), and while a closed spot
  device is still prepared for a borrower's claim (the reclaim killed it, the pod is not gone
  yet) ``gpushare.k8s.io/reclaimed`` evicts what is left and lets its claim deallocate;
- the real devices spot lends are the driver's GPUs, of ``keys.RESOURCE_DRA_GPU``, by the
  vendor's ID of each (``controller/io/podresources_entries.py`` reads the same IDs).

A health change reaches the API on the publisher's next write (it is poked at once); the
reclaim never waits for it: the kill goes through the pod cgroups first (docs/spot.md).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from draplugin.plugin import DraPlugin
from draplugin.pool import KIND_SPOT, parse_device_name
from gpushare import keys
from gpushare.ids import parse_spot_id


class DraDevices:
    def __init__(self, plugin: DraPlugin, stop: threading.Event) -> None:
        self.plugin = plugin
        self._stop = stop
        self._lock = threading.Lock()
        self._healthy: set[str] = set()  # vendor IDs of the GPUs whose spot device takes borrowers
        self._thread: threading.Thread | None = None
        plugin.driver.on_change = self._retaint

    # -- the loop's and the applier's interface ---------------------------------------------
    def set_devices(self, resource: str, devices: Iterable[Any]) -> None:
        """Nothing to advertise: the scheduler places shares on the published slices."""

    def set_spot_health(self, real_id: str, healthy: bool) -> None:
        with self._lock:
            if healthy:
                self._healthy.add(real_id)
            else:
                self._healthy.discard(real_id)
        self._retaint()

    def set_spot_lent(self, real_ids: Iterable[str]) -> None:
        """The scheduler, not a preferred allocation, picks among open spot devices."""

    def real_devices(self) -> dict[str, tuple[str, ...]]:
        return {keys.RESOURCE_DRA_GPU: tuple(g.vendor_id for g in self.plugin.inventory.gpus())}

    def set_real_devices(self, real_resource: str, devices: Iterable[Any]) -> None:
        """kubelet's allocatable devices list no DRA device; the driver knows its GPUs itself."""

    def vendor_unhealthy(self) -> dict[str, str]:
        return {}

    def status(self) -> dict[str, dict[str, Any]]:
        prepared = self.plugin.state.snapshot()
        return {
            keys.DRA_DRIVER: {
                "registered": self.plugin.service.registered,
                "devices": len(self.plugin.inventory.devices()),
                "gpus": len(self.plugin.inventory.gpus()),
                "claims": len(prepared),
                "generation": self.plugin.publisher.generation,
                "lendable": sorted(self._healthy),
            }
        }

    # -- what the agent asks besides ----------------------------------------------------------
    def spot_healthy(self, device_id: str) -> bool:
        real = parse_spot_id(device_id)
        with self._lock:
            return real is not None and real in self._healthy

    def start(self) -> None:
        self._retaint()
        self._thread = threading.Thread(target=self.plugin.run, args=(self._stop,), name="gpushare-dra", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._thread.join(5.0)

    def _retaint(self) -> None:
        held = self.plugin.state.held()
        borrowed = set()
        for device in held:
            parsed = parse_device_name(device)
            if parsed is not None and parsed[1] == KIND_SPOT:
                borrowed.add(parsed[0])
        with self._lock:
            healthy = set(self._healthy)
        lendable = {g.name for g in self.plugin.inventory.gpus() if g.vendor_id in healthy}
        self.plugin.set_lend(lendable, reclaiming=borrowed - lendable)
