"""A small CRI (runtime.v1) client over gRPC, shaped like kubelet's calls, for the integration tiers.

Pods use host networking (no CNI) and an empty hostname (runc refuses a hostname without a private
UTS namespace), sit under the harness's private cgroup parent, and get RuntimeDefault seccomp marked
present with SetInParent (enum 0 is otherwise "unset"). Pod annotations go in
PodSandboxConfig.annotations and container annotations in ContainerConfig.annotations, exactly where
kubelet puts them, so they reach NRI as PodSandbox.annotations and Container.annotations
(docs/nri.md). CreateContainer repeats the sandbox config, as kubelet does. A device plugin's
Allocate answer goes where kubelet puts it: envs, devices, mounts (read-only as answered, private
propagation), annotations, and CDI device names in ``CDI_devices``; a pod may name a runtime handler
(what a RuntimeClass selects).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import grpc

from localcluster._pb import cri_api_pb2 as pb
from localcluster._pb import cri_api_pb2_grpc as pb_grpc
from localcluster.images import BUSYBOX_IMAGE

DEFAULT_TIMEOUT_S = 30.0


class CriError(RuntimeError):
    """A CRI call failed; `code` and `details` are the gRPC status containerd returned."""

    def __init__(self, method: str, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"CRI {method} failed: {code.name}: {details}")
        self.method = method
        self.code = code
        self.details = details


@dataclass(frozen=True)
class DeviceSpec:
    """A CRI device as kubelet passes it from a device plugin's Allocate."""

    container_path: str
    host_path: str
    permissions: str = "rw"


@dataclass(frozen=True)
class MountSpec:
    """A CRI bind mount as kubelet passes a device plugin's Allocate mount (propagation private)."""

    container_path: str
    host_path: str
    readonly: bool = False


@dataclass
class Pod:
    """What RunPodSandbox was given and returned; CreateContainer needs the config again."""

    id: str
    config: pb.PodSandboxConfig
    containers: dict[str, str] = field(default_factory=dict)  # name -> container id

    @property
    def namespace(self) -> str:
        return self.config.metadata.namespace

    @property
    def name(self) -> str:
        return self.config.metadata.name


@dataclass(frozen=True)
class ExecResult:
    exit_code: int
    stdout: str
    stderr: str


