"""NVIDIA's stack on a fake GPU node, and the GPU part of an exclusive container next to gpushare's target.

The instrument of the "same GPU part" goal: a sharer, borrower or DinD target should get exactly
what an exclusive pod holding that GPU gets. ``NvidiaNode`` sets up what a GPU node has, all real
NVIDIA software on fakenvidia's driver root (docs/fakenvidia.md):

- the driver root of 8 GPUs, and its CDI spec written by ``nvidia-ctk cdi generate`` (toolkit
  v1.20.2, kind ``nvidia.com/gpu``), as an operator installs it;
- ``nvidia-device-plugin`` v0.17.4 in each ``--device-list-strategy``, asked through the kubelet
  protocol (``KubeletPeer``) to Allocate one GPU; the CDI strategies also leave the plugin's own spec
  (kind ``k8s.device-plugin.nvidia.com/gpu``, made by the toolkit v1.17.8 it vendors) in the CDI dir;
- ``nvidia-container-runtime`` v1.20.2 in ``cdi`` and ``jit-cdi`` mode, each behind a wrapper that
  points it at its own config (``NVIDIA_CTK_CONFIG_FILE_PATH``), offered to containerd as the
  runtime handlers ``nvidia-cdi`` and ``nvidia-jit-cdi`` (what a RuntimeClass selects).

``measure_all`` then runs, on one containerd, one pod per (strategy, runtime): ``main`` is created
from the Allocate answer the way kubelet turns it into a CRI CreateContainer (envs, mounts,
devices, annotations, CDI names in ``CDI_devices``), and ``dind`` asks for main's GPU through
gpushare's same-pod annotation, with the NRI plugin in-process as the agent runs it. Both are
started (containerd writes runc's bundle, and the runtime rewrites it, only at StartContainer) and
each one's GPU part is read from its bundle (tests/harness/gpu_part.py). The DinD target stands for
sharers too: the shadow's container is their source and the same bundle code copies it (docs/nri.md).

The runtimes: ``native-cdi`` is plain runc, with containerd resolving CDI itself (1.7.24:
``enable_cdi = true`` in the harness's config; 2.x: always on); the ``nvidia-*`` handlers run the
NVIDIA runtime on top of that, so containerd still resolves CDI names before the runtime sees the
spec. The runtime is told to take the device list from the device-list mounts too (its
``accept-nvidia-visible-devices-as-volume-mounts``, what the plugin's ``volume-mounts`` strategy is
for), and still takes it from the variable.

Making device nodes and mount namespaces needs root. Everything lives in private directories.
It lives with the nvidia tier rather than in tests/harness/worlds/ because it drives the tier's
kubelet stand-in and device-plugin runner; hack/nvidia/gpu_part_report.py imports it from here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from controller.io.podresources import PodResourcesClient
from controller.io.shadow_devices import ShadowDevices
from controller.io.vendor_allocate import VendorAllocateResolver
from deviceplugins._pb import api_pb2
from fakenvidia.driver_root import DriverRoot, build_driver_root
from fakenvidia.gpus import FakeGpus
from gpushare import keys
from gpushare.codecs import encode_devices_from, encode_devices_ids
from gpushare.config import load_config
from gpushare.ids import format_spot_id, virtual_ids_of
from localcluster.containerd import Containerd, ContainerdInstall
from localcluster.containerd_config import RUNC, Paths
from localcluster.cri import CriClient, CriError, DeviceSpec, MountSpec
from localcluster.lifecycle import Lifecycle
from localcluster.paths import NvidiaBinaries
from nri_plugin import Injector, convert
from nri_plugin._pb import nri_pb2
from nri_plugin.model import Bundle
from tests.harness.gpu_part import GpuPart, diff, gpu_part, read_bundle_part
from tests.harness.podresources_server import PodResourcesServer
from tests.integration.containerd.common import connected_stub
from tests.integration.kubelet_peer.peer import KubeletPeer
from tests.integration.nvidia.conftest import binary_env, nvidia_ctk_generate
from tests.integration.nvidia.device_plugin import RESOURCE, device_plugin

STRATEGIES = ("envvar", "volume-mounts", "cdi-annotations", "cdi-cri")
CDI_STRATEGIES = ("cdi-annotations", "cdi-cri")
NVIDIA_CTK_KIND = "nvidia.com/gpu"
PLUGIN_CDI_KIND = "k8s.device-plugin.nvidia.com/gpu"
GPU_COUNT = 8
# Not GPU 0: a part that names /dev/nvidia0 by habit rather than by allocation shows.
GPU_INDEX = 3
UUID_SEED = "nvidia-gpu-parts"
EXCLUSIVE, TARGET = "main", "dind"
# Generous: these bound waits on a loaded 2-core machine; nothing here is timed.
REGISTER_S = 60.0


@dataclass(frozen=True)
class Runtime:
    """How containerd runs a pod: ``handler`` is the CRI runtime handler ("" = the default runc)."""

    name: str
    handler: str
    mode: str | None  # nvidia-container-runtime's mode; None: plain runc
    # NVIDIA's hardened mode: accept-nvidia-visible-devices-envvar-when-unprivileged = false, so an
    # unprivileged container's NVIDIA_VISIBLE_DEVICES is ignored and only the device-list mounts count.
    hardened: bool = False


RUNTIMES = (
    Runtime("native-cdi", "", None),
    Runtime("runtime-cdi", "nvidia-cdi", "cdi"),
    Runtime("runtime-jit-cdi", "nvidia-jit-cdi", "jit-cdi"),
    Runtime("runtime-cdi-hardened", "nvidia-cdi-hardened", "cdi", hardened=True),
)

# What is not measured here, and why; the report prints it.
NOT_RUN = {
    "runtime legacy mode": "its prestart hook (nvidia-container-runtime-hook) does the work through "
    "nvidia-container-cli from libnvidia-container, which is C, not a Go module, and not built by make deps",
    "runtime csv mode": "Tegra (Jetson) only: mount lists from CSV files, no discrete GPU",
    "runtime auto mode": "toolkit 1.20 resolves auto to jit-cdi on this node (no nvidia-container-cli, not Tegra), "
    "which is measured",
    "containerd 1.7.24 with enable_cdi = false": "the harness's 1.7.24 config enables CDI (2.x cannot disable it): "
    "the CDI strategies would then reach only the runtime's cdi mode, through annotations",
    "device plugin --pass-device-specs, --device-id-strategy=index": "variants of the four strategies measured; "
    "not yet added",
}


@dataclass(frozen=True)
class Allocation:
    """The device plugin's Allocate answer for one container, as kubelet hands it to CRI."""

    strategy: str
    gpu_uuid: str
    envs: dict[str, str] = field(default_factory=dict)
    mounts: tuple[MountSpec, ...] = ()
    devices: tuple[DeviceSpec, ...] = ()
    annotations: dict[str, str] = field(default_factory=dict)
    cdi_devices: tuple[str, ...] = ()

    @classmethod
    def from_response(cls, strategy: str, gpu_uuid: str, resp: api_pb2.ContainerAllocateResponse) -> Allocation:
        # kubelet's device manager (GetDeviceRunContainerOptions) and kuberuntime: each field where
        # CRI has one; mounts keep read_only, with private propagation and no SELinux relabel.
        return cls(
            strategy=strategy,
            gpu_uuid=gpu_uuid,
            envs=dict(resp.envs),
            mounts=tuple(MountSpec(m.container_path, m.host_path, m.read_only) for m in resp.mounts),
            devices=tuple(DeviceSpec(d.container_path, d.host_path, d.permissions) for d in resp.devices),
            annotations=dict(resp.annotations),
            cdi_devices=tuple(d.name for d in resp.cdi_devices),
        )

    def container_kwargs(self) -> dict[str, Any]:
        """``CriClient.create_container`` keyword arguments for a container holding this allocation."""
        return {
            "envs": self.envs,
            "mounts": self.mounts,
            "devices": self.devices,
            "annotations": self.annotations,
            "cdi_devices": self.cdi_devices,
        }

    def lines(self) -> list[str]:
        out = [f"env {k}={v}" for k, v in sorted(self.envs.items())]
        out += [f"mount {m.container_path} <- {m.host_path}{' (ro)' if m.readonly else ''}" for m in self.mounts]
        out += [f"device {d.container_path} <- {d.host_path} ({d.permissions})" for d in self.devices]
        out += [f"annotation {k}: {v}" for k, v in sorted(self.annotations.items())]
        out += [f"CDI device {name}" for name in self.cdi_devices]
        return out


