"""RuntimeView updates: immutable, indexed by pod ref, (pod, name) and visible real-ID sets."""

from __future__ import annotations

from gpushare import keys
from nri_plugin.model import (
    Bundle,
    ContainerInfo,
    DeviceNode,
    PodInfo,
    RuntimeView,
    build_runtime_view,
    parse_env,
    record_of,
)

VIS = ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
POD = PodInfo("p1", "pod", "ns")
GPU = DeviceNode("/dev/nvidia0", "c", 195, 0)


def _rec(cid: str, name: str = "main", env: tuple[tuple[str, str], ...] = ()):  # type: ignore[no-untyped-def]
    return record_of(ContainerInfo(cid, "p1", name, env=env, devices=(GPU,)), VIS)


def test_updates_return_new_views_and_leave_the_old_untouched() -> None:
    empty = RuntimeView()
    one = empty.with_pod(POD).with_container(_rec("c1"))
    assert empty.pods == {} and empty.containers == {}
    assert one.pod_by_ref("ns", "pod") == POD
    assert one.container_named("p1", "main") is not None
    assert one.with_pod(POD) is one  # unchanged pod: no copy


def test_restarted_container_keeps_its_name_slot_when_the_old_one_is_removed() -> None:
    view = RuntimeView().with_pod(POD).with_container(_rec("old")).with_container(_rec("new"))
    view = view.without_container("old")
    rec = view.container_named("p1", "main")
    assert rec is not None and rec.container_id == "new"


def test_visible_id_index_and_pod_removal() -> None:
    rec = _rec("c1", env=(("NVIDIA_VISIBLE_DEVICES", "GPU-a,GPU-b"), ("CUDA_VISIBLE_DEVICES", "0"), ("X", "1")))
    assert rec.bundle.env == (("NVIDIA_VISIBLE_DEVICES", "GPU-a,GPU-b"), ("CUDA_VISIBLE_DEVICES", "0"))
    view = RuntimeView().with_pod(POD).with_container(rec)
    assert view.holder_of(frozenset({"GPU-a", "GPU-b"})) == rec
    assert view.holder_of(frozenset({"GPU-a"})) is None
    assert view.holder_of(frozenset({"0"})) == rec
    gone = view.without_pod("p1")
    assert gone.pods == {} and gone.containers == {} and gone.holder_of(frozenset({"0"})) is None
    assert gone.pod_by_ref("ns", "pod") is None


def test_all_and_none_name_no_device() -> None:
    assert _rec("c", env=(("NVIDIA_VISIBLE_DEVICES", "all"),)).visible_id_sets == ()
    assert _rec("c", env=(("NVIDIA_VISIBLE_DEVICES", "void"),)).visible_id_sets == ()


def test_bundle_merge_keeps_first_and_parse_env() -> None:
    a = Bundle((GPU,), (("V", "1"),))
    b = Bundle((DeviceNode("/dev/nvidia0", "c", 1, 1), DeviceNode("/dev/x", "c", 1, 2)), (("V", "2"), ("W", "3")))
    merged = a.merged(b)
    assert [d.major for d in merged.devices] == [195, 1] and merged.env == (("V", "1"), ("W", "3"))
    assert parse_env(["A=1", "B=x=y", "broken"]) == (("A", "1"), ("B", "x=y"))


def test_a_recipient_never_becomes_the_holder_of_real_ids() -> None:
    # The spot tier's case: the borrower was given the owner's NVIDIA_VISIBLE_DEVICES; removing the
    # borrower must leave the owner as the holder so the next borrower can be served.
    owner = _rec("owner", env=(("NVIDIA_VISIBLE_DEVICES", "fakegpu0"),))
    borrower = record_of(
        ContainerInfo("borrower", "p1", "job", env=(("NVIDIA_VISIBLE_DEVICES", "fakegpu0"),), devices=(GPU,)),
        VIS,
        recipient=True,
    )
    view = RuntimeView().with_pod(POD).with_container(owner).with_container(borrower)
    ids = frozenset({"fakegpu0"})
    assert view.holder_of(ids) is not None and view.holder_of(ids).container_id == "owner"  # type: ignore[union-attr]
    after = view.without_container("borrower")
    assert after.holder_of(ids) is not None and after.holder_of(ids).container_id == "owner"  # type: ignore[union-attr]


def test_removing_one_of_two_holders_keeps_the_other() -> None:
    env = (("NVIDIA_VISIBLE_DEVICES", "fakegpu0"),)
    view = RuntimeView().with_pod(POD).with_container(_rec("old", env=env)).with_container(_rec("new", env=env))
    ids = frozenset({"fakegpu0"})
    assert view.without_container("new").holder_of(ids).container_id == "old"  # type: ignore[union-attr]
    assert view.without_container("old").holder_of(ids).container_id == "new"  # type: ignore[union-attr]


def test_synchronize_marks_instruction_carriers_as_recipients() -> None:
    env = (("NVIDIA_VISIBLE_DEVICES", "fakegpu0"),)
    pod = PodInfo("p1", "pod", "ns", annotations={keys.POD_ANNOTATION_DEVICES_FROM_PREFIX + "dind": "main"})
    view = build_runtime_view(
        [pod],
        [
            ContainerInfo("m", "p1", "main", env=env, devices=(GPU,)),
            ContainerInfo("d", "p1", "dind", env=env, devices=(GPU,)),
            ContainerInfo("s", "p1", "spot", env=env, annotations={keys.ANNOTATION_DEVICES_IDS: "{}"}),
        ],
        VIS,
    )
    assert view.containers["d"].is_recipient and view.containers["s"].is_recipient
    assert not view.containers["m"].is_recipient
    assert view.holder_of(frozenset({"fakegpu0"})).container_id == "m"  # type: ignore[union-attr]
