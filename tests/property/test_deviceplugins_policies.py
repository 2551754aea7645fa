"""Properties of the device plugins' decisions (hypothesis): any input, only our answers or our errors."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from deviceplugins.errors import DevicePluginError, DevicesRefused, InvalidShadow, UnknownDevices
from deviceplugins.policies import (
    AdvertisedDevice,
    ShadowSlots,
    allocate_share,
    allocate_spot,
    parse_static_shadow,
    prefer_share,
    prefer_spot,
    share_devices,
)
from gpushare import codecs
from gpushare.ids import format_spot_id, parse_spot_id

NS = "gpushare-system"
names = st.from_regex(r"[a-z][a-z0-9]{0,8}", fullmatch=True)
shadow_sets = st.lists(
    st.tuples(names, st.integers(min_value=2, max_value=8)), min_size=1, max_size=5, unique_by=lambda t: t[0]
)


def _share_world(spec_shadows: list[tuple[str, int]]) -> tuple[str, dict[str, AdvertisedDevice]]:
    spec = spec_shadows[0][1]
    shadows = [ShadowSlots(NS, name, spec) for name, _ in spec_shadows]
    resource = shadows[0].resource
    return resource, {d.id: d for d in share_devices(shadows, resource)}


@given(shadow_sets, st.data())
def test_prefer_share_is_a_valid_answer(spec_shadows: list[tuple[str, int]], data: st.DataObject) -> None:
    _, advertised = _share_world(spec_shadows)
    ids = sorted(advertised)
    available = data.draw(st.lists(st.sampled_from(ids), unique=True, min_size=1))
    must = data.draw(st.lists(st.sampled_from(available), unique=True, max_size=2))
    size = data.draw(st.integers(min_value=len(must), max_value=len(available)))
    got = prefer_share(available, must, size)
    assert got[: len(must)] == must
    assert len(got) == len(set(got)) == max(size, len(must))
    assert set(got) <= set(available)


@given(shadow_sets, st.data())
def test_prefer_share_keeps_one_shadow_when_possible(spec_shadows: list[tuple[str, int]], data: st.DataObject) -> None:
    _, advertised = _share_world(spec_shadows)
    ids = sorted(advertised)
    available = data.draw(st.lists(st.sampled_from(ids), unique=True, min_size=1))
    got = prefer_share(available, [], 1)
    assert len(got) == 1
    # One slot always fits in one shadow, and that shadow is the fullest one that has a free slot.
    free: dict[str, int] = {}
    for vid in available:
        key = vid.rsplit("-", 1)[0]
        free[key] = free.get(key, 0) + 1
    assert free[got[0].rsplit("-", 1)[0]] == min(free.values())


@given(shadow_sets, st.data())
def test_allocate_share_round_trips_through_the_codec(spec_shadows: list[tuple[str, int]], data: st.DataObject) -> None:
    resource, advertised = _share_world(spec_shadows)
    name, spec = spec_shadows[0][0], spec_shadows[0][1]
    own = [f"{NS}/{name}-{i}" for i in range(spec)]
    ids = data.draw(st.lists(st.sampled_from(own), unique=True, min_size=1))
    alloc = allocate_share(resource, ids, advertised)
    (value,) = alloc.annotations.values()
    parsed = codecs.parse_devices_from(value)
    assert (parsed.source.namespace, parsed.source.pod, parsed.source.container) == (NS, name, "main")
    assert sorted(parsed.virtual_ids) == sorted(ids)


@given(shadow_sets, st.lists(names, min_size=1, max_size=4, unique=True), st.data())
def test_allocate_share_names_exactly_the_unknown_ids(
    spec_shadows: list[tuple[str, int]], strangers: list[str], data: st.DataObject
) -> None:
    resource, advertised = _share_world(spec_shadows)
    unknown = [f"other/{s}-0" for s in strangers]
    known = data.draw(st.lists(st.sampled_from(sorted(advertised)), unique=True, max_size=2))
    with pytest.raises(UnknownDevices) as exc:
        allocate_share(resource, known + unknown, advertised)
    assert exc.value.ids == tuple(sorted(unknown))


real_ids = st.from_regex(r"GPU-[0-9a-f]{1,12}", fullmatch=True)


@given(st.lists(real_ids, min_size=1, max_size=8, unique=True), st.data())
def test_spot_allocate_refuses_every_unhealthy_and_only_those(ids: list[str], data: st.DataObject) -> None:
    healthy = {i: data.draw(st.booleans()) for i in ids}
    advertised = {format_spot_id(i): AdvertisedDevice(format_spot_id(i), h) for i, h in healthy.items()}
    owner = dict.fromkeys(ids, "nvidia.com/gpu")
    request = data.draw(st.lists(st.sampled_from(sorted(advertised)), unique=True, min_size=1))
    bad = sorted(r for r in request if not advertised[r].healthy)
    if bad:
        with pytest.raises(DevicesRefused) as exc:
            allocate_spot("gpushare/spot-gpu", request, advertised, owner)
        assert exc.value.ids == tuple(bad)
    else:
        alloc = allocate_spot("gpushare/spot-gpu", request, advertised, owner)
        (value,) = alloc.annotations.values()
        parsed = codecs.parse_devices_ids(value)
        assert parsed.by_resource == (("nvidia.com/gpu", tuple(parse_spot_id(r) for r in request)),)


@given(st.lists(real_ids, min_size=1, max_size=8, unique=True), st.data())
def test_prefer_spot_puts_idle_first(ids: list[str], data: st.DataObject) -> None:
    available = [format_spot_id(i) for i in ids]
    lent = data.draw(st.lists(st.sampled_from(available), unique=True))
    size = data.draw(st.integers(min_value=1, max_value=len(available)))
    got = prefer_spot(available, [], size, lent)
    assert len(got) == size == len(set(got))
    idle = [i for i in available if i not in lent]
    assert got[: min(size, len(idle))] == sorted(idle)[: min(size, len(idle))]


@given(st.one_of(st.text(max_size=80), st.from_regex(r"[a-z]{1,5}/[a-z]{1,5}:.{0,3}(:.{0,10})?", fullmatch=True)))
def test_parse_static_shadow_total(text: str) -> None:
    try:
        shadow = parse_static_shadow(text)
    except InvalidShadow as exc:
        assert "shadow" in str(exc)
        return
    assert isinstance(shadow, ShadowSlots) and 2 <= shadow.spec <= 64
    assert issubclass(InvalidShadow, DevicePluginError)
