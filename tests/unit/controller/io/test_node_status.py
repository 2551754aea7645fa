"""Publishing a share count on the node: lowered at once; raised only by the catch-up, to what kubelet holds."""

from __future__ import annotations

from typing import Any

import pytest

from controller.io.node_status import catch_up_fields, lower_fields, merged, patch_status

R = "gpushare/share-gpu-4"


class Call:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []

    def __call__(self, method: str, path: str, **kw: Any) -> tuple[int, Any]:
        self.calls.append((method, path, kw))
        return 200, {}


def test_the_count_is_lowered_in_capacity_and_allocatable_with_one_merge_patch() -> None:
    node = {"status": {"capacity": {R: "8", "cpu": "2"}, "allocatable": {R: "8", "cpu": "2"}}}
    lower, problems = lower_fields(node, {R: 4})
    assert problems == []
    call = Call()
    patch_status(call, "node-a", lower)
    assert call.calls == [
        (
            "PATCH",
            "/api/v1/nodes/node-a/status",
            {
                "body": {"status": {"capacity": {R: "4"}, "allocatable": {R: "4"}}},
                "content_type": "application/merge-patch+json",
            },
        )
    ]


@pytest.mark.parametrize(
    ("capacity", "allocatable"),
    [
        ({R: "4"}, {R: "4"}),  # already there
        ({R: "0"}, {R: "2"}),  # lower than asked: never raised (kubelet publishes a rise)
        ({}, {}),  # the resource is not on the node (yet)
        ({R: "1k"}, {R: "x"}),  # not a whole count: left to kubelet
    ],
)
def test_nothing_is_written_unless_the_node_shows_more(capacity: dict[str, str], allocatable: dict[str, str]) -> None:
    lower, _ = lower_fields({"status": {"capacity": capacity, "allocatable": allocatable}}, {R: 2})
    assert ("allocatable" in lower) == (allocatable.get(R, "").isdecimal() and int(allocatable[R]) > 2)
    assert R not in lower.get("capacity", {}) or int(capacity[R]) > 2


def test_lower_fields_names_what_it_cannot_read_and_patches_only_what_shows_more() -> None:
    node = {"status": {"capacity": {R: "8", "gpushare/share-gpu-2": "2"}, "allocatable": {R: "2k"}}}
    lower, problems = lower_fields(node, {R: 4, "gpushare/share-gpu-2": 1, "gpushare/share-gpu-8": 0})
    assert lower == {"capacity": {R: "4", "gpushare/share-gpu-2": "1"}}
    assert problems == [f"status.allocatable[{R}] is '2k', not a whole count"]
    assert lower_fields({"metadata": {}}, {R: 4}) == ({}, ["the Node has no status"])
    assert lower_fields(None, {R: 4}) == ({}, ["the Node has no status"])
    assert lower_fields({}, {}) == ({}, [])


@pytest.mark.parametrize(
    ("capacity", "allocatable", "count", "patch"),
    [
        (None, None, 4, {"allocatable": {R: "4"}, "capacity": {R: "4"}}),  # not published yet
        ("0", "0", 4, {"allocatable": {R: "4"}, "capacity": {R: "4"}}),
        ("8", "4", 8, {"allocatable": {R: "8"}}),  # capacity also counts Unhealthy slots: left
        ("8", "8", 4, {}),  # never lowered here
        ("4", "4", 4, {}),
    ],
)
def test_a_catch_up_raises_allocatable_and_capacity_only_where_the_node_shows_less(
    capacity: str | None, allocatable: str | None, count: int, patch: dict[str, Any]
) -> None:
    def shown(value: str | None) -> dict[str, str]:
        return {"cpu": "2"} | ({R: value} if value is not None else {})

    node = {"status": {"capacity": shown(capacity), "allocatable": shown(allocatable)}}
    assert catch_up_fields(node, {R: count}) == (patch, [])


def test_a_catch_up_leaves_an_odd_quantity_alone_and_names_it() -> None:
    node = {"status": {"capacity": {R: "1k"}, "allocatable": {R: "2"}}}
    patch, problems = catch_up_fields(node, {R: 4})
    assert patch == {}
    assert problems == [f"status.capacity[{R}] is '1k', not a whole count"]
    assert catch_up_fields({}, {R: 4}) == ({}, ["the Node has no status"])


def test_merged_lays_a_patch_over_the_node_and_keeps_the_rest() -> None:
    node = {"metadata": {"name": "a"}, "status": {"capacity": {R: "0", "cpu": "2"}, "allocatable": {R: "0"}}}
    out = merged(node, {"allocatable": {R: "4"}})
    assert out["status"] == {"capacity": {R: "0", "cpu": "2"}, "allocatable": {R: "4"}}
    assert out["metadata"] == {"name": "a"}
    assert node["status"]["allocatable"] == {R: "0"}  # the original is not changed