@dataclass(frozen=True)
class Measurement:
    """One combination on one containerd: the exclusive container's part and gpushare's target's."""

    containerd: str
    strategy: str
    runtime: str
    exclusive: GpuPart
    target: GpuPart | None  # None: gpushare refused to create the target
    refusal: str = ""
    # What the exclusive container sees of the hooks' work (hook_probe's output).
    exclusive_probe: str = ""
    # The exclusive container as containerd's NRI showed it to gpushare at its CreateContainer:
    # what a plugin can copy from it on this containerd (before any runtime's rewrite).
    source_view: GpuPart = field(default_factory=GpuPart)
    source_cdi_devices: tuple[str, ...] = ()
    # A sharer in another pod on the source as its shadow, and a spot borrower of the source's GPU
    # through the vendor plugin's own Allocate; None: refused, and why.
    sharer: GpuPart | None = None
    sharer_refusal: str = ""
    borrower: GpuPart | None = None
    borrower_refusal: str = ""
    # The character devices the running exclusive container (a shadow's main) has, as the agent reads
    # them from /proc when NRI says it started; None: NRI gave no pid.
    started_device_nodes: tuple[str, ...] | None = None

    def recipients(self) -> dict[str, tuple[GpuPart | None, str]]:
        """Each kind of recipient gpushare serves, with its part (None: refused) and the refusal."""
        return {
            "DinD target": (self.target, self.refusal),
            "sharer": (self.sharer, self.sharer_refusal),
            "spot borrower": (self.borrower, self.borrower_refusal),
        }

    @property
    def key(self) -> str:
        return f"{self.strategy} x {self.runtime}"

    def gap(self) -> list[str]:
        """diff(exclusive, target); a refused target is one line saying so."""
        if self.target is None:
            return [f"! target refused: {self.refusal}"]
        return diff(self.exclusive, self.target)

    @property
    def same(self) -> bool:
        return self.target is not None and self.target == self.exclusive


