"""What a node publishes: devices, counters and the slice layout the API accepts."""

from __future__ import annotations

import itertools
import math

import pytest

from draplugin.inventory import Gpu, gpus_from_cdi
from draplugin.pool import (
    KIND_EXACT,
    KIND_SHARE,
    KIND_SHARE_DEV,
    KIND_SPOT,
    KIND_WHOLE,
    MAX_COUNTER_SETS_PER_SLICE,
    MAX_DEVICES_PER_SLICE,
    PoolShape,
    Taint,
    build_pool,
    devices_of,
    parse_device_name,
    spot_taints,
)
from gpushare.cdi import CdiDeviceNode, CdiEdits


def _gpus(n: int) -> list[Gpu]:
    return [Gpu(i, (f"example.com/gpu=fakegpu{i}",), (f"/dev/fakegpu{i}",)) for i in range(n)]


def _nodes(*paths: str) -> CdiEdits:
    return CdiEdits(device_nodes=tuple(CdiDeviceNode(p, p) for p in paths))


def test_gpus_from_cdi_groups_names_of_one_gpu_and_drops_aggregates() -> None:
    ctl = "/dev/nvidiactl"
    devices = {
        "nvidia.com/gpu=all": _nodes(ctl, "/dev/nvidia0", "/dev/nvidia1"),
        "nvidia.com/gpu=1": _nodes(ctl, "/dev/nvidia1"),
        "nvidia.com/gpu=GPU-b": _nodes(ctl, "/dev/nvidia1"),
        "nvidia.com/gpu=0": _nodes(ctl, "/dev/nvidia0"),
        "nvidia.com/gpu=GPU-a": _nodes(ctl, "/dev/nvidia0"),
        "other.com/gpu=0": _nodes("/dev/other0"),
    }
    gpus = gpus_from_cdi(devices, "nvidia.com/gpu")
    # The UUID is each GPU's identity (what the exporter names it by); the index orders them.
    assert [g.cdi_names for g in gpus] == [
        ("nvidia.com/gpu=GPU-a", "nvidia.com/gpu=0"),
        ("nvidia.com/gpu=GPU-b", "nvidia.com/gpu=1"),
    ]
    assert [(g.name, g.vendor_id) for g in gpus] == [("gpu-0", "GPU-a"), ("gpu-1", "GPU-b")]
    assert gpus_from_cdi(devices, "absent.com/gpu") == []


def test_every_kind_of_device_per_gpu_with_unique_names() -> None:
    shape = PoolShape(share_specs=(2, 3), dev_share_specs=(4,))
    infos = devices_of(_gpus(2), shape)
    per_gpu = [i for i in infos.values() if i.gpu.index == 0]
    kinds = sorted(i.kind for i in per_gpu)
    assert kinds.count(KIND_WHOLE) == 1 and kinds.count(KIND_EXACT) == 1 and kinds.count(KIND_SPOT) == 1
    assert kinds.count(KIND_SHARE) == 5 and kinds.count(KIND_SHARE_DEV) == 4
    assert len(infos) == 2 * len(per_gpu)
    assert all(len(name) <= 63 for name in infos)
    assert not any(i.kind == KIND_SPOT for i in devices_of(_gpus(1), PoolShape(spot=False)).values())


def _consumption(slices: list[dict], device: str) -> dict[str, int]:
    for s in slices:
        for d in s.get("devices", []):
            if d["name"] == device:
                counters = d.get("consumesCounters", [])
                return {k: int(v["value"]) for c in counters for k, v in c["counters"].items()}
    raise KeyError(device)


