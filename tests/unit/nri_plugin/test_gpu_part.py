"""A container's GPU part: what travels to a target, and how the runtime is asked to apply it."""

from __future__ import annotations

import pytest

from gpushare import keys
from gpushare.cdi import CdiRegistry, Hook, Mount, parse_spec
from gpushare.config import load_config
from gpushare.errors import InstructionRefused
from nri_plugin import convert
from nri_plugin._pb import nri_pb2
from nri_plugin.decide import SamePod, decide, for_runtime
from nri_plugin.injector import Injector, takes_cdi_devices
from nri_plugin.model import Bundle, ContainerInfo, DeviceNode, GpuPartRule, PodInfo, build_runtime_view

KIND = "k8s.device-plugin.nvidia.com/gpu"
UUID = "GPU-3"
LIBCUDA = Mount("/usr/lib64/libcuda.so.1", "/drv/usr/lib64/libcuda.so.1", "bind", ("ro", "nosuid", "bind"))
LDCACHE = Hook("createContainer", "/tk/nvidia-cdi-hook", ("nvidia-cdi-hook", "update-ldcache"))
GPU3 = DeviceNode("/dev/nvidia3", "c", 195, 3)
CTL = DeviceNode("/dev/nvidiactl", "c", 195, 255)
DEVICE_LIST = Mount(f"/var/run/nvidia-container-devices/{UUID}", "/dev/null", "bind", ("rbind", "rprivate", "rw"))
SPEC = {
    "cdiVersion": "0.5.0",
    "kind": KIND,
    "containerEdits": {
        "env": ["NVIDIA_VISIBLE_DEVICES=void"],
        "deviceNodes": [{"path": "/dev/nvidiactl", "major": 195, "minor": 255}],
        "mounts": [{"hostPath": LIBCUDA.source, "containerPath": LIBCUDA.destination, "options": ["ro"]}],
        "hooks": [{"hookName": "createContainer", "path": LDCACHE.path, "args": list(LDCACHE.args)}],
    },
    "devices": [
        {"name": UUID, "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia3", "major": 195, "minor": 3}]}}
    ],
}
REGISTRY = CdiRegistry(parse_spec(SPEC, "spec"))
RULE = GpuPartRule.of(("NVIDIA_VISIBLE_DEVICES",), ("/var/run/nvidia-container-devices",), REGISTRY)
POD = PodInfo("p", "pod", "team", annotations={keys.POD_ANNOTATION_DEVICES_FROM_PREFIX + "dind": "main"})
TENANT_VOLUME = Mount("/data", "/var/lib/kubelet/pods/p/volumes/x", "bind", ("rbind",))
TENANT_HOOK = Hook("createContainer", "/usr/local/bin/other-plugin-hook")


def _main(**kw: object) -> ContainerInfo:
    base: dict[str, object] = {
        "env": (("NVIDIA_VISIBLE_DEVICES", "void"), ("TOKEN", "secret"), ("PATH", "/bin")),
        "devices": (GPU3, CTL),
        "mounts": (LIBCUDA, TENANT_VOLUME),
        "hooks": (LDCACHE, TENANT_HOOK),
    }
    base.update(kw)
    return ContainerInfo("c-main", "p", "main", **base)  # type: ignore[arg-type]


def _decide(main: ContainerInfo, target: ContainerInfo | None = None) -> Bundle:
    target = target or ContainerInfo("c-dind", "p", "dind")
    view = build_runtime_view([POD], [main], RULE)
    return decide(SamePod("main"), POD, target, view).adjustment


def test_the_gpu_part_is_what_cdi_and_the_vendor_gave_never_the_tenants() -> None:
    part = RULE.part_of(_main(mounts=(LIBCUDA, TENANT_VOLUME, DEVICE_LIST)))
    assert part.devices == (GPU3, CTL)
    assert part.env == (("NVIDIA_VISIBLE_DEVICES", "void"),)  # TOKEN and PATH stay the tenant's
    assert part.mounts == (LIBCUDA, DEVICE_LIST)
    assert part.hooks == (LDCACHE,)  # a hook no CDI spec makes is not the GPU's