def hook_probe(lib_dir: str) -> list[str]:
    """A command showing what the CDI hooks did in a container: the link ``create-symlinks`` made
    for libcuda.so, the ld cache ``update-ldcache`` wrote and the folder it was told."""
    return [
        "sh",
        "-c",
        f"echo libcuda.so '->' $(readlink {lib_dir}/libcuda.so); "
        "test -s /etc/ld.so.cache && echo ld.so.cache written; "
        "cat /etc/ld.so.conf.d/*.conf 2>/dev/null | head -1",
    ]


class _Vendor:
    """The DeviceResolver of the strategy being measured (the plugin restarts per strategy)."""

    def __init__(self) -> None:
        self.resolver: VendorAllocateResolver | None = None
        self.registry: Any = None

    def resolve(self, resource: str, ids: tuple[str, ...]) -> Bundle | None:
        return self.resolver.resolve(resource, ids) if self.resolver is not None else None


@dataclass(frozen=True)
class _Lent:
    """The agent's lend state for the harness: the measured GPU is lent, to whoever holds spot-<it>."""

    gpu: str

    def lend_ended(self, real_id: str, namespace: str, pod: str, uid: str) -> str | None:
        return None if real_id == self.gpu else "not lent in this harness"


class SourceRecorder(Injector):
    """gpushare's Injector, unchanged, that also keeps each container as NRI delivered it.

    It reads the node's CDI specs from ``cdi_dir``, as the agent reads ``cdiSpecDirs``.
    """

    def __init__(self, cdi_dir: Path, pod_resources: str, lent: str) -> None:
        config = dataclasses.replace(load_config(None), cdi_spec_dirs=(str(cdi_dir),))
        self.vendor = _Vendor()
        self.shadow_devices = ShadowDevices()
        super().__init__(
            config,
            oracle=PodResourcesClient(pod_resources, ttl_s=0.0),
            resolver=self.vendor,
            lend_state=_Lent(lent),
            on_shadow_started=self.shadow_devices.note,
        )
        self.vendor.registry = lambda: self.gpu_parts.registry
        self.visibility_env = config.visibility_env
        self.seen: dict[tuple[str, str], nri_pb2.Container] = {}

    def serve_spot_from(self, plugin_dir: str, socket: str) -> None:
        """Spot borrowers get the GPU from this vendor socket's Allocate, as the agent's resolver asks it."""
        self.vendor.resolver = VendorAllocateResolver(
            plugin_dir,
            visibility_env=self.visibility_env,
            cdi_registry=self.vendor.registry,
            sockets={RESOURCE: socket},
            host_root="",
            timeout_s=10.0,  # generous on a loaded machine: nothing here is timed
        )

    def create_container(self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container) -> nri_pb2.ContainerAdjustment:
        copy = nri_pb2.Container()
        copy.CopyFrom(container)
        self.seen[(pod.id, container.name)] = copy
        return super().create_container(pod, container)

    def view(
        self, pod_id: str, name: str, *, driver_root: str, aliases: Mapping[str, str]
    ) -> tuple[GpuPart, tuple[str, ...]]:
        """The part of the container as NRI showed it, and the CDI device names it carried."""
        container = self.seen[(pod_id, name)]
        hooks: dict[str, list[dict[str, Any]]] = {}
        for hook in convert.hooks(container.hooks):
            hooks.setdefault(hook.stage, []).append({"path": hook.path, "args": list(hook.args)})
        cdi_devices = [d.name for d in container.CDI_devices]
        spec = {
            "process": {"env": list(container.env)},
            "mounts": [
                {"destination": m.destination, "type": m.type, "source": m.source, "options": list(m.options)}
                for m in container.mounts
            ],
            "linux": {
                "devices": [
                    {"path": d.path, "type": d.type, "major": d.major, "minor": d.minor}
                    for d in container.linux.devices
                ]
            },
            "hooks": hooks,
        }
        placeholders = {container.id: "<container-id>", **aliases}
        return gpu_part(spec, driver_root=driver_root, placeholders=placeholders), tuple(cdi_devices)


