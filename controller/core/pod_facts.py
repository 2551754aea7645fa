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
from typing import Any, NamedTuple

from controller.core.container_facts import ContainerFacts, ReadCache, is_object, is_vendor_resource, read_containers
from controller.errors import InvalidObject

PodKey = str  # "<namespace>/<name>"

PHASE_PENDING = "Pending"
PHASE_RUNNING = "Running"
_TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


def _obj(d: Mapping[str, Any], where: str, pod: str, snake: str, camel: str | None = None) -> Mapping[str, Any]:
    """A nested object; absent reads as empty, anything but an object is refused."""
    value = d.get(snake)
    if value is None and (camel is None or (value := d.get(camel)) is None):
        return {}
    if not is_object(value):
        raise InvalidObject(f"gpushare: pod {pod}: {where} must be an object, got {value!r:.80}", field=where)
    return value


def _str_map(value: object, where: str, pod: str) -> dict[str, str]:
    if value is None:
        return {}
    if type(value) is dict:
        out = value.copy()
        # join refuses any item that is not a str, in C: the same test as the loop below, for
        # the plain dicts every pod the leader reads brings.
        try:
            "".join(out)
            "".join(out.values())
        except TypeError:
            pass
        else:
            return out
    elif is_object(value):
        out = dict(value)
        for k, v in out.items():
            if not (isinstance(k, str) and isinstance(v, str)):
                break
        else:
            return out
    raise InvalidObject(f"gpushare: pod {pod}: {where} must map strings to strings, got {value!r:.120}", field=where)


class PodRef(NamedTuple):
    """A pod by name and uid; the uid tells a re-created pod of the same name apart.

    A tuple, for the reason ``ContainerFacts`` is one: the leader builds one for every pod it
    reads. It orders, hashes and compares as its three fields, in C; like any tuple, it also
    equals a plain tuple of the same three strings.
    """

    namespace: str
    name: str
    uid: str

    @property
    def key(self) -> PodKey:
        return f"{self.namespace}/{self.name}"

    def __str__(self) -> str:
        return self.key


class PodFacts(NamedTuple):
    """What every role reads of a pod; a tuple for the reason ``ContainerFacts`` is one."""

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
        return self.phase not in _TERMINAL_PHASES and not self.is_terminating  # is_terminal, without a call

    @property
    def is_unscheduled(self) -> bool:
        return not self.node_name and self.phase == PHASE_PENDING

    def quantity(self, resource: str) -> int:
        return sum(c.quantity(resource) for c in self.containers)

    def resources(self) -> set[str]:
        return {r for c in self.containers for r, _ in c.resources}


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


# tuple.__new__ builds a named tuple without the Python frame of its generated __new__.
_new = tuple.__new__


def parse_pod(pod: Mapping[str, Any], cache: ReadCache | None = None) -> PodFacts:
    """Read the facts every role needs; raise ``InvalidObject`` naming the pod and field.

    ``cache``: shared by the pods of one snapshot (``ReadCache``); the facts are the same without it.
    """
    if type(pod) is not dict and not is_object(pod):
        raise InvalidObject(f"gpushare: expected a pod object, got {type(pod).__name__}", field="object")
    meta = pod.get("metadata")
    if type(meta) is not dict:
        meta = _obj(pod, "metadata", "?", "metadata")
    namespace, name, uid = meta.get("namespace"), meta.get("name"), meta.get("uid")
    ids_are_text = isinstance(namespace, str) and isinstance(name, str) and isinstance(uid, str)
    if not (ids_are_text and namespace and name and uid):
        raise InvalidObject(
            f"gpushare: a pod lacks metadata.namespace, name or uid: {dict(meta)!r:.160}", field="metadata"
        )
    ref = _new(PodRef, (namespace, name, uid))
    key = f"{namespace}/{name}"
    spec = pod.get("spec")
    if type(spec) is not dict:
        spec = _obj(pod, "spec", key, "spec")
    status = pod.get("status")
    if type(status) is not dict:
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
    # _get and _str_map inlined for the fields most pods leave out: this runs for every pod read.
    selector = spec.get("node_selector")
    if selector is None:
        selector = spec.get("nodeSelector")
    if selector is not None:
        selector = _str_map(selector, "spec.nodeSelector", key)
    labels = meta.get("labels")
    annotations = meta.get("annotations")
    gates = spec.get("scheduling_gates")
    if gates is None:
        gates = spec.get("schedulingGates")
    return _new(
        PodFacts,
        (
            ref,
            node_name,
            phase,
            {} if labels is None else _str_map(labels, "metadata.labels", key),
            {} if annotations is None else _str_map(annotations, "metadata.annotations", key),
            tuple(sorted(selector.items())) if selector else (),
            read_containers(spec, status, key, cache),
            meta.get("deletion_timestamp") is not None or meta.get("deletionTimestamp") is not None,
            bool(gates),
        ),
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
    "ReadCache",
    "is_vendor_resource",
    "parse_pod",
    "problem_of",
]
