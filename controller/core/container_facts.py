"""The containers of a pod, read from a plain pod dict: ``read_containers(spec, status) -> ContainerFacts``.

Part of reading a pod (``controller.core.pod_facts``); both spellings of a field are read, and
a field of the wrong shape raises ``InvalidObject`` naming the pod and the field.
Pure module: stdlib and ``gpushare`` only (docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple, TypeGuard

from controller.errors import InvalidObject
from gpushare.rules import is_device_resource, is_vendor_resource

# The API stores quantities as int64: a larger number did not come from it.
_MAX_QUANTITY = 2**63 - 1
_MAX_DIGITS = len(str(_MAX_QUANTITY))

# int() of the texts most counts are written as, looked up instead of parsed: a device count,
# a share spec. "1" and "01" both read as 1, as int() reads them; only the canonical text is here.
SMALL_NUMBERS: dict[str, int] = {str(n): n for n in range(1025)}

# When a container holds its devices, as Kubernetes counts a pod's requests: app containers and
# sidecars (init containers with restartPolicy Always) together, an init container only while it
# runs, before the app containers start.
CONTAINER_APP = "app"
CONTAINER_INIT = "init"
CONTAINER_SIDECAR = "sidecar"

_STATUS_FIELDS = (("container_statuses", "containerStatuses"), ("init_container_statuses", "initContainerStatuses"))
_CONTAINER_FIELDS = (("containers", "containers"), ("init_containers", "initContainers"))


def is_object(value: object) -> TypeGuard[Mapping[str, Any]]:
    # The leader reads every shadow and pending pod on each pass: the exact-type test answers
    # for the plain dicts the client hands over, the ABC check only for anything else.
    return type(value) is dict or isinstance(value, Mapping)


def objects(d: Mapping[str, Any], parent: str, pod: str, snake: str, camel: str) -> list[Mapping[str, Any]]:
    """A list of objects; absent reads as empty. ``parent``: where the field is, for the error."""
    value = d.get(snake)
    if value is None and (value := d.get(camel)) is None:
        return []
    if isinstance(value, list):
        for v in value:
            if type(v) is not dict and not is_object(v):
                break
        else:
            return value
    raise InvalidObject(
        f"gpushare: pod {pod}: {parent}.{camel} must be a list of objects, got {value!r:.80}", field=f"{parent}.{camel}"
    )


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


# tuple.__new__ builds a named tuple without the Python frame of its generated __new__.
_new = tuple.__new__


class ContainerFacts(NamedTuple):
    """One container of a pod. A tuple, not a frozen dataclass: the leader builds one for
    every container it reads on each pass, and a frozen dataclass costs several times more
    to build (its ``__init__`` sets each field through ``object.__setattr__``)."""

    name: str
    # Extended-resource requests of this container (limits when requests are absent:
    # the API defaults requests to limits for extended resources).
    resources: tuple[tuple[str, int], ...]
    container_id: str  # runtime ID without the "containerd://" scheme; "" before it starts
    # kubelet reports it running (status.state.running); spot's killer must then find its tasks.
    is_running: bool = False
    kind: str = "app"  # CONTAINER_APP, CONTAINER_INIT or CONTAINER_SIDECAR: when it holds what it asks

    def quantity(self, resource: str) -> int:
        return sum(q for r, q in self.resources if r == resource)


def _statuses(status: Mapping[str, Any], pod: str) -> tuple[dict[str, str], set[str]]:
    """Container name -> runtime ID, and the names kubelet reports running."""
    ids: dict[str, str] = {}
    running: set[str] = set()
    for field_snake, field_camel in _STATUS_FIELDS:
        listed = status.get(field_snake)
        if listed is None and (listed := status.get(field_camel)) is None:
            continue  # an unscheduled pod has no statuses, and few pods have init containers
        if type(listed) is not list:
            listed = objects(status, "status", pod, field_snake, field_camel)
        for st in listed:
            if type(st) is not dict and not is_object(st):
                objects(status, "status", pod, field_snake, field_camel)  # refuses the list, naming it
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
            if state is not None and (type(state) is dict or is_object(state)) and state.get("running") is not None:
                running.add(name)
    return ids, running


def _quantities(res: Mapping[str, Any], field: str, container: str, pod: str) -> Mapping[str, Any]:
    """``resources.requests`` or ``.limits``; like ``_obj``, with the message built only when it is needed."""
    value = res.get(field)
    if value is None:
        return {}
    if type(value) is not dict and not is_object(value):
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
    if type(res) is not dict and not is_object(res):
        raise InvalidObject(
            f"gpushare: pod {pod}: container {name} resources must be an object, got {res!r:.80}", field="resources"
        )
    requests = res.get("requests")
    if type(requests) is not dict:
        requests = _quantities(res, "requests", name, pod)
    limits = res.get("limits")
    if type(limits) is not dict:
        limits = _quantities(res, "limits", name, pod)
    merged = {**limits, **requests} if limits else requests
    for r in merged:
        if type(r) is not str and not isinstance(r, str):
            raise InvalidObject(
                f"gpushare: pod {pod}: container {name} names a resource that is not a string", field="resources"
            )
    wanted: list[tuple[str, int]] = []
    for r, q in merged.items():
        if is_device_resource(r):
            if type(q) is str and (number := SMALL_NUMBERS.get(q)) is not None:
                wanted.append((r, number))  # the API's own spelling of a count such as "1"
            elif type(q) is str and q.isascii() and q.isdecimal() and len(q) < _MAX_DIGITS:
                wanted.append((r, int(q)))  # the API's own spelling, and too short to pass int64
            else:
                wanted.append((r, _quantity(q, r, pod)))
    if len(wanted) > 1:
        wanted.sort()
    return tuple(wanted)


_Resources = tuple[tuple[str, int], ...]


class ReadCache:
    """What the pods of one snapshot share: containers that read the same are one object.

    It lives as long as one ``build_snapshot``, so it holds at most what that snapshot's pods wrote.
    """

    __slots__ = ("containers",)

    def __init__(self) -> None:
        # (name, device requests, running, kind) -> facts of a container not started yet
        self.containers: dict[tuple[str, _Resources, bool, str], ContainerFacts] = {}


def read_containers(
    spec: Mapping[str, Any], status: Mapping[str, Any], pod: str, cache: ReadCache | None = None
) -> tuple[ContainerFacts, ...]:
    ids, running = _statuses(status, pod)
    out: list[ContainerFacts] = []
    for field_snake, field_camel in _CONTAINER_FIELDS:
        listed = spec.get(field_snake)
        if listed is None and (listed := spec.get(field_camel)) is None:
            continue  # few pods have init containers
        if type(listed) is list:
            for c in listed:
                if type(c) is not dict:  # objects() then takes the list apart (or refuses it)
                    listed = objects(spec, "spec", pod, field_snake, field_camel)
                    break
        else:
            listed = objects(spec, "spec", pod, field_snake, field_camel)
        is_init = field_snake == "init_containers"
        for c in listed:
            name = c.get("name")
            if not isinstance(name, str) or not name:
                raise InvalidObject(f"gpushare: pod {pod}: a container has no name", field="spec.containers")
            wanted = _device_requests(c, name, pod)
            kind = CONTAINER_APP
            if is_init:
                policy = c.get("restart_policy") or c.get("restartPolicy")
                kind = CONTAINER_SIDECAR if policy == "Always" else CONTAINER_INIT
            cid = ids.get(name, "")
            if cache is None or cid:  # a started container's ID is its own: nothing to share
                out.append(_new(ContainerFacts, (name, wanted, cid, name in running, kind)))
                continue
            key = (name, wanted, name in running, kind)
            facts = cache.containers.get(key)
            if facts is None:
                facts = cache.containers[key] = _new(ContainerFacts, (name, wanted, cid, name in running, kind))
            out.append(facts)
    return tuple(out)


__all__ = [
    "CONTAINER_APP",
    "CONTAINER_INIT",
    "CONTAINER_SIDECAR",
    "ContainerFacts",
    "ReadCache",
    "is_object",
    "is_vendor_resource",
    "objects",
    "read_containers",
]