class NvidiaNode(Lifecycle):
    """A fake GPU node with NVIDIA's plugin answers and runtime configs, in a private directory."""

    def __init__(self, nvidia: NvidiaBinaries, *, root: DriverRoot | None = None, gpu_index: int = GPU_INDEX) -> None:
        """``root``: a driver root someone else made and removes (the tier's fixture); None: one of
        8 GPUs is made here, and removed with the rest."""
        self.nvidia = nvidia
        self.gpu_index = gpu_index
        self.base = Path(tempfile.mkdtemp(prefix="gs-nvparts-", dir="/tmp"))
        self.cdi_dir = self.base / "cdi"
        self._root = root
        self.gpu_uuid = ""
        self.allocations: dict[str, Allocation] = {}

    @property
    def root(self) -> DriverRoot:
        assert self._root is not None, "NvidiaNode not started"
        return self._root

    @property
    def container_lib_dir(self) -> str:
        """The root's library directory as a container sees it (the root's path less the root)."""
        return "/" + str(self.root.lib_dir.relative_to(self.root.path))

    def start(self) -> None:
        self.cdi_dir.mkdir(parents=True, exist_ok=True)
        if self._root is None:
            self._root = build_driver_root(self.base / "root", FakeGpus(count=GPU_COUNT, uuid_seed=UUID_SEED))
        spec = self._generate_cdi_spec()
        self.gpu_uuid = _uuid_of_index(spec, self.gpu_index)
        for strategy in STRATEGIES:
            self.allocations[strategy] = self._allocate(strategy)
        for runtime in RUNTIMES:
            if runtime.mode is not None:
                self._write_runtime(runtime)

    def close(self) -> None:
        shutil.rmtree(self.base, ignore_errors=True)

    def aliases(self) -> dict[str, str]:
        """Placeholders for what is only this node's paths, so parts print short and alike run to run."""
        return {str(self.root.path): "<driver-root>", str(self.nvidia.cdi_hook.parent): "<toolkit>"}

    def runtime_log(self, runtime: Runtime) -> Path:
        return self.base / f"{runtime.handler}.log"

    def containerd_config(self, install: ContainerdInstall, paths: Paths) -> str:
        """The runtime handlers, TOML to append to the harness's config (``Containerd(extra_config=)``)."""
        table = (
            'plugins."io.containerd.cri.v1.runtime".containerd.runtimes'
            if install.is_v2
            else 'plugins."io.containerd.grpc.v1.cri".containerd.runtimes'
        )
        out = []
        for runtime in RUNTIMES:
            if runtime.mode is None:
                continue
            # The shim runs BinaryName as it would runc, with runc's arguments; the NVIDIA runtime
            # edits the bundle's config.json and execs the runc named in its own config.
            out.append(f"""
[{table}.{runtime.handler}]
  runtime_type = "io.containerd.runc.v2"
  [{table}.{runtime.handler}.options]
    SystemdCgroup = false
    BinaryName = "{self.base / runtime.handler}"
    Root = "{paths.runc_root}"
""")
        return "".join(out)

    def containerd(self, install: ContainerdInstall) -> Containerd:
        """A private containerd (NRI on) with this node's runtime handlers and CDI specs."""
        base = Path(tempfile.mkdtemp(prefix="gs-cd-", dir="/tmp"))
        paths = Paths(base)
        # In place before containerd starts, so its CDI cache holds them from its first refresh.
        paths.cdi_dir.mkdir(parents=True)
        for spec in self.cdi_dir.iterdir():
            shutil.copy(spec, paths.cdi_dir / spec.name)
        return Containerd(install, nri=True, base_dir=base, extra_config=self.containerd_config(install, paths))

    # --- set-up ---------------------------------------------------------------------------------
    def _generate_cdi_spec(self) -> dict[str, Any]:
        out = self.cdi_dir / "nvidia.yaml"
        nvidia_ctk_generate(self.nvidia, self.root, out)
        spec = yaml.safe_load(out.read_text())
        assert isinstance(spec, dict)
        return spec

    def _allocate(self, strategy: str) -> Allocation:
        """One Allocate of this node's GPU from a plugin running just for it, as kubelet calls it."""
        with self.serving(strategy) as (peer, _):
            return Allocation.from_response(strategy, self.gpu_uuid, peer.allocate(RESOURCE, [self.gpu_uuid]))

    @contextlib.contextmanager
    def serving(self, strategy: str) -> Iterator[tuple[KubeletPeer, str]]:
        """The device plugin in ``strategy``, registered with a kubelet peer; yields it and its socket."""
        plugin_dir = tempfile.mkdtemp(prefix="gs-nvdp-", dir="/tmp")  # short: a socket path fits 107 bytes
        peer = KubeletPeer(plugin_dir)
        peer.start()
        try:
            # The plugin's platform check dlopens plain libnvidia-ml.so.1, and its CDI strategies need
            # it to say "NVML" (docs/fakenvidia.md), so the root's library directory is on the path.
            env = binary_env(LD_LIBRARY_PATH=str(self.root.lib_dir))
            flags = [
                f"--device-list-strategy={strategy}",
                f"--nvidia-cdi-hook-path={self.nvidia.cdi_hook}",
            ]
            with device_plugin(
                self.nvidia,
                self.root,
                plugin_dir,
                self.base / f"device-plugin-{strategy}.log",
                *flags,
                env=env,
                cdi_dir=str(self.cdi_dir),
            ) as plugin:
                deadline = time.monotonic() + REGISTER_S
                while not peer.registered(RESOURCE):
                    if plugin.proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"nvidia-device-plugin ({strategy}) did not register:\n{plugin.log_text()}")
                    time.sleep(0.05)
                peer.wait_devices(RESOURCE, lambda devices: self.gpu_uuid in dict(devices), timeout_s=REGISTER_S)
                yield peer, os.path.join(plugin_dir, peer.registered(RESOURCE)[-1].endpoint)
        finally:
            peer.stop()
            shutil.rmtree(plugin_dir, ignore_errors=True)

    def _write_runtime(self, runtime: Runtime) -> None:
        """The runtime's config.toml (toolkit 1.20's keys, api/config/v1) and the wrapper naming it."""
        config = self.base / f"{runtime.handler}.toml"
        config.write_text(f"""accept-nvidia-visible-devices-as-volume-mounts = true
accept-nvidia-visible-devices-envvar-when-unprivileged = {"false" if runtime.hardened else "true"}

[nvidia-container-cli]
root = "{self.root.path}"

[nvidia-ctk]
path = "{self.nvidia.cdi_hook}"

[nvidia-container-runtime]
debug = "{self.runtime_log(runtime)}"
log-level = "debug"
mode = "{runtime.mode}"
runtimes = ["{RUNC}"]

[nvidia-container-runtime.modes.cdi]
annotation-prefixes = ["cdi.k8s.io/"]
default-kind = "{NVIDIA_CTK_KIND}"
spec-dirs = ["{self.cdi_dir}"]
""")
        wrapper = self.base / runtime.handler
        wrapper.write_text(
            f'#!/bin/sh\nNVIDIA_CTK_CONFIG_FILE_PATH="{config}" exec "{self.nvidia.container_runtime}" "$@"\n'
        )
        wrapper.chmod(0o755)


