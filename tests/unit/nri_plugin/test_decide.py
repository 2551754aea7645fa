"""Table-driven tests of the pure decision code (design §5, §8). No sockets, threads or clock."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping

import pytest

from gpushare import keys
from gpushare.cdi import Mount
from gpushare.codecs import encode_devices_from, encode_devices_ids
from gpushare.errors import REFUSED_NOT_SHADOW, InstructionRefused
from nri_plugin.decide import (
    Decision,
    RealIds,
    SamePod,
    ShadowSource,
    decide,
    find_instruction,
    usable_devices,
)
from nri_plugin.model import (
    Bundle,
    ContainerInfo,
    DeviceNode,
    GpuPartRule,
    PodInfo,
    RuntimeView,
    build_runtime_view,
)
from nri_plugin.oracle import Holder

VIS = GpuPartRule.of(("NVIDIA_VISIBLE_DEVICES", "FAKE_VISIBLE_DEVICES"))
GPU0 = DeviceNode("/dev/nvidia0", "c", 195, 0, 0o666)
CTL = DeviceNode("/dev/nvidiactl", "c", 195, 255, 0o666)
GPU1 = DeviceNode("/dev/nvidia1", "c", 195, 1, 0o666)
LOOP = DeviceNode("/dev/loop0", "b", 7, 0)
OUTSIDE = DeviceNode("/tmp/fakegpu", "c", 1, 3)
SNEAKY = DeviceNode("/dev/../etc/x", "c", 1, 3)

SHADOW = PodInfo("sp", "shadow-a", "gpushare-system", labels={keys.LABEL_ROLE: keys.ROLE_SHADOW})
NOT_SHADOW = PodInfo("np", "plain", "gpushare-system")
OWNER = PodInfo("op", "owner", "team")
VID0 = "gpushare-system/shadow-a-0"
VID1 = "gpushare-system/shadow-a-1"
SHADOW_MAIN = ContainerInfo(
    "c-shadow",
    "sp",
    "main",
    env=(("NVIDIA_VISIBLE_DEVICES", "GPU-1"),),
    devices=(GPU0, CTL),
    annotations={"cdi.k8s.io/nvidia": "nvidia.com/gpu=0", "other": "x"},
)
PLAIN_MAIN = ContainerInfo("c-plain", "np", "main", devices=(GPU0,))
OWNER_MAIN = ContainerInfo("c-owner", "op", "main", env=(("NVIDIA_VISIBLE_DEVICES", "GPU-9"),), devices=(GPU1,))


def node_view(*extra: tuple[PodInfo, ContainerInfo]) -> RuntimeView:
    pods = [SHADOW, NOT_SHADOW, OWNER] + [p for p, _ in extra]
    ctrs = [SHADOW_MAIN, PLAIN_MAIN, OWNER_MAIN] + [c for _, c in extra]
    return build_runtime_view(pods, ctrs, VIS)


def tenant(
    container_annotations: Mapping[str, str] | None = None,
    pod_annotations: Mapping[str, str] | None = None,
    name: str = "app",
    env: tuple[tuple[str, str], ...] = (),
) -> tuple[PodInfo, ContainerInfo]:
    pod = PodInfo("tp", "tenant", "team", annotations=dict(pod_annotations or {}))
    ctr = ContainerInfo("c-t-" + name, "tp", name, annotations=dict(container_annotations or {}), env=env)
    return pod, ctr


FROM_SHADOW = encode_devices_from("gpushare-system", "shadow-a", [VID0])
SHARE4 = keys.share_resource(keys.KIND_SHARE, 4)


# --- find_instruction -------------------------------------------------------------------------


def test_no_annotation_is_no_instruction() -> None:
    assert find_instruction(*tenant()) is None


@pytest.mark.parametrize(
    ("pod_value", "source"),
    [("main", "main"), ("_/_/main", "main"), ("  main ", "main")],
)
def test_same_pod_forms(pod_value: str, source: str) -> None:
    pod, ctr = tenant(pod_annotations={keys.POD_ANNOTATION_DEVICES_FROM_PREFIX + "app": pod_value})
    assert find_instruction(pod, ctr) == SamePod(source)


def test_pod_annotation_for_another_target_is_ignored_even_if_malformed() -> None:
    pod, ctr = tenant(pod_annotations={keys.POD_ANNOTATION_DEVICES_FROM_PREFIX + "other": "ns/pod/x"})
    assert find_instruction(pod, ctr) is None


@pytest.mark.parametrize(
    ("container_annotations", "pod_annotations", "needle"),
    [
        ({}, {keys.POD_ANNOTATION_DEVICES_FROM_PREFIX + "app": "other-ns/pod/main"}, "not a container of this pod"),
        ({}, {keys.POD_ANNOTATION_DEVICES_FROM_PREFIX + "app": "app"}, "names the container itself"),
        ({keys.ANNOTATION_DEVICES_FROM: "{not json"}, {}, "not valid JSON"),
        ({keys.ANNOTATION_DEVICES_FROM: "x" * (1 << 20)}, {}, "the limit is"),
        ({keys.ANNOTATION_DEVICES_IDS: '{"nvidia.com/gpu": []}'}, {}, "non-empty"),
        ({keys.ANNOTATION_DEVICES_FROM: FROM_SHADOW, keys.ANNOTATION_DEVICES_IDS: "{}"}, {}, "both"),
        (
            {keys.ANNOTATION_DEVICES_FROM: FROM_SHADOW},
            {keys.ANNOTATION_DEVICES_FROM: FROM_SHADOW},
            "also a pod annotation",
        ),
        (
            {keys.ANNOTATION_DEVICES_IDS: encode_devices_ids({"nvidia.com/gpu": ["GPU-9"]})},
            {keys.ANNOTATION_DEVICES_IDS: "anything"},
            "also a pod annotation",
        ),
    ],
)
def test_malformed_or_untrusted_instruction_is_refused(
    container_annotations: dict[str, str], pod_annotations: dict[str, str], needle: str
) -> None:
    pod, ctr = tenant(container_annotations, pod_annotations)
    with pytest.raises(InstructionRefused, match=needle) as err:
        find_instruction(pod, ctr)
    assert str(err.value).startswith("gpushare:")


def test_container_annotation_beats_pod_annotation() -> None:
    pod, ctr = tenant(
        {keys.ANNOTATION_DEVICES_FROM: FROM_SHADOW}, {keys.POD_ANNOTATION_DEVICES_FROM_PREFIX + "app": "main"}
    )
    assert isinstance(find_instruction(pod, ctr), ShadowSource)


def test_ids_instruction() -> None:
    pod, ctr = tenant({keys.ANNOTATION_DEVICES_IDS: encode_devices_ids({"nvidia.com/gpu": ["GPU-9"]})})
    instr = find_instruction(pod, ctr)
    assert isinstance(instr, RealIds)
    assert instr.spec.by_resource == (("nvidia.com/gpu", ("GPU-9",)),)


# --- same pod (DinD) --------------------------------------------------------------------------


def _same_pod(source_devices: tuple[DeviceNode, ...], target_env: tuple[tuple[str, str], ...] = ()) -> tuple:
    pod = PodInfo("dp", "dind-pod", "team", annotations={keys.POD_ANNOTATION_DEVICES_FROM_PREFIX + "dind": "main"})
    main = ContainerInfo(
        "c-main",
        "dp",
        "main",
        env=(("NVIDIA_VISIBLE_DEVICES", "0"), ("PATH", "/bin")),
        devices=source_devices,
        annotations={"cdi.k8s.io/x": "vendor.com/gpu=0"},
    )
    dind = ContainerInfo("c-dind", "dp", "dind", env=target_env)
    return pod, main, dind


def test_same_pod_injects_char_devices_env_and_cdi() -> None:
    pod, main, dind = _same_pod((GPU0, CTL))
    d = decide(SamePod("main"), pod, dind, node_view((pod, main)))
    assert d.source == "team/dind-pod/main"
    assert d.adjustment == Bundle(
        (GPU0, CTL), (("NVIDIA_VISIBLE_DEVICES", "0"),), (("cdi.k8s.io/x", "vendor.com/gpu=0"),)
    )
    assert d.skipped == ()


def test_same_pod_skips_block_and_outside_devices_but_injects_the_rest() -> None:
    pod, main, dind = _same_pod((LOOP, GPU0, OUTSIDE, SNEAKY))
    d = decide(SamePod("main"), pod, dind, node_view((pod, main)))
    assert d.adjustment.devices == (GPU0,)
    assert d.skipped == ("/dev/loop0 (block device)", "/tmp/fakegpu (not under /dev)", "/dev/../etc/x (not under /dev)")


@pytest.mark.parametrize(
    ("devices", "needle"),
    [
        ((), "holds no GPU: no character device under /dev, no visibility variable"),
        ((LOOP,), r"skipped: /dev/loop0 \(block device\)"),
        ((OUTSIDE,), r"skipped: /tmp/fakegpu \(not under /dev\)"),
    ],
)
def test_same_pod_source_without_usable_devices_is_refused(devices: tuple[DeviceNode, ...], needle: str) -> None:
    pod, main, dind = _same_pod(devices)
    # No variable or CDI name either: nothing says the source holds a GPU at all.
    main = dataclasses.replace(main, env=(("PATH", "/bin"),), annotations={})
    with pytest.raises(InstructionRefused, match=needle):
        decide(SamePod("main"), pod, dind, node_view((pod, main)))


def test_same_pod_source_not_created_yet_is_refused_with_retry_hint() -> None:
    pod, _, dind = _same_pod((GPU0,))
    with pytest.raises(InstructionRefused, match=r"not created yet.*kubelet retries"):
        decide(SamePod("main"), pod, dind, node_view())


def test_same_pod_never_reaches_into_another_pod() -> None:
    # "main" exists, but in the shadow pod: a pod annotation resolves only inside its own pod.
    pod, _, dind = _same_pod((GPU0,))
    with pytest.raises(InstructionRefused, match="not a created container of pod team/dind-pod"):
        decide(SamePod("main"), pod, dind, node_view())


def test_nothing_already_present_is_added_again_and_nothing_is_removed() -> None:
    pod, main, dind = _same_pod((GPU0,), target_env=(("NVIDIA_VISIBLE_DEVICES", "0"),))
    dind = ContainerInfo(dind.id, dind.pod_id, dind.name, env=dind.env, devices=(GPU0,))
    d = decide(SamePod("main"), pod, dind, node_view((pod, main)))
    assert d.adjustment.devices == () and d.adjustment.env == ()


def test_conflicting_device_at_same_path_is_refused() -> None:
    pod, main, dind = _same_pod((GPU0,))
    dind = ContainerInfo(dind.id, dind.pod_id, dind.name, devices=(DeviceNode("/dev/nvidia0", "c", 1, 3),))
    with pytest.raises(InstructionRefused, match="never replaces"):
        decide(SamePod("main"), pod, dind, node_view((pod, main)))


# --- cross-pod shadow source ------------------------------------------------------------------


def _shadow_instr(ids: list[str] = [VID0], source: str = "shadow-a") -> ShadowSource:  # noqa: B006
    pod, ctr = tenant({keys.ANNOTATION_DEVICES_FROM: encode_devices_from("gpushare-system", source, ids)})
    instr = find_instruction(pod, ctr)
    assert isinstance(instr, ShadowSource)
    return instr


def test_shadow_source_confirmed_by_podresources_is_injected() -> None:
    pod, ctr = tenant()
    d = decide(_shadow_instr(), pod, ctr, node_view(), allocated={SHARE4: frozenset({VID0})})
    assert d.source == "gpushare-system/shadow-a/main"
    assert d.adjustment.devices == (GPU0, CTL)
    assert d.adjustment.env == (("NVIDIA_VISIBLE_DEVICES", "GPU-1"),)
    assert d.adjustment.annotations == (("cdi.k8s.io/nvidia", "nvidia.com/gpu=0"),)


@pytest.mark.parametrize(
    ("instr_ids", "source", "allocated", "needle"),
    [
        ([VID0], "shadow-a", None, "no PodResources API is configured"),
        ([VID0], "shadow-a", {}, "does not confirm"),
        ([VID0], "shadow-a", {SHARE4: frozenset({VID1})}, "does not confirm"),
        ([VID0], "shadow-a", {SHARE4: frozenset({VID0, VID1})}, "holds exactly"),
        ([VID0], "shadow-a", {"nvidia.com/gpu": frozenset({VID0})}, "does not confirm"),
        (["gpushare-system/plain-0"], "plain", {SHARE4: frozenset({"gpushare-system/plain-0"})}, "is not a shadow"),
        (["gpushare-system/gone-0"], "gone", {SHARE4: frozenset({"gpushare-system/gone-0"})}, "not known on this node"),
    ],
)
def test_shadow_source_refusals(
    instr_ids: list[str], source: str, allocated: dict[str, frozenset[str]] | None, needle: str
) -> None:
    pod, ctr = tenant()
    with pytest.raises(InstructionRefused, match=needle):
        decide(_shadow_instr(instr_ids, source), pod, ctr, node_view(), allocated=allocated)


def test_a_pod_labelled_a_shadow_outside_the_shadows_namespace_is_no_source() -> None:
    # Any tenant can label its own pod a shadow; only the agent creates pods in gpushare-system.
    impostor = PodInfo("ip", "fake", "team", labels={keys.LABEL_ROLE: keys.ROLE_SHADOW})
    impostor_main = ContainerInfo("c-fake", "ip", "main", devices=(GPU1,))
    vids = ["team/fake-0"]
    pod, ctr = tenant({keys.ANNOTATION_DEVICES_FROM: encode_devices_from("team", "fake", vids)})
    instr = find_instruction(pod, ctr)
    assert isinstance(instr, ShadowSource)
    with pytest.raises(InstructionRefused, match="is not a shadow") as refused:
        decide(instr, pod, ctr, node_view((impostor, impostor_main)), allocated={SHARE4: frozenset(vids)})
    assert refused.value.reason == REFUSED_NOT_SHADOW


def test_shadow_pod_or_container_not_created_yet_is_retryable() -> None:
    pod, ctr = tenant()
    allocated = {SHARE4: frozenset({VID0})}
    with pytest.raises(InstructionRefused, match=r"not known on this node.*kubelet retries"):
        decide(_shadow_instr(), pod, ctr, RuntimeView(), allocated=allocated)
    # The pod is known (Synchronize, or another of its containers) but "main" is not created yet.
    view = build_runtime_view([SHADOW], [ContainerInfo("x", "sp", "sidecar", devices=(GPU0,))], VIS)
    with pytest.raises(InstructionRefused, match=r'container "main" .* not created yet'):
        decide(_shadow_instr(), pod, ctr, view, allocated=allocated)


# --- real IDs (spot) --------------------------------------------------------------------------


def _ids_instr(ids: dict[str, list[str]]) -> RealIds:
    pod, ctr = tenant({keys.ANNOTATION_DEVICES_IDS: encode_devices_ids(ids)})
    instr = find_instruction(pod, ctr)
    assert isinstance(instr, RealIds)
    return instr


NV = "nvidia.com/gpu"
FAKE = "example.com/gpu"
ACTIVE = {"GPU-9": None, "GPU-7": None, "fakegpu2": None}
SPOT9 = {keys.RESOURCE_SPOT_GPU: frozenset({"spot-GPU-9"})}
OWNER_HOLDS_9 = {"GPU-9": Holder("team", "owner", "main", frozenset({"GPU-9"}))}
KMSG = DeviceNode("/dev/kmsg", "c", 1, 11)
MEM = DeviceNode("/dev/mem", "c", 1, 1)


def _fake(i: int) -> DeviceNode:
    return DeviceNode(f"/dev/fakegpu{i}", "c", 10, 229)


def _spot(instr: dict[str, list[str]], view: RuntimeView | None = None, **kw: object) -> tuple[Decision, str]:
    pod, ctr = tenant()
    kw.setdefault("lends", ACTIVE)
    ids = [i for v in instr.values() for i in v]
    kw.setdefault("allocated", {keys.RESOURCE_SPOT_GPU: frozenset(f"spot-{i}" for i in ids)})
    d = decide(_ids_instr(instr), pod, ctr, view or node_view(), **kw)  # type: ignore[arg-type]
    return d, pod.ref


def test_real_ids_take_the_gpu_nodes_of_the_container_kubelet_allocated_them_to() -> None:
    d, _ = _spot({NV: ["GPU-9"]}, holders=OWNER_HOLDS_9)
    assert d.source == "team/owner/main"
    assert d.adjustment.devices == (GPU1,)
    assert d.adjustment.env == (("NVIDIA_VISIBLE_DEVICES", "GPU-9"),)


def test_a_forged_visibility_variable_does_not_make_a_holder() -> None:
    # The thief's env names the lent GPU and it holds a node; kubelet lists nobody: refused.
    thief = ContainerInfo("c-thief", "tp2", "main", env=(("NVIDIA_VISIBLE_DEVICES", "GPU-7"),), devices=(GPU0,))
    view = node_view((PodInfo("tp2", "thief", "team-b"), thief))
    with pytest.raises(InstructionRefused, match=r"kubelet lists no container on this node holding nvidia\.com/gpu"):
        _spot({NV: ["GPU-7"]}, view)
    # And with a real holder, the thief created after it is still not used.
    d, _ = _spot({NV: ["GPU-9"]}, node_view((PodInfo("tp2", "thief", "team-b"), thief)), holders=OWNER_HOLDS_9)
    assert d.source == "team/owner/main" and d.adjustment.devices == (GPU1,)


def test_a_privileged_holders_other_devices_are_never_copied() -> None:
    owner = ContainerInfo(
        "c-big",
        "bp",
        "main",
        env=(("FAKE_VISIBLE_DEVICES", "fakegpu0,fakegpu1,fakegpu2,fakegpu3"),),
        devices=(KMSG, MEM, GPU0, *(_fake(i) for i in range(4))),
        annotations={"cdi.k8s.io/x": "example.com/gpu=all"},
    )
    view = node_view((PodInfo("bp", "big", "team"), owner))
    holder = Holder("team", "big", "main", frozenset(f"fakegpu{i}" for i in range(4)))
    d, _ = _spot({FAKE: ["fakegpu2"]}, view, holders={"fakegpu2": holder})
    assert d.adjustment.devices == (_fake(2),)
    assert d.adjustment.env == (("FAKE_VISIBLE_DEVICES", "fakegpu2"),)
    assert d.adjustment.annotations == ()  # names the holder's whole allocation


def test_a_privileged_nvidia_holder_is_refused_without_the_vendor_answer() -> None:
    owner = ContainerInfo("c-priv", "pp", "main", devices=(KMSG, MEM, GPU0, GPU1, CTL))
    view = node_view((PodInfo("pp", "priv", "team"), owner))
    holders = {"GPU-9": Holder("team", "priv", "main", frozenset({"GPU-9"}))}
    with pytest.raises(InstructionRefused, match="cannot tell which of team/priv/main's 2 NVIDIA"):
        _spot({NV: ["GPU-9"]}, view, holders=holders)


def test_the_vendor_answer_wins_and_is_filtered() -> None:
    vendor = Bundle((GPU1, LOOP), (("NVIDIA_VISIBLE_DEVICES", "GPU-7"),))
    d, _ = _spot({NV: ["GPU-7"]}, resolved={NV: vendor}, holders=OWNER_HOLDS_9)
    assert d.source == "vendor:nvidia.com/gpu"
    assert d.adjustment.devices == (GPU1,)
    assert d.skipped == ("/dev/loop0 (block device)",)
    # NVIDIA's envvar strategy: the variable alone, the runtime hook adds the nodes.
    d, _ = _spot({NV: ["GPU-7"]}, resolved={NV: Bundle((), (("NVIDIA_VISIBLE_DEVICES", "GPU-7"),))})
    assert d.adjustment.env == (("NVIDIA_VISIBLE_DEVICES", "GPU-7"),) and d.adjustment.devices == ()
    with pytest.raises(InstructionRefused, match=r"Allocate answer .* gives no usable"):
        _spot({NV: ["GPU-7"]}, resolved={NV: Bundle((LOOP,))})


@pytest.mark.parametrize(
    ("ids", "allocated", "extra", "needle"),
    [
        (["GPU-9"], None, {}, "no PodResources"),
        (["GPU-9"], {}, {}, "does not confirm"),
        (["GPU-9"], {keys.RESOURCE_SPOT_GPU: frozenset({"spot-GPU-8"})}, {}, "does not confirm"),
        (["GPU-7"], {keys.RESOURCE_SPOT_GPU: frozenset({"spot-GPU-7"})}, {}, "kubelet lists no container"),
        (["GPU-9"], SPOT9, {"lends": None}, "no lend state"),
        (["GPU-9"], SPOT9, {"lends": {}}, "lend of GPU GPU-9 to pod team/tenant ended: the agent has no record"),
        (
            ["GPU-9"],
            SPOT9,
            {"lends": {"GPU-9": "the pod was reclaimed"}, "holders": OWNER_HOLDS_9},
            "lend of GPU GPU-9 to pod team/tenant ended: the pod was reclaimed",
        ),
        (
            ["GPU-9"],
            SPOT9,
            {"holders": {"GPU-9": Holder("team", "gone", "main", frozenset({"GPU-9"}))}},
            "team/gone/main, which kubelet allocated .* is not a created container",
        ),
    ],
)
def test_real_ids_refusals(
    ids: list[str], allocated: dict[str, frozenset[str]] | None, extra: dict[str, object], needle: str
) -> None:
    pod, ctr = tenant()
    kw: dict[str, object] = {"lends": ACTIVE, **extra}
    with pytest.raises(InstructionRefused, match=needle):
        decide(_ids_instr({NV: ids}), pod, ctr, node_view(), allocated=allocated, **kw)  # type: ignore[arg-type]


# --- helpers ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("device", "ok"),
    [
        (GPU0, True),
        (DeviceNode("/dev/dri/card0", "c", 226, 0), True),
        (LOOP, False),
        (OUTSIDE, False),
        (SNEAKY, False),
        (DeviceNode("/dev/", "c", 1, 1), False),
        (DeviceNode("/dev//x", "c", 1, 1), False),
        (DeviceNode("/dev/x", "p", 0, 0), False),
        (DeviceNode("/dev/x", "c", -1, 0), False),
    ],
)
def test_usable_devices(device: DeviceNode, ok: bool) -> None:
    keep, skipped = usable_devices((device,))
    assert (keep == (device,)) is ok
    assert (len(skipped) == 1) is (not ok)


def test_refusal_message_names_the_annotation() -> None:
    pod, ctr = tenant({keys.ANNOTATION_DEVICES_FROM: json.dumps({"a/b/c": {"*": ["x"]}})})
    with pytest.raises(InstructionRefused) as err:
        find_instruction(pod, ctr)
    assert keys.ANNOTATION_DEVICES_FROM in str(err.value)


def test_two_gpus_from_two_owners_name_both_in_one_variable() -> None:
    owners = [
        (
            PodInfo(f"o{i}", f"owner{i}", "team"),
            ContainerInfo(
                f"c{i}", f"o{i}", "main", env=(("FAKE_VISIBLE_DEVICES", f"fakegpu{i}"),), devices=(_fake(i),)
            ),
        )
        for i in (1, 2)
    ]
    holders = {f"fakegpu{i}": Holder("team", f"owner{i}", "main", frozenset({f"fakegpu{i}"})) for i in (1, 2)}
    d, _ = _spot(
        {FAKE: ["fakegpu2", "fakegpu1"]},
        node_view(*owners),
        holders=holders,
        lends={"fakegpu1": None, "fakegpu2": None},
    )
    assert d.adjustment.devices == (_fake(2), _fake(1))
    assert d.adjustment.env == (("FAKE_VISIBLE_DEVICES", "fakegpu2,fakegpu1"),)
    assert d.source == "team/owner2/main,team/owner1/main"


def test_a_borrower_gets_only_the_lent_gpus_device_list_entry_from_another_tenants_owner() -> None:
    # NVIDIA's volume-mounts strategy under its runtime: the owner's entries name its GPUs. The owner's
    # tenant also mounted an entry "all" (a hostPath volume there); the runtime would read it for the
    # borrower too, and give it every GPU of the node. Only the lent GPU's entry travels.
    lists = "/var/run/nvidia-container-devices"
    entries = tuple(Mount(f"{lists}/{name}", "/dev/null", "bind", ("rbind",)) for name in ("GPU-9", "all", "GPU-8"))
    owner = dataclasses.replace(OWNER_MAIN, mounts=entries)
    rule = GpuPartRule.of(("NVIDIA_VISIBLE_DEVICES",), (lists,))
    view = build_runtime_view([OWNER], [owner], rule)
    d, _ = _spot({NV: ["GPU-9"]}, view, holders=OWNER_HOLDS_9, device_list_dirs=(lists,))
    assert d.adjustment.mounts == (entries[0],)
