"""The design's roles read from pods (shadows, sharers, spot pods), pools, and the mapping records."""

from __future__ import annotations

import pytest

from controller.core.model import (
    Pool,
    ShareKey,
    encode_owner_annotation,
    encode_users_annotation,
    parse_owner_annotation,
    parse_users_annotation,
)
from gpushare import keys
from gpushare.config import Config
from tests.unit.controller.podmaker import NODE, pod, shadow, sharer, snap


def test_one_bad_pod_is_skipped_and_listed_the_rest_still_count() -> None:
    bad = sharer("bad")
    bad["spec"]["containers"][0]["resources"]["requests"]["gpushare/share-gpu-4"] = "1.5"
    s = snap([bad, sharer("good")])
    assert [x.ref.name for x in s.sharers] == ["good"]
    assert len(s.problems) == 1 and "default/bad" in s.problems[0] and "1.5" in s.problems[0]
    assert "default/bad" not in s.pods


def test_shadow_needs_its_namespace_and_label_a_tenant_cannot_pose_as_one() -> None:
    fake = shadow("fake")
    fake["metadata"]["namespace"] = "tenant"
    s = snap([shadow("real"), fake])
    assert [x.ref.key for x in s.shadows] == ["gpushare-system/real"]


@pytest.mark.parametrize(
    ("labels", "requests", "needle"),
    [
        ({keys.LABEL_ROLE: keys.ROLE_SHADOW}, {"nvidia.com/gpu": 1}, "both labels are required"),
        (
            {keys.LABEL_ROLE: keys.ROLE_SHADOW, keys.LABEL_SHARE_SPEC: "²", keys.LABEL_SHARE_KIND: "share"},
            {"nvidia.com/gpu": 1},
            "both labels are required",
        ),
        (
            {keys.LABEL_ROLE: keys.ROLE_SHADOW, keys.LABEL_SHARE_SPEC: "4", keys.LABEL_SHARE_KIND: "share"},
            {"nvidia.com/gpu": 1, "amd.com/gpu": 1},
            "exactly one real GPU",
        ),
    ],
)
def test_malformed_shadow_is_a_problem_not_a_shadow(
    labels: dict[str, str], requests: dict[str, int], needle: str
) -> None:
    s = snap([pod("s", keys.DEFAULT_NAMESPACE, labels=labels, requests=requests)])
    assert s.shadows == () and needle in s.problems[0]


def test_shadow_key_users_and_running() -> None:
    users = {"default/a/app": ["gpushare-system/s-0"], "default/b/app": ["gpushare-system/s-1"]}
    s = snap([shadow("s", 4, kind=keys.KIND_SHARE_DEV, users=users, selector={"zone": "a"})]).shadows[0]
    assert s.key == ShareKey(Pool("nvidia.com/gpu", (("zone", "a"),)), keys.KIND_SHARE_DEV, 4)
    assert s.used_slots == 2 and s.is_running
    assert not snap([shadow("t", phase="Pending", node="")]).shadows[0].is_running
    assert not snap([shadow("u", deleting=True)]).shadows[0].is_running


@pytest.mark.parametrize(
    ("text", "spec"), [("4", 4), ("04", 4), ("1024", 1024), ("9999", 9999), ("0", None), ("٣", None), ("10000", None)]
)
def test_share_spec_label_reads_as_int_reads_it(text: str, spec: int | None) -> None:
    # Common specs are looked up, the rest parsed: both read as int() of a short ASCII number.
    labels = {keys.LABEL_ROLE: keys.ROLE_SHADOW, keys.LABEL_SHARE_SPEC: text, keys.LABEL_SHARE_KIND: "share"}
    s = snap([pod("s", keys.DEFAULT_NAMESPACE, labels=labels, requests={"nvidia.com/gpu": 1})])
    assert [x.key.spec for x in s.shadows] == ([] if spec is None else [spec])


def test_share_keys_order_hash_and_compare_by_pool_kind_spec() -> None:
    a, b = ShareKey(Pool("nvidia.com/gpu"), keys.KIND_SHARE, 4), ShareKey(Pool("nvidia.com/gpu"), keys.KIND_SHARE, 2)
    zoned = ShareKey(Pool("nvidia.com/gpu", (("zone", "a"),)), keys.KIND_SHARE, 2)
    assert sorted([zoned, a, b]) == [b, a, zoned]  # pool (resource, selector), then kind, then N
    assert a == ShareKey(Pool("nvidia.com/gpu", ()), keys.KIND_SHARE, 4) and hash(a) == hash(ShareKey(*a))
    assert {a: 1}[ShareKey(Pool("nvidia.com/gpu"), keys.KIND_SHARE, 4)] == 1
    assert str(zoned) == "nvidia.com/gpu{zone=a}/gpushare/share-gpu-2" and a.resource == "gpushare/share-gpu-4"


