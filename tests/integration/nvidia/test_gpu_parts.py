"""The GPU part of an exclusive pod's OCI spec on real containerd with NVIDIA's stack, and gpushare's gap to it.

For each device-plugin strategy and each way the node runs containers (tests/integration/nvidia/
gpu_parts.py: plain runc with containerd's own CDI, nvidia-container-runtime in cdi and jit-cdi
mode), on containerd 1.7.24 and 2.4.2, one pod holds GPU 3 as kubelet would create it from
nvidia-device-plugin v0.17.4's Allocate answer, and a DinD target asks gpushare for that GPU.

What the exclusive container gets is asserted as NVIDIA's stack should give it: GPU 3's node and the
control nodes and no other GPU's, the driver's libraries and tools mounted from the driver root, the
visibility variable, and the CDI hooks, which really ran under runc against the fake root.

What the target gets is asserted to be the same part, for the same GPU, in every combination; the
one exception is containerd 1.7.24, whose NRI cannot grant mknod (``m``) on a device it adds.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator

import pytest

from cli.doctor.diagnosis import ContainerdFact, Status, check_nvidia
from cli.doctor.nvidia_modes import nvidia_verdict
from cli.doctor.socket_probe import probe_kubelet, probe_nvidia_plugin
from controller.core.mapping import MappingCache
from controller.share.solver import unhealthy_shadows
from fakenvidia.driver_root import DRIVER_LIBRARIES, DRIVER_TOOLS, GSP_FIRMWARE, DriverRoot
from gpushare import keys
from gpushare.config import Config, load_config
from localcluster.containerd import VERSIONS, InstallMissing, find_install
from localcluster.cri import CriClient
from localcluster.paths import NvidiaBinaries
from tests.harness.gpu_part import DeviceRule, GpuPart, diff, sorted_rules
from tests.harness.podresources_server import PodResourcesServer
from tests.integration.nvidia.device_plugin import RESOURCE
from tests.integration.nvidia.gpu_parts import (
    CDI_STRATEGIES,
    GPU_INDEX,
    PLUGIN_CDI_KIND,
    RUNTIMES,
    STRATEGIES,
    Measurement,
    NvidiaNode,
    measure_all,
)
from tests.integration.nvidia.table import DOCS, TABLE_BEGIN, TABLE_END, render_table
from tests.unit.controller.podmaker import NODE, row, shadow, snap

pytestmark = pytest.mark.integration

COMBINATIONS = [(s, r.name) for s in STRATEGIES for r in RUNTIMES]
IDS = [f"{s}-{r}" for s, r in COMBINATIONS]
NVIDIA_MAJOR = 195
# Each kind of exclusive part, by what put the GPU into the spec:
NONE = "nothing"  # plain runc reads neither the variable nor the device-list mounts
PLUGIN_SPEC = "containerd, from the device plugin's CDI spec"  # every runtime: containerd resolves first
TOOLKIT = "nvidia-container-runtime, from toolkit 1.20.2's CDI edits"
# The plugin's spec comes from the toolkit v1.17.8 it vendors, with enable-cuda-compat disabled
# (its internal/cdi/cdi.go); the runtime's from 1.20.2, which adds the memory-limit, compat,
# device-node and application-profile hooks (tests/integration/nvidia/test_cdi_generate.py).
PLUGIN_SPEC_HOOKS = [
    "createContainer create-symlinks",
    "createContainer create-symlinks",
    "createContainer update-ldcache",
]
TOOLKIT_HOOKS = [
    "createRuntime apply-cuda-memory-limits",
    "createContainer create-symlinks",
    "createContainer create-symlinks",
    "createContainer enable-cuda-compat",
    "createContainer update-ldcache",
    "createContainer disable-device-node-modification",
    "createContainer update-application-profile",
]
DEVICE_LIST = "/var/run/nvidia-container-devices"


def source_of(strategy: str, runtime: str) -> str:
    if strategy in CDI_STRATEGIES:
        return PLUGIN_SPEC
    # The hardened mode ignores an unprivileged container's NVIDIA_VISIBLE_DEVICES: envvar gives nothing.
    if runtime == "native-cdi" or (runtime == "runtime-cdi-hardened" and strategy == "envvar"):
        return NONE
    return TOOLKIT


@pytest.fixture(scope="module")
def node(nvidia: NvidiaBinaries, driver_root: DriverRoot) -> Iterator[NvidiaNode]:
    with NvidiaNode(nvidia, root=driver_root) as started:
        yield started


_MEASURED: dict[str, dict[tuple[str, str], Measurement]] = {}
_RELEASES: dict[str, str] = {}  # install label ("2.x") -> the release containerd reports ("v2.4.2")


def _measure(node: NvidiaNode, version: str) -> dict[tuple[str, str], Measurement]:
    """Every combination on one containerd, measured once per run: each is one pod, so tests only read.

    A containerd that is not installed fails the tier (``make deps`` installs both), never skips it."""
    if version not in _MEASURED:
        try:
            install = find_install(version)
        except InstallMissing as exc:
            pytest.fail(str(exc))
        with node.containerd(install) as containerd:
            with CriClient(containerd.address) as cri:
                _RELEASES[version] = cri.version().runtime_version.removeprefix("v")
            _MEASURED[version] = {(m.strategy, m.runtime): m for m in measure_all(node, containerd)}
    return _MEASURED[version]


@pytest.fixture(scope="module", params=VERSIONS, ids=[f"containerd-{v}" for v in VERSIONS])
def measured(request: pytest.FixtureRequest, node: NvidiaNode) -> dict[tuple[str, str], Measurement]:
    return _measure(node, str(request.param))


def expected_target(m: Measurement) -> GpuPart:
    """The exclusive part, with the one difference NRI v0.6.1 forces on containerd 1.7.24: where the GPU came
    from containerd's CDI, gpushare copies the edits and NRI grants each node ``rw``, not ``rwm``."""
    if source_of(m.strategy, m.runtime) == PLUGIN_SPEC and m.containerd == "1.7.24":
        rw = sorted_rules(dataclasses.replace(r, access="rw") for r in m.exclusive.device_rules)
        return dataclasses.replace(m.exclusive, device_rules=rw)
    return m.exclusive


