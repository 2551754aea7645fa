"""The snapshot memo: a pod is read again only when its uid or resourceVersion is new."""

from __future__ import annotations

from typing import Any

from controller.core.model import SnapshotMemo, build_snapshot
from controller.core.pod_memo import PodMemo, pod_stamp
from gpushare.config import Config
from tests.unit.controller.podmaker import NODE, shadow, sharer

CFG = Config(node_name=NODE)


def versioned(pod: dict[str, Any], version: str, *, camel: bool = True) -> dict[str, Any]:
    key = "resourceVersion" if camel else "resource_version"
    return {**pod, "metadata": {**pod["metadata"], key: version}}


def counting_reader() -> tuple[list[str], Any]:
    seen: list[str] = []

    def read(pod: Any) -> str:
        seen.append(pod["metadata"]["name"])
        return f"read {pod['metadata']['name']}@{pod['metadata'].get('resourceVersion')}"

    return seen, read


def test_only_pods_with_a_new_resource_version_are_read_again() -> None:
    memo: PodMemo[str] = PodMemo()
    seen, read = counting_reader()
    a, b = versioned(sharer("a"), "1"), versioned(sharer("b"), "1")
    assert memo.read_all([a, b], read, "ctx") == ["read a@1", "read b@1"]
    b2 = versioned(sharer("b"), "2")
    assert memo.read_all([a, b2], read, "ctx") == ["read a@1", "read b@2"]
    assert seen == ["a", "b", "b"] and (memo.reused, memo.read) == (1, 1)


def test_the_memo_keeps_only_the_latest_call() -> None:
    memo: PodMemo[str] = PodMemo()
    seen, read = counting_reader()
    a = versioned(sharer("a"), "1")
    memo.read_all([a], read, "ctx")
    memo.read_all([], read, "ctx")  # a is gone from the caches...
    memo.read_all([a], read, "ctx")  # ...so when it is back it is read again
    assert seen == ["a", "a"]


def test_pods_without_uid_or_version_are_always_read_and_a_new_context_reads_all() -> None:
    memo: PodMemo[str] = PodMemo()
    seen, read = counting_reader()
    plain, versioned_a = sharer("plain"), versioned(sharer("a"), "1")
    memo.read_all([plain, versioned_a], read, "ctx")
    memo.read_all([plain, versioned_a], read, "ctx")
    assert seen == ["plain", "a", "plain"]
    memo.read_all([plain, versioned_a], read, "other default pool")
    assert seen == ["plain", "a", "plain", "plain", "a"]


def test_pod_stamp_reads_both_spellings_and_refuses_partial_ids() -> None:
    assert pod_stamp(versioned(sharer("a"), "7")) == ("uid-default-a", "7")
    assert pod_stamp(versioned(sharer("a"), "7", camel=False)) == ("uid-default-a", "7")
    assert pod_stamp(sharer("a")) is None  # no resourceVersion
    assert pod_stamp(versioned(sharer("a"), "")) is None
    assert pod_stamp({"metadata": "x"}) is None and pod_stamp(["not", "a", "pod"]) is None


def test_a_snapshot_built_with_the_memo_equals_one_built_without() -> None:
    broken = versioned(sharer("broken"), "1")
    broken["spec"]["containers"][0]["resources"]["requests"]["gpushare/share-gpu-4"] = "1.5"
    pods = [
        versioned(shadow("s", users={"default/a/app": ["gpushare-system/s-0"]}), "3"),
        versioned(sharer("a", node=NODE, phase="Running"), "4"),
        versioned(sharer("p"), "5"),
        broken,
    ]
    memo = SnapshotMemo()
    first = build_snapshot(pods, CFG, memo=memo)
    assert first == build_snapshot(pods, CFG) and len(first.problems) == 1
    pods[2] = versioned(sharer("p", deleting=True), "6")  # one pod event
    again = build_snapshot(pods, CFG, memo=memo)
    assert again == build_snapshot(pods, CFG)
    assert (memo.reused, memo.read) == (3, 1)
    assert again.sharers[-1].facts.is_terminating
