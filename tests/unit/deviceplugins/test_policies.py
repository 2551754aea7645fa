"""Table-driven tests of the device plugins' decisions: no sockets, threads or clock."""

from __future__ import annotations

import json

import pytest

from deviceplugins.errors import DevicesRefused, InvalidShadow, UnknownDevices
from deviceplugins.policies import (
    FAKE_VISIBLE_ENV,
    AdvertisedDevice,
    DeviceMount,
    ShadowSlots,
    allocate_fake,
    allocate_share,
    allocate_spot,
    check_shadows,
    fake_device_ids,
    parse_static_shadow,
    prefer_share,
    prefer_spot,
    share_devices,
    spot_devices,
)
from gpushare import codecs, keys

NS = "gpushare-system"
SHARE4 = "gpushare/share-gpu-4"
SPOT = "gpushare/spot-gpu"


def adv(*devices: AdvertisedDevice) -> dict[str, AdvertisedDevice]:
    return {d.id: d for d in devices}


# --- shadows -> devices ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shadows", "resource", "want"),
    [
        pytest.param([], SHARE4, [], id="no shadows"),
        pytest.param(
            [ShadowSlots(NS, "a", 4)],
            SHARE4,
            [f"{NS}/a-0", f"{NS}/a-1", f"{NS}/a-2", f"{NS}/a-3"],
            id="one shadow gives N slots",
        ),
        pytest.param(
            [ShadowSlots(NS, "b", 2), ShadowSlots(NS, "a", 2)],
            "gpushare/share-gpu-2",
            [f"{NS}/a-0", f"{NS}/a-1", f"{NS}/b-0", f"{NS}/b-1"],
            id="count is shadows x N, sorted by shadow",
        ),
        pytest.param([ShadowSlots(NS, "a", 4)], "gpushare/share-gpu-2", [], id="other spec not counted"),
        pytest.param(
            [ShadowSlots(NS, "a", 4, keys.KIND_SHARE_DEV), ShadowSlots(NS, "b", 4)],
            "gpushare/share-dev-gpu-4",
            [f"{NS}/a-0", f"{NS}/a-1", f"{NS}/a-2", f"{NS}/a-3"],
            id="share-dev is its own resource",
        ),
    ],
)
def test_share_devices(shadows: list[ShadowSlots], resource: str, want: list[str]) -> None:
    got = share_devices(shadows, resource)
    assert [d.id for d in got] == want
    assert all(d.healthy for d in got)


@pytest.mark.parametrize(
    ("shadows", "served", "fragment"),
    [
        pytest.param([ShadowSlots(NS, "a", 7)], [SHARE4], "gpushare/share-gpu-7 is not served", id="spec not served"),
        pytest.param([ShadowSlots(NS, "a", 4, "weird")], None, "kind 'weird'", id="bad kind"),
        pytest.param([ShadowSlots(NS, "a", 1)], None, "outside 2..64", id="spec too small"),
        pytest.param([ShadowSlots(NS, "a", 4), ShadowSlots(NS, "a", 4)], None, "listed twice", id="duplicate"),
        pytest.param([ShadowSlots("Bad_NS", "a", 4)], None, "not a valid", id="bad namespace"),
        pytest.param([ShadowSlots(NS, "x" * 50, 4)], None, "longer than kubelet's 63", id="ID too long"),
    ],
)
def test_check_shadows_refuses(shadows: list[ShadowSlots], served: list[str] | None, fragment: str) -> None:
    with pytest.raises(InvalidShadow) as exc:
        check_shadows(shadows, served)
    assert fragment in str(exc.value)


def test_check_shadows_lists_every_problem() -> None:
    with pytest.raises(InvalidShadow) as exc:
        check_shadows([ShadowSlots(NS, "a", 1), ShadowSlots(NS, "b", 4, "weird")], None)
    assert len(exc.value.problems) == 2


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("ns/sh:4", ShadowSlots("ns", "sh", 4, keys.KIND_SHARE)),
        ("ns/sh-x.1:8:share-dev", ShadowSlots("ns", "sh-x.1", 8, keys.KIND_SHARE_DEV)),
    ],
)
def test_parse_static_shadow(text: str, want: ShadowSlots) -> None:
    assert parse_static_shadow(text) == want


@pytest.mark.parametrize(
    "text",
    ["ns-sh:4", "ns/sh", "ns/sh:four", "ns/sh:4:other", "ns/sh:4:share:x", "ns/sh:1", "ns/sh:\u00b2", "ns/sh:\u0663"],
)
def test_parse_static_shadow_refuses(text: str) -> None:
    with pytest.raises(InvalidShadow) as exc:
        parse_static_shadow(text)
    assert repr(text) in str(exc.value) or "shadow" in str(exc.value)