def gpu_nodes(root: DriverRoot, index: int) -> dict[str, tuple[int, int]]:
    """NVIDIA's numbers for one GPU's node and the control nodes every GPU container gets."""
    return {
        f"/dev/nvidia{index}": (NVIDIA_MAJOR, index),
        "/dev/nvidiactl": (NVIDIA_MAJOR, 255),
        "/dev/nvidia-modeset": (NVIDIA_MAJOR, 254),
        "/dev/nvidia-uvm": (root.uvm_major, 0),
        "/dev/nvidia-uvm-tools": (root.uvm_major, 1),
    }


def driver_mounts(node: NvidiaNode) -> set[str]:
    """Where the driver root's files land in a container: libraries, tools, firmware, persistenced."""
    version = node.root.gpus.driver_version
    lib_dir = node.container_lib_dir
    return {
        *(f"{lib_dir}/{lib.file_name(version)}" for lib in DRIVER_LIBRARIES),
        *(f"/usr/bin/{tool}" for tool in DRIVER_TOOLS),
        *(f"/lib/firmware/nvidia/{version}/{name}" for name in GSP_FIRMWARE),
        "/run/nvidia-persistenced/socket",
    }


def test_the_allocated_gpu_is_gpu_3_by_nvml(node: NvidiaNode, gpu_uuids: list[str]) -> None:
    # The node finds its GPU's UUID in nvidia-ctk's spec; NVML through its C ABI must agree, or
    # every "right node" below would be checked against the wrong GPU.
    assert node.gpu_index == GPU_INDEX
    assert node.gpu_uuid == gpu_uuids[GPU_INDEX]


def test_allocate_answers_per_strategy(node: NvidiaNode) -> None:
    uuid = node.gpu_uuid
    answers = node.allocations
    assert answers["envvar"].lines() == [f"env NVIDIA_VISIBLE_DEVICES={uuid}"]
    # The device list as a mount of /dev/null whose container path names the GPU.
    assert answers["volume-mounts"].lines() == [
        f"env NVIDIA_VISIBLE_DEVICES={DEVICE_LIST}",
        f"mount {DEVICE_LIST}/{uuid} <- /dev/null",
    ]
    [(key, value)] = answers["cdi-annotations"].annotations.items()
    assert key.startswith("cdi.k8s.io/nvidia-device-plugin_"), key  # a fresh response ID each Allocate
    assert value == f"{PLUGIN_CDI_KIND}={uuid}"
    assert answers["cdi-annotations"].lines() == [f"annotation {key}: {value}"]
    assert answers["cdi-cri"].lines() == [f"CDI device {PLUGIN_CDI_KIND}={uuid}"]
    # The CDI strategies left the plugin's own spec beside nvidia-ctk's, for containerd and the runtime.
    assert sorted(p.name for p in node.cdi_dir.iterdir()) == ["k8s.device-plugin.nvidia.com-gpu.json", "nvidia.yaml"]