@pytest.mark.parametrize(
    ("kw", "pending", "holds"),
    [
        ({}, True, False),  # unscheduled: waiting for a slot
        ({"gated": True}, False, False),  # the scheduler will not try it yet
        ({"deleting": True}, False, False),
        ({"node": NODE, "phase": "Pending"}, False, True),  # bound, not started: holds its slot
        ({"node": NODE, "phase": "Running"}, False, True),
        ({"node": NODE, "phase": "Failed"}, False, False),  # rejected at admission: holds nothing
    ],
)
def test_pending_sharer_recognition(kw: dict[str, object], pending: bool, holds: bool) -> None:
    s = snap([sharer("p", **kw)]).sharers[0]  # type: ignore[arg-type]
    assert (s.is_pending, s.holds_slots) == (pending, holds)


def test_sharer_pool_default_annotation_and_selector() -> None:
    cfg = Config(node_name=NODE, real_resources=("nvidia.com/gpu", "amd.com/gpu"))
    plain = snap([sharer("a", 2)], cfg).sharers[0]
    assert plain.key == ShareKey(Pool("nvidia.com/gpu"), keys.KIND_SHARE, 2) and plain.quantity == 1
    amd = snap([sharer("b", annotations={keys.ANNOTATION_POOL_RESOURCE: "amd.com/gpu"}, selector={"m": "x"})], cfg)
    assert amd.sharers[0].key.pool == Pool("amd.com/gpu", (("m", "x"),))
    assert str(amd.sharers[0].key.pool) == "amd.com/gpu{m=x}"


def test_a_refused_mix_is_neither_sharer_nor_borrower_and_stays_in_the_snapshot() -> None:
    s = snap(
        [
            pod("two", requests={"gpushare/share-gpu-2": 1, "gpushare/share-gpu-4": 1}),
            pod("both", requests={keys.RESOURCE_SPOT_GPU: 1, "gpushare/share-gpu-4": 1}),
        ]
    )
    assert s.sharers == () and s.spot_pods == () and s.problems == ()
    assert [(p.ref.name, p.why.split(";")[0]) for p in s.refused] == [
        ("both", "gpushare: pod default/both asks for gpushare/spot-gpu and gpushare/share-gpu-4"),
        ("two", "gpushare: pod default/two asks for gpushare/share-gpu-2 and gpushare/share-gpu-4"),
    ]
    # Kept as pods: whatever kubelet gave them still counts as held until they are gone.
    assert {"default/two", "default/both"} <= set(s.pods)


def test_spot_pods_and_owners_are_told_apart() -> None:
    s = snap(
        [
            pod("spot", requests={keys.RESOURCE_SPOT_GPU: 1}, container_ids={"app": "c1"}),
            pod("owner", requests={"nvidia.com/gpu": 1}),
        ]
    )
    assert [p.ref.name for p in s.spot_pods] == ["spot"] and s.spot_pods[0].container_ids == ("c1",)
    assert set(s.pods) == {"default/spot", "default/owner"}


def test_mapping_annotations_round_trip_and_damage_reads_as_no_record() -> None:
    users = {"ns/p/c": ["gpushare-system/s-1", "gpushare-system/s-0"]}
    assert parse_users_annotation(encode_users_annotation(users)) == {
        "ns/p/c": ("gpushare-system/s-0", "gpushare-system/s-1")
    }
    owner = {"gpushare-system/s": "uid-1"}
    assert parse_owner_annotation(encode_owner_annotation(owner)) == owner
    for damaged in ("{", "[1]", '{"a": 3}', ""):
        assert parse_users_annotation(damaged) == {}
        assert parse_owner_annotation(damaged) == {}


def test_sidecars_slots_add_to_the_app_containers_and_an_init_containers_are_refused() -> None:
    def with_init(name: str, qty: int, *, sidecar: bool) -> dict[str, object]:
        raw = sharer("s", 4, qty=1)
        raw["spec"]["init_containers"] = [
            {
                "name": name,
                "image": "busybox",
                **({"restart_policy": "Always"} if sidecar else {}),
                "resources": {"limits": {"gpushare/share-gpu-4": str(qty)}},
            }
        ]
        return raw

    (s,) = snap([with_init("proxy", 1, sidecar=True)]).sharers
    assert s.quantity == 2  # a sidecar runs beside the app container
    refused = snap([with_init("warmup", 3, sidecar=False)])
    assert refused.sharers == () and 'init container "warmup"' in refused.refused[0].why
