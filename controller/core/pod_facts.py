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
from typing import Any, TypeGuard

from controller.errors import InvalidObject
from gpushare import keys

PodKey = str  # "<namespace>/<name>"

# The API stores quantities as int64: a larger number did not come from it.
_MAX_QUANTITY = 2**63 - 1
_MAX_DIGITS = len(str(_MAX_QUANTITY))

PHASE_PENDING = "Pending"
PHASE_RUNNING = "Running"
_TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
_STATUS_FIELDS = (("container_statuses", "containerStatuses"), ("init_container_statuses", "initContainerStatuses"))
_CONTAINER_FIELDS = (("containers", "containers"), ("init_containers", "initContainers"))


def _get(d: Mapping[str, Any], snake: str, camel: str | None = None) -> Any:
    """Read a field under its to_dict() (snake_case) or API (camelCase) spelling."""
    value = d.get(snake)
    if value is None and camel is not None:
        value = d.get(camel)
    return value


def _is_object(value: object) -> TypeGuard[Mapping[str, Any]]:
    # The leader reads every shadow and pending pod on each pass: the exact-type test answers
    # for the plain dicts the client hands over, the ABC check only for anything else.
    return type(value) is dict or isinstance(value, Mapping)


def _obj(d: Mapping[str, Any], where: str, pod: str, snake: str, camel: str | None = None) -> Mapping[str, Any]:
    """A nested object; absent reads as empty, anything but an object is refused."""
    value = d.get(snake)
    if value is None and (camel is None or (value := d.get(camel)) is None):
        return {}
    if not _is_object(value):
        raise InvalidObject(f"gpushare: pod {pod}: {where} must be an object, got {value!r:.80}", field=where)
    return value


def _objs(d: Mapping[str, Any], parent: str, pod: str, snake: str, camel: str) -> list[Mapping[str, Any]]:
    """A list of objects; absent reads as empty. ``parent``: where the field is, for the error."""
    value = d.get(snake)
    if value is None and (value := d.get(camel)) is None:
        return []
    if isinstance(value, list):
        for v in value:
            if not _is_object(v):
                break
        else:
            return value
    raise InvalidObject(
        f"gpushare: pod {pod}: {parent}.{camel} must be a list of objects, got {value!r:.80}", field=f"{parent}.{camel}"
    )


def _str_map(value: object, where: str, pod: str) -> dict[str, str]:
    if value is None:
        return {}
    if _is_object(value):
        out = dict(value)
        for k, v in out.items():
            if not (isinstance(k, str) and isinstance(v, str)):
                break
        else:
            return out
    raise InvalidObject(f"gpushare: pod {pod}: {where} must map strings to strings, got {value!r:.120}", field=where)


def _quantity(value: object, resource: str, pod: str) -> int:
    """Extended resources are integers (the API server refuses fractions); anything else is refused.

    Also refused: more than the API's int64 can hold. A tenant's number feeds the leader's
    shadow arithmetic, and int() of thousands of digits raises instead of answering.
    """
    # isascii and isdecimal, not isdigit: int() refuses digits such as "²", and reads "٣" as 3.
    if type(value) is str and value.isascii() and value.isdecimal() and len(value) <= _MAX_DIGITS:
        number = int(value)  # the API's own spelling: no sign, no spaces
    elif isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _MAX_QUANTITY:
        number = value
    elif isinstance(value, str) and (text := value.strip()).isascii() and text.isdecimal() and len(text) <= _MAX_DIGITS:
        number = int(text)
    else:
        raise InvalidObject(
            f"gpushare: pod {pod}: {resource} quantity {value!r:.40} is not a whole number from 0 to {_MAX_QUANTITY}",
            field="resources",
        )
    if number > _MAX_QUANTITY:
        raise InvalidObject(
            f"gpushare: pod {pod}: {resource} quantity {value!r:.40} is more than {_MAX_QUANTITY}", field="resources"
        )
    return number


@dataclass(frozen=True, order=True, slots=True)
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