@pytest.mark.parametrize(("strategy", "runtime"), COMBINATIONS, ids=IDS)
def test_exclusive_devices_are_the_allocated_gpu_and_the_control_nodes(
    measured: dict[tuple[str, str], Measurement], node: NvidiaNode, strategy: str, runtime: str
) -> None:
    part = measured[(strategy, runtime)].exclusive
    got = {d.path: (d.major, d.minor) for d in part.devices}
    if source_of(strategy, runtime) == NONE:
        assert got == {} and part.device_rules == (), part.lines()
        return
    want = gpu_nodes(node.root, GPU_INDEX)
    assert got == want, part.lines()
    assert all(d.type == "c" for d in part.devices)
    # Only GPU 3's node: no other GPU's, whatever its index.
    assert [p for p in got if p.removeprefix("/dev/nvidia").isdigit()] == [f"/dev/nvidia{GPU_INDEX}"]
    # The device cgroup lets it read, write and mknod exactly those nodes (cgroup v1 here).
    assert part.device_rules == sorted_rules(DeviceRule("c", ma, mi, "rwm") for ma, mi in want.values())


@pytest.mark.parametrize(("strategy", "runtime"), COMBINATIONS, ids=IDS)
def test_exclusive_mounts_the_driver_from_the_driver_root(
    measured: dict[tuple[str, str], Measurement], node: NvidiaNode, strategy: str, runtime: str
) -> None:
    part = measured[(strategy, runtime)].exclusive
    mounts = {m.destination: m for m in part.mounts}
    source = source_of(strategy, runtime)
    device_list = {f"{DEVICE_LIST}/{node.gpu_uuid}"} if strategy == "volume-mounts" else set()
    if source == NONE:
        assert set(mounts) == device_list, part.lines()
        return
    # The runtime's edits also cover NVIDIA_VISIBLE_DEVICES=void with a mount of /dev/null.
    void = {f"{DEVICE_LIST}/void"} if source == TOOLKIT else set()
    assert set(mounts) == driver_mounts(node) | device_list | void, part.lines()
    lib_dir = node.container_lib_dir
    version = node.root.gpus.driver_version
    for lib in ("libcuda", "libnvidia-ml"):
        mount = mounts[f"{lib_dir}/{lib}.so.{version}"]
        assert mount.source == f"<driver-root>{lib_dir}/{lib}.so.{version}"
        assert "ro" in mount.options and "nosuid" in mount.options
    for destination in driver_mounts(node):
        assert mounts[destination].source == f"<driver-root>{destination}"


@pytest.mark.parametrize(("strategy", "runtime"), COMBINATIONS, ids=IDS)
def test_exclusive_environment(
    measured: dict[tuple[str, str], Measurement], node: NvidiaNode, strategy: str, runtime: str
) -> None:
    part = measured[(strategy, runtime)].exclusive
    source = source_of(strategy, runtime)
    if source == NONE:
        # Nothing read the variable: it stays as the plugin set it.
        want = node.gpu_uuid if strategy == "envvar" else DEVICE_LIST
        assert dict(part.env) == {"NVIDIA_VISIBLE_DEVICES": want}
    elif source == PLUGIN_SPEC:
        # The CDI edits hide every GPU from anything that would look the variable up again.
        assert dict(part.env) == {"NVIDIA_VISIBLE_DEVICES": "void"}
    else:
        assert dict(part.env) == {"NVIDIA_VISIBLE_DEVICES": "void", "NVIDIA_CTK_LIBCUDA_DIR": node.container_lib_dir}


@pytest.mark.parametrize(("strategy", "runtime"), COMBINATIONS, ids=IDS)
def test_exclusive_hooks_are_nvidias_and_ran_against_the_driver_root(
    measured: dict[tuple[str, str], Measurement], node: NvidiaNode, strategy: str, runtime: str
) -> None:
    m = measured[(strategy, runtime)]
    part, source = m.exclusive, source_of(strategy, runtime)
    if source == NONE:
        assert part.hooks == ()
        assert "libcuda.so -> libcuda.so.1" not in m.exclusive_probe
        return
    assert part.hook_commands() == (PLUGIN_SPEC_HOOKS if source == PLUGIN_SPEC else TOOLKIT_HOOKS)
    assert {h.path for h in part.hooks} == {"<toolkit>/nvidia-cdi-hook"}
    if source == TOOLKIT:
        [limits] = [h for h in part.hooks if h.stage == "createRuntime"]
        assert limits.args[-2:] == ("--gpu-id", node.gpu_uuid)
    # runc ran them at creation: create-symlinks made the soname link, update-ldcache the ld cache.
    assert "libcuda.so -> libcuda.so.1" in m.exclusive_probe, m.exclusive_probe
    assert "ld.so.cache written" in m.exclusive_probe, m.exclusive_probe
    assert node.container_lib_dir in m.exclusive_probe, m.exclusive_probe


