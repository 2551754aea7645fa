"""NRI protobuf messages ↔ the plain data of ``nri_plugin.model`` (the only place that knows both)."""

from __future__ import annotations

from gpushare.cdi import Hook, Mount
from nri_plugin._pb import nri_pb2
from nri_plugin.model import Bundle, ContainerInfo, DeviceNode, PodInfo, parse_env

# NRI's Hooks fields by OCI's stage names, in OCI's order.
HOOK_FIELDS = (
    ("prestart", "prestart"),
    ("createRuntime", "create_runtime"),
    ("createContainer", "create_container"),
    ("startContainer", "start_container"),
    ("poststart", "poststart"),
    ("poststop", "poststop"),
)


def pod_info(pod: nri_pb2.PodSandbox) -> PodInfo:
    return PodInfo(
        id=pod.id,
        name=pod.name,
        namespace=pod.namespace,
        uid=pod.uid,
        labels=dict(pod.labels),
        annotations=dict(pod.annotations),
    )


def device(d: nri_pb2.LinuxDevice) -> DeviceNode:
    return DeviceNode(
        path=d.path,
        type=d.type,
        major=d.major,
        minor=d.minor,
        file_mode=d.file_mode.value if d.HasField("file_mode") else None,
        uid=d.uid.value if d.HasField("uid") else None,
        gid=d.gid.value if d.HasField("gid") else None,
    )


def mount(m: nri_pb2.Mount) -> Mount:
    return Mount(destination=m.destination, source=m.source, type=m.type, options=tuple(m.options))


def hooks(h: nri_pb2.Hooks) -> tuple[Hook, ...]:
    return tuple(
        Hook(
            stage=stage,
            path=x.path,
            args=tuple(x.args),
            env=tuple(x.env),
            timeout=x.timeout.value if x.HasField("timeout") else None,
        )
        for stage, name in HOOK_FIELDS
        for x in getattr(h, name)
    )


def container_info(ctr: nri_pb2.Container) -> ContainerInfo:
    return ContainerInfo(
        id=ctr.id,
        pod_id=ctr.pod_sandbox_id,
        name=ctr.name,
        annotations=dict(ctr.annotations),
        env=parse_env(ctr.env),
        devices=tuple(device(d) for d in ctr.linux.devices),
        mounts=tuple(mount(m) for m in ctr.mounts),
        hooks=hooks(ctr.hooks),
        cdi_devices=tuple(d.name for d in ctr.CDI_devices),
    )


def linux_device(d: DeviceNode) -> nri_pb2.LinuxDevice:
    out = nri_pb2.LinuxDevice(path=d.path, type=d.type, major=d.major, minor=d.minor)
    if d.file_mode is not None:
        out.file_mode.value = d.file_mode
    if d.uid is not None:
        out.uid.value = d.uid
    if d.gid is not None:
        out.gid.value = d.gid
    return out


def _hook(h: Hook) -> nri_pb2.Hook:
    out = nri_pb2.Hook(path=h.path, args=list(h.args), env=list(h.env))
    if h.timeout is not None:
        out.timeout.value = h.timeout
    return out


def adjustment(bundle: Bundle) -> nri_pb2.ContainerAdjustment:
    """A ContainerAdjustment that only adds (no '-' removal markers, ever)."""
    adj = nri_pb2.ContainerAdjustment()
    for d in bundle.devices:
        adj.linux.devices.append(linux_device(d))
    for key, value in bundle.env:
        adj.env.append(nri_pb2.KeyValue(key=key, value=value))
    for key, value in bundle.annotations:
        adj.annotations[key] = value
    for m in bundle.mounts:
        adj.mounts.append(nri_pb2.Mount(destination=m.destination, type=m.type, source=m.source, options=m.options))
    fields = dict(HOOK_FIELDS)
    for h in bundle.hooks:
        getattr(adj.hooks, fields[h.stage]).append(_hook(h))
    for name in bundle.cdi_devices:
        adj.CDI_devices.append(nri_pb2.CDIDevice(name=name))
    return adj


def with_adjustment(info: ContainerInfo, added: Bundle) -> ContainerInfo:
    """The container as it will be created: its own spec plus what we added."""
    env = dict(info.env)
    env.update(added.env)
    annotations = dict(info.annotations)
    annotations.update(added.annotations)
    return ContainerInfo(
        id=info.id,
        pod_id=info.pod_id,
        name=info.name,
        annotations=annotations,
        env=tuple(env.items()),
        devices=info.devices + added.devices,
        mounts=info.mounts + added.mounts,
        hooks=info.hooks + added.hooks,
        cdi_devices=info.cdi_devices + added.cdi_devices,
    )
