from __future__ import annotations

import json

import pytest

from gpushare import keys
from gpushare.codecs import (
    ContainerRef,
    encode_devices_from,
    encode_devices_ids,
    parse_devices_from,
    parse_devices_ids,
    parse_same_pod_annotations,
)
from gpushare.errors import InstructionRefused


def test_devices_from_round_trip() -> None:
    text = encode_devices_from("gpushare-system", "shadow-abc", ["gpushare-system/shadow-abc-1"])
    assert text == '{"gpushare-system/shadow-abc/main":{"*":["gpushare-system/shadow-abc-1"]}}'
    parsed = parse_devices_from(text)
    assert parsed.source == ContainerRef("gpushare-system", "shadow-abc", "main")
    assert parsed.selector == "*"
    assert parsed.virtual_ids == ("gpushare-system/shadow-abc-1",)


@pytest.mark.parametrize(
    "value",
    [
        "{not json",
        "[]",
        "{}",
        '{"a/b/c": {"*": ["a/b-0"]}, "a/b/d": {"*": ["a/b-0"]}}',  # two sources
        '{"a/b": {"*": ["a/b-0"]}}',  # not ns/pod/container
        '{"a/b/c": ["a/b-0"]}',
        '{"a/b/c": {"*": []}}',
        '{"a/b/c": {"*": ["x/y-0"]}}',  # virtual ID of another pod
        '{"a/b/c": {"*": ["a/b-0", "a/b-0"]}}',
        '{"a/b/c": {"bad selector": ["a/b-0"]}}',
        '{"A/b/c": {"*": ["A/b-0"]}}',
        "x" * (1 << 20),
        '{"a/b/c": {"*": [1]}}',
    ],
)
def test_devices_from_garbage_is_refused(value: str) -> None:
    with pytest.raises(InstructionRefused) as err:
        parse_devices_from(value)
    assert keys.ANNOTATION_DEVICES_FROM in str(err.value) or "virtual device ID" in str(err.value)


def test_devices_ids_round_trip_and_refusals() -> None:
    text = encode_devices_ids({"nvidia.com/gpu": ["GPU-1", "GPU-0"]})
    assert json.loads(text) == {"nvidia.com/gpu": ["GPU-1", "GPU-0"]}
    assert parse_devices_ids(text).by_resource == (("nvidia.com/gpu", ("GPU-1", "GPU-0")),)
    for bad in ('{"gpushare/spot-gpu": ["a"]}', '{"nvidia.com/gpu": ["../x"]}', "{}", '{"nogpu": ["a"]}'):
        with pytest.raises(InstructionRefused):
            parse_devices_ids(bad)


def test_same_pod_forms() -> None:
    prefix = keys.POD_ANNOTATION_DEVICES_FROM_PREFIX
    found = parse_same_pod_annotations({prefix + "dind": "main", prefix + "side": "_/_/main", "other": "x"})
    assert found["dind"].source == "main" and found["side"].source == "main"


@pytest.mark.parametrize("value", ["other-ns/_/main", "_/other-pod/main", "a/b", "Main", "dind"])
def test_same_pod_refuses_other_pods(value: str) -> None:
    with pytest.raises(InstructionRefused):
        parse_same_pod_annotations({keys.POD_ANNOTATION_DEVICES_FROM_PREFIX + "dind": value})


def test_share_resource_names() -> None:
    assert keys.share_resource("share", 4) == "gpushare/share-gpu-4"
    assert keys.parse_share_resource("gpushare/share-dev-gpu-16") == ("share-dev", 16)
    assert keys.parse_share_resource("gpushare/share-gpu-0") is None
    assert keys.parse_share_resource("nvidia.com/gpu") is None