def test_a_mount_is_the_gpus_only_with_the_specs_source_too() -> None:
    # The tenant mounting something else at the library's path does not make it the driver's.
    impostor = Mount(LIBCUDA.destination, "/home/me/libcuda.so.1", "bind", ("rbind",))
    assert RULE.part_of(_main(mounts=(impostor,))).mounts == ()


def test_the_target_gets_the_sources_cdi_edits_on_a_runtime_without_cdi_adjustments() -> None:
    added = for_runtime(_decide(_main()), REGISTRY, takes_cdi_devices=False)
    assert added == Bundle((GPU3, CTL), (("NVIDIA_VISIBLE_DEVICES", "void"),), (), (LIBCUDA,), (LDCACHE,), ())


def test_cdi_names_replace_the_edits_they_make_where_the_runtime_resolves_them() -> None:
    main = _main(cdi_devices=(f"{KIND}={UUID}",), mounts=(LIBCUDA, DEVICE_LIST))
    added = for_runtime(_decide(main), REGISTRY, takes_cdi_devices=True)
    # containerd applies the names' edits itself (and grants rwm): only what no name makes stays.
    assert added == Bundle(mounts=(DEVICE_LIST,), cdi_devices=(f"{KIND}={UUID}",))
    # The same source on containerd 1.7: no names, the edits as containerd applied them.
    assert for_runtime(_decide(main), REGISTRY, takes_cdi_devices=False).cdi_devices == ()


def test_a_cdi_annotation_goes_only_where_nothing_resolved_it() -> None:
    annotation = {"cdi.k8s.io/nvidia-device-plugin_x": f"{KIND}={UUID}"}
    resolved = for_runtime(_decide(_main(annotations=annotation)), REGISTRY, takes_cdi_devices=False)
    assert resolved.annotations == () and resolved.hooks == (LDCACHE,)
    # containerd without CDI left the annotation unresolved: a runtime in cdi mode may resolve it.
    unresolved = _main(annotations=annotation, devices=(), mounts=(), hooks=(), env=())
    assert for_runtime(_decide(unresolved), REGISTRY, takes_cdi_devices=False).annotations == tuple(annotation.items())
    # A name this node's specs do not know is never sent as a name.
    unknown = _main(cdi_devices=("vendor.com/gpu=9",))
    assert for_runtime(_decide(unknown), REGISTRY, takes_cdi_devices=True).cdi_devices == ()


def test_a_source_whose_runtime_adds_the_gpu_gives_its_request() -> None:
    # NVIDIA's runtime reads the device list at start: NRI sees no node yet, only the request.
    main = _main(
        devices=(),
        mounts=(DEVICE_LIST, TENANT_VOLUME),
        hooks=(),
        env=(("NVIDIA_VISIBLE_DEVICES", "/var/run/nvidia-container-devices"),),
    )
    added = for_runtime(_decide(main), REGISTRY, takes_cdi_devices=True)
    assert added == Bundle(
        env=(("NVIDIA_VISIBLE_DEVICES", "/var/run/nvidia-container-devices"),), mounts=(DEVICE_LIST,)
    )


def test_a_mount_is_never_replaced() -> None:
    target = ContainerInfo("c-dind", "p", "dind", mounts=(Mount(LIBCUDA.destination, "/other", "bind"),))
    with pytest.raises(InstructionRefused, match=r"already mounts /other at /usr/lib64/libcuda\.so\.1"):
        _decide(_main(), target)


def test_what_the_target_has_is_not_added_twice() -> None:
    target = ContainerInfo("c-dind", "p", "dind", mounts=(LIBCUDA,), hooks=(LDCACHE,))
    added = _decide(_main(), target)
    assert added.mounts == () and added.hooks == ()


@pytest.mark.parametrize(
    ("name", "version", "takes"),
    [
        ("containerd", "v2.4.2", True),
        ("containerd", "2.0.0", True),
        ("containerd", "v1.7.24", False),
        ("cri-o", "1.31", False),
        ("containerd", "", False),
    ],
)
def test_which_runtimes_take_cdi_names(name: str, version: str, takes: bool) -> None:
    assert takes_cdi_devices(name, version) is takes