def test_slots_of_any_mix_fit_a_gpu_exactly_when_their_shares_do() -> None:
    shape = PoolShape(share_specs=(2, 3, 4, 5), dev_share_specs=(2, 4, 8, 16))
    slices = [dict(s) for s in build_pool("d", "n", _gpus(1), shape).slices]
    whole = _consumption(slices, "gpu-0")["slices"]
    assert whole == math.lcm(2, 3, 4, 5, 8, 16)
    specs = [3, 5, 16, 2]
    # Every multiset of up to 4 slots: the counter says "fits" exactly when the fractions sum to ≤ 1.
    for combo in itertools.combinations_with_replacement(specs, 4):
        for k in range(1, 5):
            part = combo[:k]
            used = sum(
                _consumption(slices, f"gpu-0-share{n}-1" if n <= 5 else f"gpu-0-dev{n}-1")["slices"] for n in part
            )
            assert (used <= whole) == (sum(1 / n for n in part) <= 1 + 1e-12)
            milli = sum(
                _consumption(slices, f"gpu-0-share{n}-1" if n <= 5 else f"gpu-0-dev{n}-1")["milli"] for n in part
            )
            if used <= whole:
                assert milli <= 1000


def test_counters_in_their_own_slices_and_device_slices_within_limits() -> None:
    pool = build_pool("gpushare.k8s.io", "node-a", _gpus(10), PoolShape())
    counter_slices = [s for s in pool.slices if "sharedCounters" in s]
    device_slices = [s for s in pool.slices if "devices" in s]
    assert not any("sharedCounters" in s and "devices" in s for s in pool.slices)
    assert sum(len(s["sharedCounters"]) for s in counter_slices) == 10
    assert all(len(s["sharedCounters"]) <= MAX_COUNTER_SETS_PER_SLICE for s in counter_slices)
    assert all(len(s["devices"]) <= MAX_DEVICES_PER_SLICE for s in device_slices)
    assert all(s["nodeName"] == "node-a" and s["driver"] == "gpushare.k8s.io" for s in pool.slices)
    names = [d["name"] for s in device_slices for d in s["devices"]]
    assert len(names) == len(set(names)) == len(devices_of(_gpus(10), PoolShape()))
    for d in (d for s in device_slices for d in s["devices"]):
        assert len(d["attributes"]) + len(d.get("capacity", {})) <= 32


def test_exact_device_is_multi_allocatable_with_a_milli_range() -> None:
    pool = build_pool("d", "n", _gpus(1), PoolShape())
    exact = next(d for s in pool.slices for d in s.get("devices", []) if d["name"] == "gpu-0-exact")
    assert exact["allowMultipleAllocations"] is True
    policy = exact["capacity"]["milli"]["requestPolicy"]
    assert policy["validRange"] == {"min": "1", "max": "1000", "step": "1"}
    assert exact["consumesCounters"][0]["counters"]["milli"] == {"value": "1000"}


def test_taints_go_on_the_named_device_only() -> None:
    taint = Taint("gpushare.k8s.io/owner-active", "NoSchedule")
    pool = build_pool("d", "n", _gpus(2), PoolShape(), {"gpu-1-spot": [taint]})
    tainted = {d["name"] for s in pool.slices for d in s.get("devices", []) if d.get("taints")}
    assert tainted == {"gpu-1-spot"}


@pytest.mark.parametrize("gpus", [0, 1])
def test_a_node_without_gpus_publishes_nothing_but_its_counters(gpus: int) -> None:
    pool = build_pool("d", "n", _gpus(gpus), PoolShape())
    assert len(pool.slices) == (0 if gpus == 0 else 2)


def test_spot_devices_take_borrowers_only_while_lendable() -> None:
    gpus = _gpus(3)
    taints = spot_taints(gpus, lendable={"gpu-1"}, reclaiming={"gpu-2"})
    assert set(taints) == {"gpu-0-spot", "gpu-2-spot"}
    assert [t.key for t in taints["gpu-0-spot"]] == ["gpushare.k8s.io/owner-active"]
    assert [(t.key, t.effect) for t in taints["gpu-2-spot"]] == [
        ("gpushare.k8s.io/owner-active", "NoSchedule"),
        ("gpushare.k8s.io/reclaimed", "NoExecute"),
    ]


def test_device_names_parse_back() -> None:
    infos = devices_of(_gpus(2), PoolShape())
    for name, info in infos.items():
        assert parse_device_name(name) == (info.gpu.name, info.kind, info.share_n)
    for bad in ("gpu-01", "gpu-0-share0-1", "gpu-0-spot-1", "node-0", "gpu-0-dev4-0"):
        assert parse_device_name(bad) is None