@pytest.mark.parametrize(("strategy", "runtime"), COMBINATIONS, ids=IDS)
def test_nri_shows_gpushare_the_source_before_the_runtime(
    measured: dict[tuple[str, str], Measurement], node: NvidiaNode, strategy: str, runtime: str
) -> None:
    """What a plugin could copy: containerd's CDI edits are in the NRI container on both versions, the
    runtime's are not there yet, and the CRI field's CDI names only from NRI v0.7 on (containerd 2.x)."""
    m = measured[(strategy, runtime)]
    if source_of(strategy, runtime) == PLUGIN_SPEC:
        # Everything of the part but the device-cgroup rules, which NRI's Container does not carry.
        want = dataclasses.replace(m.exclusive, device_rules=())
        assert m.source_view == want, "\n".join(diff(want, m.source_view))
    else:
        assert m.source_view.devices == () and m.source_view.hooks == ()
        asked = node.allocations[strategy].envs["NVIDIA_VISIBLE_DEVICES"]
        assert m.source_view.env == (("NVIDIA_VISIBLE_DEVICES", asked),)
    from_cri_field = strategy == "cdi-cri" and m.containerd != "1.7.24"
    assert m.source_cdi_devices == ((f"{PLUGIN_CDI_KIND}={node.gpu_uuid}",) if from_cri_field else ())


RECIPIENTS = ("DinD target", "sharer", "spot borrower")


@pytest.mark.parametrize("recipient", RECIPIENTS)
@pytest.mark.parametrize(("strategy", "runtime"), COMBINATIONS, ids=IDS)
def test_each_recipient_gets_the_exclusive_part(
    measured: dict[tuple[str, str], Measurement], strategy: str, runtime: str, recipient: str
) -> None:
    """A DinD target, a sharer and a spot borrower each get exactly the GPU part the exclusive container
    got, for the same GPU.

    Where containerd put the GPU into the source from CDI, containerd 2.x resolves the same CDI names
    for the recipient (gpushare's adjustment names them), so it also grants the same ``rwm`` rules;
    containerd 1.7.24's NRI v0.6.1 has no CDI names in an adjustment, so gpushare sends the edits
    and NRI grants each node ``rw``: the one difference, documented in docs/nvidia.md. Where the
    NVIDIA runtime adds the GPU at start, the recipient gets the same request (the visibility
    variable, the device-list mounts) and the runtime gives it the same GPU. The target copies its
    same-pod source, the sharer its shadow (the source, confirmed by PodResources), and the borrower
    gets the vendor plugin's own Allocate answer for the lent GPU, as the agent asks it."""
    m = measured[(strategy, runtime)]
    part, refusal = m.recipients()[recipient]
    assert part is not None, refusal
    expected = expected_target(m)
    assert part == expected, "\n".join(diff(expected, part))


def test_the_docs_table_is_what_this_tier_measured(node: NvidiaNode) -> None:
    """docs/nvidia.md's table is written from these measurements, and says what `gpushare doctor` says.

    Every measured combination must agree with ``nvidia_verdict`` (the doctor's words): whether the
    exclusive pod got a GPU, and whether the target got its part. ``GPUSHARE_UPDATE_DOCS=1`` rewrites
    the table; otherwise a table that differs from the measurements fails here."""
    measurements = [m for version in VERSIONS for m in _measure(node, version).values()]
    for m in measurements:
        verdict = nvidia_verdict(m.strategy, m.runtime, int(m.containerd.split(".")[0]))
        got_gpu = any(d.path == f"/dev/nvidia{GPU_INDEX}" for d in m.exclusive.devices)
        assert got_gpu == verdict.exclusive, f"{m.key}: the exclusive pod got a GPU: {got_gpu}; doctor says {verdict}"
        for recipient, (part, refusal) in m.recipients().items():
            same = part == expected_target(m)
            assert same == verdict.same, (
                f"{m.key}, {recipient}: {refusal or diff(m.exclusive, part)}; doctor: {verdict}"
            )
    table = render_table(measurements, _RELEASES)
    text = DOCS.read_text()
    begin, end = text.index(TABLE_BEGIN) + len(TABLE_BEGIN), text.index(TABLE_END)
    if os.environ.get("GPUSHARE_UPDATE_DOCS") == "1":
        DOCS.write_text(text[:begin] + "\n" + table + text[end:])
    else:
        assert text[begin:end].strip() == table.strip(), (
            "docs/nvidia.md's table is not what this tier measured; rerun with GPUSHARE_UPDATE_DOCS=1"
        )