@dataclass(frozen=True, slots=True)
class ContainerFacts:
    name: str
    # Extended-resource requests of this container (limits when requests are absent:
    # the API defaults requests to limits for extended resources).
    resources: tuple[tuple[str, int], ...]
    container_id: str  # runtime ID without the "containerd://" scheme; "" before it starts
    # kubelet reports it running (status.state.running); spot's killer must then find its tasks.
    is_running: bool = False

    def quantity(self, resource: str) -> int:
        return sum(q for r, q in self.resources if r == resource)


@dataclass(frozen=True, slots=True)
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


def _statuses(status: Mapping[str, Any], pod: str) -> tuple[dict[str, str], set[str]]:
    """Container name -> runtime ID, and the names kubelet reports running."""
    ids: dict[str, str] = {}
    running: set[str] = set()
    for field_snake, field_camel in _STATUS_FIELDS:
        for st in _objs(status, "status", pod, field_snake, field_camel):
            name = st.get("name")
            if not isinstance(name, str):
                continue
            cid = st.get("container_id")
            if cid is None:
                cid = st.get("containerID")
            if not cid:
                ids[name] = ""
            elif isinstance(cid, str):
                ids[name] = cid.split("://", 1)[-1]
            state = st.get("state")
            if _is_object(state) and state.get("running") is not None:
                running.add(name)
    return ids, running


def _quantities(res: Mapping[str, Any], field: str, container: str, pod: str) -> Mapping[str, Any]:
    """``resources.requests`` or ``.limits``; like ``_obj``, with the message built only when it is needed."""
    value = res.get(field)
    if value is None:
        return {}
    if not _is_object(value):
        raise InvalidObject(
            f"gpushare: pod {pod}: container {container} resources.{field} must be an object, got {value!r:.80}",
            field="resources",
        )
    return value


def _device_requests(c: Mapping[str, Any], name: str, pod: str) -> tuple[tuple[str, int], ...]:
    """Device resources a container asks for (requests over limits), sorted; cpu and memory are skipped."""
    res = c.get("resources")
    if res is None:
        return ()
    if not _is_object(res):
        raise InvalidObject(
            f"gpushare: pod {pod}: container {name} resources must be an object, got {res!r:.80}", field="resources"
        )
    requests = _quantities(res, "requests", name, pod)
    limits = _quantities(res, "limits", name, pod)
    merged = {**limits, **requests} if limits else requests
    for r in merged:
        if not isinstance(r, str):
            raise InvalidObject(
                f"gpushare: pod {pod}: container {name} names a resource that is not a string", field="resources"
            )
    wanted: list[tuple[str, int]] = []
    for r, q in merged.items():
        if r.startswith(keys.RESOURCE_PREFIX) or is_vendor_resource(r):
            wanted.append((r, _quantity(q, r, pod)))
    wanted.sort()
    return tuple(wanted)


def _containers(spec: Mapping[str, Any], status: Mapping[str, Any], pod: str) -> tuple[ContainerFacts, ...]:
    ids, running = _statuses(status, pod)
    out: list[ContainerFacts] = []
    for field_snake, field_camel in _CONTAINER_FIELDS:
        for c in _objs(spec, "spec", pod, field_snake, field_camel):
            name = c.get("name")
            if not isinstance(name, str) or not name:
                raise InvalidObject(f"gpushare: pod {pod}: a container has no name", field="spec.containers")
            wanted = _device_requests(c, name, pod)
            out.append(ContainerFacts(name, wanted, ids.get(name, ""), name in running))
    return tuple(out)


# The field of a failure no reader named: an exception the model did not expect.
FIELD_UNREADABLE = "unreadable"


@dataclass(frozen=True)
class PodProblem:
    """A pod a pass skips because a field of it cannot be read; the pass goes on without it.

    Every field of a pod is the tenant's to write (docs/security.md), so a field the agent
    cannot read costs exactly that pod. ``field`` is one fixed word per reader, never the
    value, so a tenant cannot grow the label set of ``gpushare_pod_input_errors_total``.
    """

    ref: PodRef | None  # None when even the pod's namespace, name and uid cannot be read
    field: str  # which part of the pod, as a fixed word (the metric's label)
    message: str  # names the pod, the field and the rule; starts with "gpushare: "


