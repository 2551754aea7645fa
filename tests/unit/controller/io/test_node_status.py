"""Publishing a leaving share count on the node: lowered at once, never raised, nothing else touched."""

from __future__ import annotations

from typing import Any

import pytest

from controller.io.node_status import lower_fields, patch_status

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
