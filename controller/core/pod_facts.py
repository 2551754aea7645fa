"""The facts every pod has, read from a plain pod dict: ``parse_pod(dict) -> PodFacts``.

The I/O layer hands in pods exactly as the kubernetes client returns them: either
``V1Pod.to_dict()`` (snake_case keys) or the raw API JSON (camelCase keys, from a watch
with ``_preload_content=False``). Both spellings are read, so neither side converts.
A field of the wrong shape raises ``InvalidObject`` naming the pod and the field; the roles
built on these facts live in ``controller.core.model``.
Pure module: stdlib and ``gpushare`` only (docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from controller.errors import InvalidObject
from gpushare import keys

PodKey = str  # "<namespace>/<name>"

PHASE_PENDING = "Pending"
PHASE_RUNNING = "Running"
_TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


def _get(d: Mapping[str, Any], snake: str, camel: str | None = None) -> Any:
    """Read a field under its to_dict() (snake_case) or API (camelCase) spelling."""
    value = d.get(snake)
    if value is None and camel is not None:
        value = d.get(camel)
    return value


def _obj(d: Mapping[str, Any], where: str, pod: str, snake: str, camel: str | None = None) -> Mapping[str, Any]:
    """A nested object; absent reads as empty, anything but an object is refused."""
    value = _get(d, snake, camel)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidObject(f"gpushare: pod {pod}: {where} must be an object, got {value!r:.80}")
    return value


def _objs(d: Mapping[str, Any], where: str, pod: str, snake: str, camel: str | None = None) -> list[Mapping[str, Any]]:
    """A list of objects; absent reads as empty."""
    value = _get(d, snake, camel)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
        raise InvalidObject(f"gpushare: pod {pod}: {where} must be a list of objects, got {value!r:.80}")
    return value


def _str_map(value: object, where: str, pod: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise InvalidObject(f"gpushare: pod {pod}: {where} must map strings to strings, got {value!r:.120}")
    return dict(value)


def _quantity(value: object, resource: str, pod: str) -> int:
    """Extended resources are integers (the API server refuses fractions); anything else is refused."""
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and value.strip().isdigit():
        number = int(value.strip())
    else:
        raise InvalidObject(f"gpushare: pod {pod}: {resource} quantity {value!r:.40} is not a whole number")
    return number


@dataclass(frozen=True, order=True)
class PodRef:
    """A pod by name and uid; the uid tells a re-created pod of the same name apart."""

    namespace: str
    name: str
    uid: str

    @property
    def key(self) -> PodKey:
        return f"{self.namespace}/{self.name}"

    def __str__(self) -> str:
        return self.key


@dataclass(frozen=True)
class ContainerFacts:
    name: str
    # Extended-resource requests of this container (limits when requests are absent:
    # the API defaults requests to limits for extended resources).
    resources: tuple[tuple[str, int], ...]
    container_id: str  # runtime ID without the "containerd://" scheme; "" before it starts

    def quantity(self, resource: str) -> int:
        return sum(q for r, q in self.resources if r == resource)


@dataclass(frozen=True)
class PodFacts:
    ref: PodRef
    node_name: str  # "" while unscheduled
    phase: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    node_selector: tuple[tuple[str, str], ...]
    containers: tuple[ContainerFacts, ...]  # app containers, then init containers
    is_terminating: bool  # deletionTimestamp set: the API accepted a delete
    is_gated: bool  # schedulingGates present: the scheduler will not try it yet

    @property
    def is_terminal(self) -> bool:
        return self.phase in _TERMINAL_PHASES

    @property
    def is_alive(self) -> bool:
        """Neither finished nor being deleted."""
        return not self.is_terminal and not self.is_terminating

    @property
    def is_unscheduled(self) -> bool:
        return not self.node_name and self.phase == PHASE_PENDING

    def quantity(self, resource: str) -> int:
        return sum(c.quantity(resource) for c in self.containers)

    def resources(self) -> set[str]:
        return {r for c in self.containers for r, _ in c.resources}


def _containers(spec: Mapping[str, Any], status: Mapping[str, Any], pod: str) -> tuple[ContainerFacts, ...]:
    ids: dict[str, str] = {}
    for field_snake, field_camel in (
        ("container_statuses", "containerStatuses"),
        ("init_container_statuses", "initContainerStatuses"),
    ):
        for st in _objs(status, f"status.{field_camel}", pod, field_snake, field_camel):
            cid = _get(st, "container_id", "containerID") or ""
            name = _get(st, "name")
            if isinstance(name, str) and isinstance(cid, str):
                ids[name] = cid.split("://", 1)[-1]
    out: list[ContainerFacts] = []
    for field_snake, field_camel in (("containers", "containers"), ("init_containers", "initContainers")):
        for c in _objs(spec, f"spec.{field_camel}", pod, field_snake, field_camel):
            name = _get(c, "name")
            if not isinstance(name, str) or not name:
                raise InvalidObject(f"gpushare: pod {pod}: a container has no name")
            res = _obj(c, f"container {name} resources", pod, "resources")
            requests = _obj(res, f"container {name} resources.requests", pod, "requests")
            limits = _obj(res, f"container {name} resources.limits", pod, "limits")
            merged = {**limits, **requests}
            if not all(isinstance(r, str) for r in merged):
                raise InvalidObject(f"gpushare: pod {pod}: container {name} names a resource that is not a string")
            # Only device resources matter here: ours and the vendors'; cpu and memory are skipped.
            wanted = tuple(
                sorted(
                    (r, _quantity(q, r, pod))
                    for r, q in merged.items()
                    if r.startswith(keys.RESOURCE_PREFIX) or is_vendor_resource(r)
                )
            )
            out.append(ContainerFacts(name=name, resources=wanted, container_id=ids.get(name, "")))
    return tuple(out)


def is_vendor_resource(name: str) -> bool:
    """A vendor's device resource such as ``nvidia.com/gpu``: neither ours nor a core resource."""
    # cpu, memory, ephemeral-storage and hugepages-* carry no slash; kubernetes.io/* are not devices.
    return "/" in name and not name.startswith(keys.RESOURCE_PREFIX) and "kubernetes.io/" not in name