def test_a_part_compares_equal_only_to_the_same_part(
    measured: dict[tuple[str, str], Measurement], node: NvidiaNode
) -> None:
    # The instrument itself, on real parts: equal where the edits are the same, and the diff names
    # each difference (here between the plugin's 1.17.8 edits and the runtime's 1.20.2 edits).
    native = measured[("cdi-cri", "native-cdi")].exclusive
    assert measured[("cdi-annotations", "native-cdi")].exclusive == native
    assert measured[("cdi-cri", "runtime-jit-cdi")].exclusive == native
    # nvidia-ctk's spec (cdi mode) and the runtime's own generation (jit-cdi) give the same part.
    toolkit = measured[("envvar", "runtime-jit-cdi")].exclusive
    assert measured[("envvar", "runtime-cdi")].exclusive == toolkit
    lines = diff(native, toolkit)
    assert f"+ env NVIDIA_CTK_LIBCUDA_DIR={node.container_lib_dir}" in lines
    limits = "+ hook createRuntime: <toolkit>/nvidia-cdi-hook apply-cuda-memory-limits"
    assert [line for line in lines if line.startswith(limits)] != [], lines
    assert diff(native, native) == [] and diff(GpuPart(), GpuPart()) == []


@pytest.mark.parametrize(("strategy", "runtime"), COMBINATIONS, ids=IDS)
def test_the_agent_sees_whether_the_stack_gave_the_shadow_its_gpu(
    measured: dict[tuple[str, str], Measurement], node: NvidiaNode, strategy: str, runtime: str
) -> None:
    """Where no container gets a GPU (the variable or device lists under plain runc), the agent sees it in
    the running shadow itself, and lists that shadow's share slots Unhealthy rather than hand out a GPU
    CUDA cannot open; everywhere else the shadow has its GPU's node and its slots are offered."""
    m = measured[(strategy, runtime)]
    assert m.started_device_nodes is not None, "NRI's PostStartContainer gave no pid for the shadow's main"
    gets_gpu = source_of(strategy, runtime) != NONE
    assert (f"/dev/nvidia{GPU_INDEX}" in m.started_device_nodes) == gets_gpu, m.started_device_nodes
    name = f"parts-{strategy}-{runtime}"
    cfg = Config(node_name=NODE, real_resources=(RESOURCE,))
    snapshot = snap([shadow(name, 4, resource=RESOURCE)], cfg)
    rows = [row(f"{keys.DEFAULT_NAMESPACE}/{name}", "main", RESOURCE, node.gpu_uuid)]
    mapping = MappingCache.rebuild(rows, snapshot.pods, cfg.real_resources)
    sick = unhealthy_shadows(
        snapshot.shadows, mapping, {}, {f"{keys.DEFAULT_NAMESPACE}/{name}": m.started_device_nodes}
    )
    assert (f"{keys.DEFAULT_NAMESPACE}/{name}" in sick) == (not gets_gpu), sick


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_the_doctor_reads_the_strategy_from_the_real_plugin(node: NvidiaNode, strategy: str) -> None:
    """`gpushare doctor` finds NVIDIA's plugin among kubelet's sockets by asking each to Allocate one of
    kubelet's allocatable GPUs, and reads the strategy from the real answer; with the runtime mode and
    containerd version it then says the table's row."""
    with node.serving(strategy) as (peer, socket):
        # kubelet's allocatable GPUs (PodResources), which the doctor reads instead of a ListAndWatch.
        listed = peer.wait_devices(RESOURCE, lambda devices: len(devices) > 0)
        with PodResourcesServer(allocatable=lambda: {RESOURCE: [i for i, _ in listed]}) as server:
            kubelet = probe_kubelet(peer.dir, server.socket)
        found = probe_nvidia_plugin(kubelet, load_config(None).device_list_dirs)
    assert found is not None and found.socket == socket
    assert (found.strategy, found.error) == (strategy, None)
    check = check_nvidia(found, ContainerdFact(version="2.4.2"))
    verdict = nvidia_verdict(strategy, "native-cdi", 2)
    assert check.status is (Status.OK if verdict.works else Status.FAIL), check
    assert verdict.how in check.summary