def measure_all(
    node: NvidiaNode,
    containerd: Containerd,
    combinations: list[tuple[str, Runtime]] | None = None,
) -> list[Measurement]:
    """Each (strategy, runtime) on ``containerd``, with gpushare's NRI plugin connected meanwhile.

    PodResources is a real gRPC server standing in for kubelet's (it says who holds what), and the
    device plugin runs in each strategy while its combinations are measured, so that a spot
    borrower's GPU comes from its real Allocate, as the agent asks it."""
    wanted = combinations or [(s, r) for s in STRATEGIES for r in RUNTIMES]
    out: list[Measurement] = []
    with PodResourcesServer() as server:
        injector = SourceRecorder(node.cdi_dir, server.socket, node.gpu_uuid)
        with (
            CriClient(containerd.address, cgroup_parent=containerd.cgroup_parent) as cri,
            connected_stub(containerd, injector),
        ):
            for strategy in dict.fromkeys(s for s, _ in wanted):
                with node.serving(strategy) as (peer, socket):
                    injector.serve_spot_from(peer.dir, socket)
                    for s, r in wanted:
                        if s == strategy:
                            out.append(measure(node, containerd, cri, injector, server, strategy=s, runtime=r))
    return out


def measure(
    node: NvidiaNode,
    containerd: Containerd,
    cri: CriClient,
    recorder: SourceRecorder,
    server: PodResourcesServer,
    *,
    strategy: str,
    runtime: Runtime,
) -> Measurement:
    """One shadow pod: ``main`` holding the GPU as kubelet would create it, ``dind`` asking gpushare for
    it in the same pod; a sharer pod on it as its shadow; a spot borrower of its GPU."""
    allocation = node.allocations[strategy]
    name = f"parts-{strategy}-{runtime.name}"
    pod = cri.run_pod(
        name,
        keys.DEFAULT_NAMESPACE,
        labels={keys.LABEL_ROLE: keys.ROLE_SHADOW, keys.LABEL_SHARE_SPEC: "4", keys.LABEL_SHARE_KIND: keys.KIND_SHARE},
        annotations={f"{keys.POD_ANNOTATION_DEVICES_FROM_PREFIX}{TARGET}": EXCLUSIVE},
        runtime_handler=runtime.handler,
    )
    others: list[str] = []
    try:
        main = cri.run_container(pod, EXCLUSIVE, **allocation.container_kwargs())
        exclusive = _read(node, containerd, main)
        started = _wait_started(recorder.shadow_devices, f"{keys.DEFAULT_NAMESPACE}/{name}")
        probe = cri.exec_sync(main, hook_probe(node.container_lib_dir)).stdout
        view, cdi_devices = recorder.view(pod.id, EXCLUSIVE, driver_root=str(node.root.path), aliases=node.aliases())
        target, refusal = _try(node, containerd, lambda: cri.run_container(pod, TARGET))

        vids = virtual_ids_of(keys.DEFAULT_NAMESPACE, name, 4)[:1]
        sharer_pod = cri.run_pod(f"sharer-{strategy}-{runtime.name}", "team-a", runtime_handler=runtime.handler)
        others.append(sharer_pod.id)
        server.allocate("team-a", sharer_pod.name, "app", keys.share_resource(keys.KIND_SHARE, 4), vids)
        sharer_from = {keys.ANNOTATION_DEVICES_FROM: encode_devices_from(keys.DEFAULT_NAMESPACE, name, vids, EXCLUSIVE)}
        sharer, sharer_refusal = _try(
            node, containerd, lambda: cri.run_container(sharer_pod, "app", annotations=sharer_from)
        )

        spot_pod = cri.run_pod(f"spot-{strategy}-{runtime.name}", "team-b", runtime_handler=runtime.handler)
        others.append(spot_pod.id)
        server.allocate("team-b", spot_pod.name, "job", keys.RESOURCE_SPOT_GPU, [format_spot_id(node.gpu_uuid)])
        spot_ids = {keys.ANNOTATION_DEVICES_IDS: encode_devices_ids({RESOURCE: [node.gpu_uuid]})}
        borrower, borrower_refusal = _try(
            node, containerd, lambda: cri.run_container(spot_pod, "job", annotations=spot_ids)
        )
        return Measurement(
            containerd.install.version,
            strategy,
            runtime.name,
            exclusive,
            target,
            refusal=refusal,
            exclusive_probe=probe,
            source_view=view,
            source_cdi_devices=cdi_devices,
            sharer=sharer,
            sharer_refusal=sharer_refusal,
            borrower=borrower,
            borrower_refusal=borrower_refusal,
            started_device_nodes=started,
        )
    finally:
        for pod_id in (*others, pod.id):
            cri.remove_pod(pod_id)