# --- share Allocate ------------------------------------------------------------------------

SHARE_ADV = adv(
    AdvertisedDevice(f"{NS}/a-0"),
    AdvertisedDevice(f"{NS}/a-1"),
    AdvertisedDevice(f"{NS}/a-2"),
    AdvertisedDevice(f"{NS}/a-3"),
    AdvertisedDevice(f"{NS}/b-0"),
    AdvertisedDevice(f"{NS}/c-0", healthy=False),
)


@pytest.mark.parametrize(
    ("ids", "want_json"),
    [
        ([f"{NS}/a-1"], '{"gpushare-system/a/main":{"*":["gpushare-system/a-1"]}}'),
        ([f"{NS}/a-3", f"{NS}/a-0"], '{"gpushare-system/a/main":{"*":["gpushare-system/a-0","gpushare-system/a-3"]}}'),
    ],
)
def test_allocate_share_annotation_exact(ids: list[str], want_json: str) -> None:
    alloc = allocate_share(SHARE4, ids, SHARE_ADV)
    assert alloc.annotations == {keys.ANNOTATION_DEVICES_FROM: want_json}
    assert alloc.envs == {} and alloc.devices == ()
    # What the NRI plugin will parse back.
    parsed = codecs.parse_devices_from(want_json)
    assert str(parsed.source) == f"{NS}/a/main" and sorted(parsed.virtual_ids) == sorted(ids)


@pytest.mark.parametrize(
    ("ids", "error", "fragments"),
    [
        pytest.param(
            [f"{NS}/zz-0", f"{NS}/a-0", f"{NS}/yy-1"], UnknownDevices, [f"{NS}/yy-1", f"{NS}/zz-0"], id="unknown"
        ),
        pytest.param([f"{NS}/a-0", f"{NS}/b-0"], DevicesRefused, ["2 shadows", f"{NS}/a", f"{NS}/b"], id="two shadows"),
        pytest.param([f"{NS}/c-0"], DevicesRefused, [f"{NS}/c-0", "Unhealthy"], id="closed shadow"),
        pytest.param([f"{NS}/a-0", f"{NS}/a-0"], DevicesRefused, ["more than once"], id="duplicate"),
        pytest.param([], DevicesRefused, ["no device IDs"], id="empty"),
    ],
)
def test_allocate_share_refuses(ids: list[str], error: type[Exception], fragments: list[str]) -> None:
    with pytest.raises(error) as exc:
        allocate_share(SHARE4, ids, SHARE_ADV)
    for f in fragments:
        assert f in str(exc.value)
    assert SHARE4 in str(exc.value)


# --- spot ------------------------------------------------------------------------------------


def test_spot_devices_fail_closed_and_prefix() -> None:
    got = spot_devices({"nvidia.com/gpu": ["GPU-1", "GPU-0"], "amd.com/gpu": ["0"]}, {"GPU-1": True})
    assert [(d.id, d.healthy) for d in got.devices] == [("spot-0", False), ("spot-GPU-0", False), ("spot-GPU-1", True)]
    assert got.real_resource_of == {"GPU-1": "nvidia.com/gpu", "GPU-0": "nvidia.com/gpu", "0": "amd.com/gpu"}
    assert got.skipped == ()


def test_spot_devices_skip_too_long_and_duplicates() -> None:
    long_id = "G" * 59  # "spot-" + 59 = 64 > 63
    got = spot_devices({"a.com/gpu": ["x"], "b.com/gpu": ["x", long_id]}, {})
    assert [d.id for d in got.devices] == ["spot-x"]
    assert got.real_resource_of == {"x": "a.com/gpu"}
    assert dict(got.skipped) == {"x": "listed twice", long_id: "too long for a device ID"}


def test_spot_never_offers_a_replica_of_a_gpu_the_vendor_shares_itself() -> None:
    got = spot_devices({"nvidia.com/gpu": ["GPU-1::0", "GPU-1::1", "GPU-2"]}, {"GPU-1::0": True, "GPU-2": True})
    assert [d.id for d in got.devices] == ["spot-GPU-2"]
    assert [rid for rid, _ in got.skipped] == ["GPU-1::0", "GPU-1::1"]
    assert "time-slicing or MPS" in got.skipped[0][1]


SPOT_ADV = adv(
    AdvertisedDevice("spot-GPU-0"), AdvertisedDevice("spot-GPU-1", healthy=False), AdvertisedDevice("spot-7")
)
OWNER = {"GPU-0": "nvidia.com/gpu", "GPU-1": "nvidia.com/gpu", "7": "amd.com/gpu"}


