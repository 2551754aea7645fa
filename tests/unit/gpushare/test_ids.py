"""The two device-ID formats our plugins advertise: virtual IDs and spot IDs, built and read in one place."""

from __future__ import annotations

import pytest

from gpushare.errors import InstructionRefused
from gpushare.ids import (
    VirtualId,
    format_spot_id,
    is_virtual_id,
    parse_spot_id,
    parse_virtual_id,
    parse_virtual_id_or_none,
    virtual_ids_of,
)


def test_virtual_ids() -> None:
    ids = virtual_ids_of("gpushare-system", "shadow-x-1", 3)
    assert ids == ["gpushare-system/shadow-x-1-0", "gpushare-system/shadow-x-1-1", "gpushare-system/shadow-x-1-2"]
    vid = parse_virtual_id(ids[2])
    assert (vid.namespace, vid.shadow, vid.index) == ("gpushare-system", "shadow-x-1", 2)
    for bad in ("nope", "ns/pod", "ns/pod-", "ns/pod-01", "/pod-1"):
        with pytest.raises(InstructionRefused):
            parse_virtual_id(bad)


@pytest.mark.parametrize("bad", ["nope", "ns/pod", "ns/pod-01", "Ns/pod-1", "ns/pod-1" + "0" * 400, 7, None])
def test_a_non_virtual_id_is_none_or_refused_with_one_message(bad: object) -> None:
    assert parse_virtual_id_or_none(bad) is None and not is_virtual_id(bad)
    with pytest.raises(InstructionRefused, match=r"is not a virtual device ID; expected <namespace>/<shadow-pod>"):
        parse_virtual_id(bad)


def test_the_index_is_after_the_last_dash() -> None:
    assert parse_virtual_id_or_none("ns/shadow-share-4-ab12-0-3") == VirtualId("ns", "shadow-share-4-ab12-0", 3)
    assert parse_virtual_id("ns/shadow-share-4-ab12-0-3").shadow_key == "ns/shadow-share-4-ab12-0"


def test_spot_ids_round_trip_and_other_ids_are_not_spot_ids() -> None:
    assert format_spot_id("GPU-0") == "spot-GPU-0"
    assert parse_spot_id(format_spot_id("GPU-0")) == "GPU-0"
    assert parse_spot_id(format_spot_id("spot-x")) == "spot-x"  # only the first prefix is the format's
    assert parse_spot_id("GPU-0") is None
    assert parse_spot_id("gpushare-system/shadow-1-0") is None