def _wait_started(seen: ShadowDevices, shadow: str, timeout_s: float = 10.0) -> tuple[str, ...] | None:
    """What the agent read of the shadow's running main (NRI's PostStartContainer may come a little after
    StartContainer returned)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (nodes := seen.observed().get(shadow)) is not None:
            return nodes
        time.sleep(0.02)
    return None


def _try(node: NvidiaNode, containerd: Containerd, create: Any) -> tuple[GpuPart | None, str]:
    """The created container's part, or None and gpushare's refusal."""
    try:
        return _read(node, containerd, create()), ""
    except CriError as exc:
        if "gpushare:" not in exc.details:
            raise
        return None, exc.details


def _read(node: NvidiaNode, containerd: Containerd, container_id: str) -> GpuPart:
    state = containerd.paths.state
    return read_bundle_part(state, container_id, driver_root=str(node.root.path), aliases=node.aliases())


def _uuid_of_index(spec: Mapping[str, Any], index: int) -> str:
    """The UUID of GPU ``index``, as nvidia-ctk's spec names it: the UUID-named device with its node."""
    node = f"/dev/nvidia{index}"
    for device in spec.get("devices") or []:
        nodes = [n.get("path") for n in device.get("containerEdits", {}).get("deviceNodes") or []]
        if str(device.get("name", "")).startswith("GPU-") and nodes == [node]:
            return str(device["name"])
    raise RuntimeError(f"nvidia-ctk's spec names no UUID device with just {node}: {json.dumps(spec)[:2000]}")