class CriClient:
    def __init__(self, address: str, *, cgroup_parent: str = "", timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self._channel = grpc.insecure_channel(
            f"unix://{address}", options=[("grpc.max_receive_message_length", 16 * 1024 * 1024)]
        )
        self._rt = pb_grpc.RuntimeServiceStub(self._channel)  # type: ignore[no-untyped-call]
        self._img = pb_grpc.ImageServiceStub(self._channel)  # type: ignore[no-untyped-call]
        self._cgroup_parent = cgroup_parent
        self._timeout_s = timeout_s

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> CriClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _call(self, method: str, request: object, timeout_s: float | None = None) -> object:
        service = self._img if method.startswith("Image") else self._rt
        try:
            return getattr(service, method)(request, timeout=timeout_s or self._timeout_s)
        except grpc.RpcError as exc:
            raise CriError(method, exc.code(), exc.details() or "") from exc

    # --- runtime ------------------------------------------------------------------------------
    def version(self, timeout_s: float | None = None) -> pb.VersionResponse:
        resp = self._call("Version", pb.VersionRequest(version="v1"), timeout_s)
        assert isinstance(resp, pb.VersionResponse)
        return resp

    def has_image(self, image: str) -> bool:
        """Whether the CRI image store knows `image` (it learns of `ctr import`s asynchronously)."""
        resp = self._call("ImageStatus", pb.ImageStatusRequest(image=pb.ImageSpec(image=image)))
        assert isinstance(resp, pb.ImageStatusResponse)
        return bool(resp.image.id)

    # --- pods ---------------------------------------------------------------------------------
    def pod_config(
        self,
        name: str,
        namespace: str = "default",
        *,
        uid: str | None = None,
        annotations: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> pb.PodSandboxConfig:
        uid = uid or str(uuid.uuid4())
        config = pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=name, namespace=namespace, uid=uid, attempt=0),
            hostname="",  # host network: a hostname would need a private UTS namespace
            labels={
                "io.kubernetes.pod.name": name,
                "io.kubernetes.pod.namespace": namespace,
                "io.kubernetes.pod.uid": uid,
                **(labels or {}),
            },
            annotations=dict(annotations or {}),
        )
        config.linux.cgroup_parent = self._cgroup_parent
        config.linux.security_context.namespace_options.network = pb.NODE
        config.linux.security_context.seccomp.SetInParent()  # RuntimeDefault == 0
        return config

    def run_pod(
        self,
        name: str,
        namespace: str = "default",
        *,
        uid: str | None = None,
        annotations: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        runtime_handler: str = "",
    ) -> Pod:
        """``runtime_handler``: a runtime of the containerd config by name (empty: its default), as
        kubelet passes a pod's RuntimeClass; every container of the pod runs on it."""
        config = self.pod_config(name, namespace, uid=uid, annotations=annotations, labels=labels)
        resp = self._call("RunPodSandbox", pb.RunPodSandboxRequest(config=config, runtime_handler=runtime_handler))
        assert isinstance(resp, pb.RunPodSandboxResponse)
        return Pod(resp.pod_sandbox_id, config)

    def stop_pod(self, pod_id: str) -> None:
        self._call("StopPodSandbox", pb.StopPodSandboxRequest(pod_sandbox_id=pod_id))

    def remove_pod(self, pod_id: str) -> None:
        """Stop and remove a pod with its containers (RemovePodSandbox needs it stopped first)."""
        self.stop_pod(pod_id)
        self._call("RemovePodSandbox", pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id))

    def list_pod_ids(self) -> list[str]:
        resp = self._call("ListPodSandbox", pb.ListPodSandboxRequest())
        assert isinstance(resp, pb.ListPodSandboxResponse)
        return [item.id for item in resp.items]

    # --- containers ---------------------------------------------------------------------------
    def container_config(
        self,
        name: str,
        *,
        command: Iterable[str] = ("sleep", "3600"),
        image: str = BUSYBOX_IMAGE,
        envs: Mapping[str, str] | None = None,
        devices: Iterable[DeviceSpec] = (),
        mounts: Iterable[MountSpec] = (),
        cdi_devices: Iterable[str] = (),
        annotations: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        pod: Pod | None = None,
        attempt: int = 0,
    ) -> pb.ContainerConfig:
        """`attempt` is kubelet's restart counter: the same name may be created again with a new one.
        `cdi_devices`: fully qualified CDI names (``vendor.com/class=name``) for the runtime to resolve."""
        config = pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name=name, attempt=attempt),
            image=pb.ImageSpec(image=image),
            command=list(command),
            envs=[pb.KeyValue(key=k, value=v) for k, v in (envs or {}).items()],
            devices=[
                pb.Device(container_path=d.container_path, host_path=d.host_path, permissions=d.permissions)
                for d in devices
            ],
            mounts=[
                pb.Mount(container_path=m.container_path, host_path=m.host_path, readonly=m.readonly) for m in mounts
            ],
            CDI_devices=[pb.CDIDevice(name=name) for name in cdi_devices],
            labels={"io.kubernetes.container.name": name, **(labels or {})},
            annotations=dict(annotations or {}),
        )
        if pod is not None:
            config.labels.update(
                {
                    "io.kubernetes.pod.name": pod.name,
                    "io.kubernetes.pod.namespace": pod.namespace,
                    "io.kubernetes.pod.uid": pod.config.metadata.uid,
                }
            )
        config.linux.security_context.seccomp.SetInParent()  # RuntimeDefault == 0
        return config

    def create_container(self, pod: Pod, name: str, **kwargs: object) -> str:
        """CreateContainer in `pod` (kwargs as container_config); returns the container id."""
        config = self.container_config(name, pod=pod, **kwargs)  # type: ignore[arg-type]
        resp = self._call(
            "CreateContainer",
            pb.CreateContainerRequest(pod_sandbox_id=pod.id, config=config, sandbox_config=pod.config),
        )
        assert isinstance(resp, pb.CreateContainerResponse)
        pod.containers[name] = resp.container_id
        return resp.container_id

    def start_container(self, container_id: str) -> None:
        self._call("StartContainer", pb.StartContainerRequest(container_id=container_id))

    def run_container(self, pod: Pod, name: str, **kwargs: object) -> str:
        """Create and start; returns the container id."""
        cid = self.create_container(pod, name, **kwargs)
        self.start_container(cid)
        return cid

    def stop_container(self, container_id: str, timeout_s: int = 0) -> None:
        self._call("StopContainer", pb.StopContainerRequest(container_id=container_id, timeout=timeout_s))

    def remove_container(self, container_id: str) -> None:
        self._call("RemoveContainer", pb.RemoveContainerRequest(container_id=container_id))

    def container_status(self, container_id: str) -> pb.ContainerStatus:
        resp = self._call("ContainerStatus", pb.ContainerStatusRequest(container_id=container_id))
        assert isinstance(resp, pb.ContainerStatusResponse)
        return resp.status

    def runtime_spec(self, container_id: str) -> dict[str, Any]:
        """The OCI spec containerd generated (after NRI adjustments), from verbose ContainerStatus."""
        resp = self._call("ContainerStatus", pb.ContainerStatusRequest(container_id=container_id, verbose=True))
        assert isinstance(resp, pb.ContainerStatusResponse)
        spec = json.loads(resp.info["info"])["runtimeSpec"]
        assert isinstance(spec, dict)
        return spec

    def exec_sync(self, container_id: str, cmd: Iterable[str], timeout_s: int = 10) -> ExecResult:
        resp = self._call(
            "ExecSync",
            pb.ExecSyncRequest(container_id=container_id, cmd=list(cmd), timeout=timeout_s),
            timeout_s=timeout_s + 5,
        )
        assert isinstance(resp, pb.ExecSyncResponse)
        return ExecResult(resp.exit_code, resp.stdout.decode(errors="replace"), resp.stderr.decode(errors="replace"))