def _ref_of(raw: object) -> PodRef | None:
    """The pod's identity when its metadata has it, for the Event; None otherwise."""
    if not isinstance(raw, Mapping):
        return None
    meta = raw.get("metadata")
    if not isinstance(meta, Mapping):
        return None
    ns, name, uid = meta.get("namespace"), meta.get("name"), meta.get("uid")
    if isinstance(ns, str) and isinstance(name, str) and isinstance(uid, str) and ns and name and uid:
        return PodRef(ns, name, uid)
    return None


def problem_of(raw: object, exc: Exception) -> PodProblem:
    """The problem one pod's failed read amounts to."""
    ref = _ref_of(raw)
    if isinstance(exc, InvalidObject):
        return PodProblem(ref, exc.field or "object", str(exc))
    who = f"pod {ref}" if ref is not None else "a pod"
    # The exception's own text can be long and is partly the tenant's: cut it.
    detail = f"{type(exc).__name__}: {str(exc)[:160]}"
    return PodProblem(ref, FIELD_UNREADABLE, f"gpushare: {who} cannot be read ({detail}); skipped")


def is_vendor_resource(name: str) -> bool:
    """A vendor's device resource such as ``nvidia.com/gpu``: neither ours nor a core resource."""
    # cpu, memory, ephemeral-storage and hugepages-* carry no slash; kubernetes.io/* are not devices.
    return "/" in name and not name.startswith(keys.RESOURCE_PREFIX) and "kubernetes.io/" not in name


def parse_pod(pod: Mapping[str, Any]) -> PodFacts:
    """Read the facts every role needs; raise ``InvalidObject`` naming the pod and field."""
    if not _is_object(pod):
        raise InvalidObject(f"gpushare: expected a pod object, got {type(pod).__name__}", field="object")
    meta = _obj(pod, "metadata", "?", "metadata")
    namespace, name, uid = meta.get("namespace"), meta.get("name"), meta.get("uid")
    ids_are_text = isinstance(namespace, str) and isinstance(name, str) and isinstance(uid, str)
    if not (ids_are_text and namespace and name and uid):
        raise InvalidObject(
            f"gpushare: a pod lacks metadata.namespace, name or uid: {dict(meta)!r:.160}", field="metadata"
        )
    ref = PodRef(namespace, name, uid)
    key = f"{namespace}/{name}"
    spec = _obj(pod, "spec", key, "spec")
    status = _obj(pod, "status", key, "status")
    node_name = spec.get("node_name")
    if node_name is None:
        node_name = spec.get("nodeName")
    node_name = node_name or ""
    phase = status.get("phase") or PHASE_PENDING
    if not isinstance(node_name, str) or not isinstance(phase, str):
        raise InvalidObject(
            f"gpushare: pod {ref}: spec.nodeName and status.phase must be strings", field="spec.nodeName"
        )
    selector = _str_map(_get(spec, "node_selector", "nodeSelector"), "spec.nodeSelector", key)
    return PodFacts(
        ref,
        node_name,
        phase,
        _str_map(meta.get("labels"), "metadata.labels", key),
        _str_map(meta.get("annotations"), "metadata.annotations", key),
        tuple(sorted(selector.items())) if selector else (),
        _containers(spec, status, key),
        _get(meta, "deletion_timestamp", "deletionTimestamp") is not None,
        bool(_get(spec, "scheduling_gates", "schedulingGates")),
    )


__all__ = [
    "FIELD_UNREADABLE",
    "PHASE_PENDING",
    "PHASE_RUNNING",
    "ContainerFacts",
    "PodFacts",
    "PodKey",
    "PodProblem",
    "PodRef",
    "is_vendor_resource",
    "parse_pod",
    "problem_of",
]