@pytest.mark.parametrize(
    ("ids", "want"),
    [
        (["spot-GPU-0"], '{"nvidia.com/gpu":["GPU-0"]}'),
        (["spot-GPU-0", "spot-7"], '{"amd.com/gpu":["7"],"nvidia.com/gpu":["GPU-0"]}'),
    ],
)
def test_allocate_spot_annotation_exact(ids: list[str], want: str) -> None:
    alloc = allocate_spot(SPOT, ids, SPOT_ADV, OWNER)
    assert alloc.annotations == {keys.ANNOTATION_DEVICES_IDS: want}
    codecs.parse_devices_ids(want)  # the NRI plugin accepts it


def test_allocate_spot_refuses_unhealthy_naming_it() -> None:
    with pytest.raises(DevicesRefused) as exc:
        allocate_spot(SPOT, ["spot-GPU-0", "spot-GPU-1"], SPOT_ADV, OWNER)
    assert exc.value.ids == ("spot-GPU-1",)
    assert "spot-GPU-1" in str(exc.value) and "Unhealthy" in str(exc.value)


def test_allocate_spot_unknown() -> None:
    with pytest.raises(UnknownDevices) as exc:
        allocate_spot(SPOT, ["spot-GPU-9"], SPOT_ADV, OWNER)
    assert "spot-GPU-9" in str(exc.value)


# --- preferred allocation --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("available", "must", "size", "want"),
    [
        pytest.param(["ns/a-0", "ns/a-1", "ns/a-2", "ns/b-3"], [], 1, ["ns/b-3"], id="fullest shadow that fits (pack)"),
        pytest.param(["ns/a-0", "ns/a-1", "ns/a-2", "ns/b-3"], [], 2, ["ns/a-0", "ns/a-1"], id="only a fits two"),
        pytest.param(["ns/b-1", "ns/a-1", "ns/b-0"], ["ns/a-1"], 2, ["ns/a-1", "ns/b-0"], id="must-include first"),
        pytest.param(
            ["ns/a-0", "ns/a-2", "ns/b-1", "ns/b-0", "ns/b-2"],
            ["ns/b-2"],
            2,
            ["ns/b-2", "ns/b-0"],
            id="stays on the must-include shadow",
        ),
        pytest.param(["ns/a-0", "ns/a-1"], ["ns/a-1"], 1, ["ns/a-1"], id="must covers size"),
        pytest.param(["ns/a-0", "ns/b-0"], [], 2, ["ns/a-0", "ns/b-0"], id="no single fit: top up"),
    ],
)
def test_prefer_share(available: list[str], must: list[str], size: int, want: list[str]) -> None:
    assert prefer_share(available, must, size) == want


@pytest.mark.parametrize(
    ("available", "must", "size", "lent", "want"),
    [
        pytest.param(["spot-b", "spot-a", "spot-c"], [], 1, ["spot-a"], ["spot-b"], id="idle before lent"),
        pytest.param(["spot-b", "spot-a"], [], 2, ["spot-a", "spot-b"], ["spot-a", "spot-b"], id="all lent: by ID"),
        pytest.param(["spot-b", "spot-a"], ["spot-a"], 2, ["spot-a"], ["spot-a", "spot-b"], id="must first"),
        pytest.param(["spot-b", "spot-a", "spot-c"], [], 2, [], ["spot-a", "spot-b"], id="no lent: ID order"),
    ],
)
def test_prefer_spot(available: list[str], must: list[str], size: int, lent: list[str], want: list[str]) -> None:
    assert prefer_spot(available, must, size, lent) == want


# --- fake vendor -----------------------------------------------------------------------------


def test_allocate_fake_like_a_vendor() -> None:
    ids = fake_device_ids(3)
    assert ids == ["fakegpu0", "fakegpu1", "fakegpu2"]
    alloc = allocate_fake(
        "example.com/gpu", ["fakegpu2", "fakegpu0"], adv(*(AdvertisedDevice(i) for i in ids)), "/tmp/dev/"
    )
    assert alloc.envs == {FAKE_VISIBLE_ENV: "fakegpu2,fakegpu0"}
    assert alloc.devices == (
        DeviceMount("/dev/fakegpu2", "/tmp/dev/fakegpu2", "rw"),
        DeviceMount("/dev/fakegpu0", "/tmp/dev/fakegpu0", "rw"),
    )
    assert alloc.annotations == {}
    assert json.dumps(dict(alloc.envs))  # plain data


def test_allocate_fake_unknown() -> None:
    with pytest.raises(UnknownDevices, match="fakegpu9"):
        allocate_fake("example.com/gpu", ["fakegpu9"], adv(AdvertisedDevice("fakegpu0")), "/dev")
