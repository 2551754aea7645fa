"""RuntimeView updates: immutable, indexed by pod ref and (pod, name); env never makes a holder."""

from __future__ import annotations

from gpushare import keys
from nri_plugin.model import (
    Bundle,
    ContainerInfo,
    DeviceNode,
    GpuPartRule,
    PodInfo,
    RuntimeView,
    build_runtime_view,
    parse_env,
    record_of,
)

VIS = GpuPartRule.of(("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"))
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


def test_lookup_by_kubelet_names_and_pod_removal() -> None:
    rec = _rec("c1", env=(("NVIDIA_VISIBLE_DEVICES", "GPU-a,GPU-b"), ("CUDA_VISIBLE_DEVICES", "0"), ("X", "1")))
    assert rec.bundle.env == (("NVIDIA_VISIBLE_DEVICES", "GPU-a,GPU-b"), ("CUDA_VISIBLE_DEVICES", "0"))
    view = RuntimeView().with_pod(POD).with_container(rec)
    assert view.container_of("ns", "pod", "main") == rec
    assert view.container_of("ns", "pod", "other") is None and view.container_of("ns", "nope", "main") is None
    gone = view.without_pod("p1")
    assert gone.pods == {} and gone.containers == {} and gone.container_of("ns", "pod", "main") is None
    assert gone.pod_by_ref("ns", "pod") is None


def test_a_visibility_variable_indexes_nothing() -> None:
    # A tenant's forged NVIDIA_VISIBLE_DEVICES must not make its container findable as a holder.
    view = RuntimeView().with_pod(POD).with_container(_rec("c", env=(("NVIDIA_VISIBLE_DEVICES", "GPU-a"),)))
    assert not hasattr(view, "holder_of")
    assert set(vars(view)) == {"pods", "containers", "_by_name", "_pod_by_ref"}


def test_bundle_merge_keeps_first_and_parse_env() -> None:
    a = Bundle((GPU,), (("V", "1"),))
    b = Bundle((DeviceNode("/dev/nvidia0", "c", 1, 1), DeviceNode("/dev/x", "c", 1, 2)), (("V", "2"), ("W", "3")))
    merged = a.merged(b)
    assert [d.major for d in merged.devices] == [195, 1] and merged.env == (("V", "1"), ("W", "3"))
    assert parse_env(["A=1", "B=x=y", "broken"]) == (("A", "1"), ("B", "x=y"))


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
