"""Spot's per-GPU health as taints on the DRA driver's spot devices."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import kubernetes

from controller.io.dra_devices import DraDevices
from draplugin.claims import ClaimRef, PreparedClaim, PreparedDevice
from draplugin.plugin import DraPlugin, PluginSettings
from gpushare import keys


def _plugin(tmp_path: Path) -> DraPlugin:
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    devices = [
        {"name": f"fakegpu{i}", "containerEdits": {"deviceNodes": [{"path": f"/dev/fakegpu{i}"}]}} for i in range(2)
    ]
    (cdi / "vendor.json").write_text(json.dumps({"cdiVersion": "0.5.0", "kind": "example.com/gpu", "devices": devices}))
    settings = PluginSettings(
        node="node-a",
        vendor_kind="example.com/gpu",
        kubelet_root=tmp_path / "kubelet",
        cdi_root=cdi,
        cdi_spec_dirs=(str(cdi),),
    )
    # No call reaches the API here: the publisher never runs.
    return DraPlugin(settings, kubernetes.client.ApiClient())


def _spot_taints(plugin: DraPlugin) -> dict[str, list[tuple[str, str]]]:
    out = {}
    for s in plugin.inventory.pool().slices:
        for d in s.get("devices", []):
            if d["name"].endswith("-spot"):
                out[d["name"]] = [(t["key"], t["effect"]) for t in d.get("taints", [])]
    return out


def test_health_opens_and_closes_spot_devices_by_the_vendors_id(tmp_path: Path) -> None:
    plugin = _plugin(tmp_path)
    dra = DraDevices(plugin, threading.Event())
    closed = [(keys.TAINT_OWNER_ACTIVE, "NoSchedule")]
    dra.set_spot_health("fakegpu1", True)
    assert _spot_taints(plugin) == {"gpu-0-spot": closed, "gpu-1-spot": []}
    assert dra.spot_healthy("spot-fakegpu1") and not dra.spot_healthy("spot-fakegpu0")
    assert plugin.inventory.blocked().keys() == {"gpu-0-spot"}
    assert dra.real_devices() == {keys.RESOURCE_DRA_GPU: ("fakegpu0", "fakegpu1")}

    # A borrower's claim still prepared when the GPU is taken back: evict what is left.
    borrower = PreparedClaim(
        ClaimRef("spot", "job", "u1"),
        (PreparedDevice("gpu", "gpu-1-spot", "spot", "gpu-1", 1000, "", ("example.com/gpu=fakegpu1",)),),
    )
    plugin.state.add(borrower)
    dra.set_spot_health("fakegpu1", False)
    assert _spot_taints(plugin)["gpu-1-spot"] == [*closed, (keys.TAINT_RECLAIMED, "NoExecute")]
    # kubelet unprepares the claim once the pod is gone: only owner-active stays.
    plugin.driver.unprepare([borrower.ref])
    assert _spot_taints(plugin)["gpu-1-spot"] == closed
    assert dra.status()[keys.DRA_DRIVER]["claims"] == 0