def parse_pod(pod: Mapping[str, Any]) -> PodFacts:
    """Read the facts every role needs; raise ``InvalidObject`` naming the pod and field."""
    if not isinstance(pod, Mapping):
        raise InvalidObject(f"gpushare: expected a pod object, got {type(pod).__name__}")
    meta = _obj(pod, "metadata", "?", "metadata")
    namespace, name, uid = _get(meta, "namespace"), _get(meta, "name"), _get(meta, "uid")
    if not all(isinstance(v, str) and v for v in (namespace, name, uid)):
        raise InvalidObject(f"gpushare: a pod lacks metadata.namespace, name or uid: {dict(meta)!r:.160}")
    ref = PodRef(namespace, name, uid)
    spec = _obj(pod, "spec", ref.key, "spec")
    status = _obj(pod, "status", ref.key, "status")
    node_name = _get(spec, "node_name", "nodeName") or ""
    phase = _get(status, "phase") or PHASE_PENDING
    if not isinstance(node_name, str) or not isinstance(phase, str):
        raise InvalidObject(f"gpushare: pod {ref}: spec.nodeName and status.phase must be strings")
    selector = _str_map(_get(spec, "node_selector", "nodeSelector"), "spec.nodeSelector", ref.key)
    return PodFacts(
        ref=ref,
        node_name=node_name,
        phase=phase,
        labels=_str_map(_get(meta, "labels"), "metadata.labels", ref.key),
        annotations=_str_map(_get(meta, "annotations"), "metadata.annotations", ref.key),
        node_selector=tuple(sorted(selector.items())),
        containers=_containers(spec, status, ref.key),
        is_terminating=_get(meta, "deletion_timestamp", "deletionTimestamp") is not None,
        is_gated=bool(_get(spec, "scheduling_gates", "schedulingGates")),
    )


__all__ = [
    "PHASE_PENDING",
    "PHASE_RUNNING",
    "ContainerFacts",
    "PodFacts",
    "PodKey",
    "PodRef",
    "is_vendor_resource",
    "parse_pod",
]