def test_the_adjustment_carries_mounts_hooks_and_cdi_names_on_the_wire() -> None:
    bundle = Bundle(
        (GPU3,),
        (("A", "b"),),
        (),
        (LIBCUDA,),
        (Hook("createRuntime", "/x", (), ("E=1",), 5), LDCACHE),  # in OCI's stage order
        (f"{KIND}={UUID}",),
    )
    adj = convert.adjustment(bundle)
    assert [m.destination for m in adj.mounts] == [LIBCUDA.destination]
    assert [h.path for h in adj.hooks.create_container] == [LDCACHE.path]
    assert adj.hooks.create_runtime[0].timeout.value == 5
    assert [d.name for d in adj.CDI_devices] == [f"{KIND}={UUID}"]
    # Read back the way the plugin reads a container: the same part.
    ctr = nri_pb2.Container(id="c", mounts=adj.mounts, hooks=adj.hooks, CDI_devices=adj.CDI_devices)
    info = convert.container_info(ctr)
    assert info.mounts == (LIBCUDA,) and info.hooks == bundle.hooks and info.cdi_devices == bundle.cdi_devices


def test_a_started_shadow_main_is_reported_with_its_pid_and_pod_uid_and_nothing_else_is() -> None:
    started: list[tuple[str, str, int, str]] = []
    injector = Injector(
        load_config(None), on_shadow_started=lambda key, cid, pid, uid: started.append((key, cid, pid, uid))
    )
    shadow_pod = nri_pb2.PodSandbox(
        id="s", name="shadow-0", uid="u-1", namespace=keys.DEFAULT_NAMESPACE, labels={keys.LABEL_ROLE: keys.ROLE_SHADOW}
    )
    tenant = nri_pb2.PodSandbox(id="t", name="web", namespace="team", labels={keys.LABEL_ROLE: keys.ROLE_SHADOW})
    injector.post_start_container(shadow_pod, nri_pb2.Container(id="c1", name=keys.SHADOW_CONTAINER, pid=41))
    injector.post_start_container(shadow_pod, nri_pb2.Container(id="c2", name="sidecar", pid=42))
    injector.post_start_container(tenant, nri_pb2.Container(id="c3", name=keys.SHADOW_CONTAINER, pid=43))
    injector.post_start_container(shadow_pod, nri_pb2.Container(id="c4", name=keys.SHADOW_CONTAINER, pid=0))
    # After a restart, containerd's Synchronize replays the running shadow: it is noted too; a stopped
    # one is not (its pid may be another process's by now).
    running = nri_pb2.Container(id="c5", pod_sandbox_id="s", name="main", pid=44, state=nri_pb2.CONTAINER_RUNNING)
    stopped = nri_pb2.Container(id="c6", pod_sandbox_id="s", name="main", pid=45, state=nri_pb2.CONTAINER_STOPPED)
    injector.synchronize([shadow_pod], [running, stopped])
    key = f"{keys.DEFAULT_NAMESPACE}/shadow-0"
    assert started == [(key, "c1", 41, "u-1"), (key, "c5", 44, "u-1")]


def test_a_shadow_main_in_the_cache_is_reported_created_with_its_pod_uid() -> None:
    created: list[tuple[str, str]] = []
    injector = Injector(load_config(None), on_shadow_created=lambda key, uid: created.append((key, uid)))
    shadow_pod = nri_pb2.PodSandbox(
        id="s", name="shadow-0", uid="u-1", namespace=keys.DEFAULT_NAMESPACE, labels={keys.LABEL_ROLE: keys.ROLE_SHADOW}
    )
    tenant = nri_pb2.PodSandbox(id="t", name="web", uid="u-2", namespace="team")
    injector.create_container(tenant, nri_pb2.Container(id="c0", pod_sandbox_id="t", name=keys.SHADOW_CONTAINER))
    injector.create_container(shadow_pod, nri_pb2.Container(id="c1", pod_sandbox_id="s", name="sidecar"))
    injector.create_container(shadow_pod, nri_pb2.Container(id="c2", pod_sandbox_id="s", name=keys.SHADOW_CONTAINER))
    assert created == [(f"{keys.DEFAULT_NAMESPACE}/shadow-0", "u-1")]
