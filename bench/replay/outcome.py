"""What a replay came to, read from the API server's objects alone, and what must hold of it.

A run's figures follow the FGD paper's definitions (its ``merge_alloc_discrete.py``):

- **arrival** after a task: the GPU milli asked by every task created so far, placed or not, over
  the cluster's GPU milli;
- **allocation ratio** at an arrival: the GPU milli asked by the tasks placed among them, over the
  same. A task's size is its trace size (``gpu_milli`` times ``num_gpu``) in every mode, so the ratio
  measures the work placed, not what a mode rounds it up to; what a mode holds is reported beside
  it (``gpus_in_use``).

Placed means bound to a node and not failed. The checks read the same objects: no GPU holds
more than 1000 milli, every sharer holds its own shadow's or claim's GPU on its own node, and no
pod was refused at admission by its node.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from bench.replay.modes import ANNOTATION_GPUS, ANNOTATION_MILLI, LABEL_SEQ, Mode
from bench.replay.trace import MILLI_PER_GPU
from draplugin.pool import KIND_EXACT, KIND_WHOLE, parse_device_name
from gpushare import keys

Obj = Mapping[str, Any]
ADMISSION_REFUSED = "UnexpectedAdmissionError"


@dataclass(frozen=True)
class Placement:
    """One task of the workload as the API server shows it after the replay."""

    seq: int
    name: str
    request: int  # GPU milli in all (trace size)
    num_gpu: int
    node: str  # "" when not placed
    uid: str


@dataclass(frozen=True)
class RunOutcome:
    mode: str
    seed: int
    profile: str
    nodes: int
    gpus: int
    tasks: int
    gpu_tasks: int
    arrived: float  # % of GPU capacity asked by the whole workload
    curve: tuple[tuple[int, float], ...]  # (arrival %, allocation ratio %) for arrival 0, 1, 2, ...
    unplaced_gpu_tasks: int
    unplaced_cpu_tasks: int
    gpus_in_use: int  # GPUs that hold at least one placed task (a shadow with a user counts its GPU)
    idle_shadows: int  # Running shadows with no user: GPUs held for nobody
    seconds: float  # from the first create to settled
    problems: tuple[str, ...] = field(default=())

    def ratio_at(self, arrival: int) -> float | None:
        """The allocation ratio once ``arrival`` % had arrived; None when the run never got there."""
        for pct, ratio in self.curve:
            if pct == arrival:
                return ratio
        return None

    def as_json(self) -> dict[str, Any]:
        return {**self.__dict__, "curve": [list(p) for p in self.curve], "problems": list(self.problems)}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> RunOutcome:
        fields = dict(doc)
        fields["curve"] = tuple((int(a), float(r)) for a, r in doc["curve"])
        fields["problems"] = tuple(doc.get("problems") or ())
        return cls(**fields)


def _meta(obj: Obj) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _annotations(obj: Obj) -> Mapping[str, str]:
    return _meta(obj).get("annotations") or {}


def _key(obj: Obj) -> str:
    return f"{_meta(obj).get('namespace', '')}/{_meta(obj).get('name', '')}"


def is_placed(pod: Obj) -> bool:
    return bool((pod.get("spec") or {}).get("nodeName")) and (pod.get("status") or {}).get("phase") != "Failed"


def placements(pods: Iterable[Obj]) -> list[Placement]:
    """The workload's tasks in creation order; pods without the replay's label are not tasks."""
    out = []
    for pod in pods:
        meta = _meta(pod)
        seq = (meta.get("labels") or {}).get(LABEL_SEQ)
        if seq is None:
            continue
        ann = _annotations(pod)
        num_gpu = int(ann.get(ANNOTATION_GPUS, "0"))
        milli = int(ann.get(ANNOTATION_MILLI, "0"))
        node = str(pod["spec"]["nodeName"]) if is_placed(pod) else ""
        out.append(Placement(int(seq), str(meta["name"]), num_gpu * milli, num_gpu, node, str(meta.get("uid", ""))))
    out.sort(key=lambda p: p.seq)
    return out


def allocation_curve(tasks: Sequence[Placement], capacity_milli: int) -> tuple[tuple[int, float], ...]:
    """(arrival %, allocation ratio %) at each whole arrival percent the workload reached: the ratio once
    the first task that brought arrival to that percent had been placed or refused."""
    points: list[tuple[int, float]] = [(0, 0.0)]
    arrived = placed = 0
    for task in tasks:
        arrived += task.request
        if task.node:
            placed += task.request
        reached = math.floor(Fraction(100 * arrived, capacity_milli))
        while points[-1][0] < reached:
            points.append((points[-1][0] + 1, 100.0 * placed / capacity_milli))
    return tuple(points)


def _share_n(pod: Obj) -> int | None:
    """N of the ``gpushare/share-gpu-N`` the pod asks for, if any."""
    for container in (pod.get("spec") or {}).get("containers") or []:
        for name in (container.get("resources") or {}).get("limits") or {}:
            parsed = keys.parse_share_resource(str(name))
            if parsed is not None and parsed[0] == keys.KIND_SHARE:
                return parsed[1]
    return None


@dataclass
class _GpuLoad:
    milli: Fraction = Fraction(0)
    families: set[str] = field(default_factory=set)
    holders: list[str] = field(default_factory=list)


def claim_of(pod: Obj) -> str:
    """The name of the ResourceClaim that gives the pod its GPU: the one it names, one made from its
    template, or the one the scheduler made for its extended resource; "" when it has none."""
    for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
        if entry.get("resourceClaimName"):
            return str(entry["resourceClaimName"])
    status = pod.get("status") or {}
    for entry in status.get("resourceClaimStatuses") or []:
        if entry.get("resourceClaimName"):
            return str(entry["resourceClaimName"])
    return str((status.get("extendedResourceClaimStatus") or {}).get("resourceClaimName") or "")


def check_dra(pods: Sequence[Obj], claims: Sequence[Obj], nodes: Mapping[str, int]) -> tuple[list[str], int]:
    """Problems of a DRA run, and the GPUs in use: each placed GPU task's claim allocated on its node,
    reserved for it; per GPU, at most 1000 milli and one family (slots or exact claims)."""
    problems: list[str] = []
    by_name = {_key(c): c for c in claims}
    load: dict[tuple[str, str], _GpuLoad] = defaultdict(_GpuLoad)
    exclusive_holder: dict[tuple[str, str], str] = {}
    for claim in claims:
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or []:
            if result.get("driver") != keys.DOMAIN:
                continue
            parsed = parse_device_name(str(result.get("device", "")))
            if parsed is None:
                problems.append(f"claim {_key(claim)} holds {result.get('device')!r}, not a device of this driver")
                continue
            gpu, kind, n = parsed
            where = (str(result.get("pool", "")), gpu)
            device = (where[0], str(result["device"]))
            if kind != KIND_EXACT:
                other = exclusive_holder.setdefault(device, _key(claim))
                if other != _key(claim):
                    problems.append(f"device {device[1]} of {device[0]} is held by {other} and {_key(claim)}")
            if kind == KIND_EXACT:
                consumed = ((result.get("consumedCapacity") or {}).get("milli")) or str(MILLI_PER_GPU)
                milli = Fraction(int(str(consumed)))
                family = KIND_EXACT
            elif n:
                milli, family = Fraction(MILLI_PER_GPU, n), "slots"
            else:
                milli, family = Fraction(MILLI_PER_GPU), KIND_WHOLE if kind == KIND_WHOLE else kind
            load[where].milli += milli
            load[where].families.add(family)
            load[where].holders.append(_key(claim))
    for (pool, gpu), held in sorted(load.items()):
        if held.milli > MILLI_PER_GPU:
            problems.append(f"{gpu} of {pool} holds {float(held.milli):.0f} milli: {', '.join(held.holders)}")
        if len(held.families) > 1:
            problems.append(f"{gpu} of {pool} holds {' and '.join(sorted(held.families))} at once")
        if pool not in nodes:
            problems.append(f"{gpu} of {pool}: no such simulated node")
    for pod in pods:
        if not is_placed(pod) or not int(_annotations(pod).get(ANNOTATION_GPUS, "0") or 0):
            continue
        name, node = _key(pod), pod["spec"]["nodeName"]
        claim_obj = by_name.get(f"{_meta(pod).get('namespace')}/{claim_of(pod)}")
        if claim_obj is None:
            problems.append(f"{name} runs on {node} without a claim for its GPU")
            continue
        results = (((claim_obj.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
        if not results or any(r.get("pool") != node for r in results):
            pools = sorted({str(r.get("pool")) for r in results})
            problems.append(f"{name} runs on {node}, its claim {_key(claim_obj)} holds GPUs of {pools or 'nothing'}")
        reserved = {r.get("uid") for r in (claim_obj.get("status") or {}).get("reservedFor") or []}
        if _meta(pod).get("uid") not in reserved:
            problems.append(f"{name}'s claim {_key(claim_obj)} is not reserved for it")
    return problems, len(load)


def recorded_shadow(sharer: Obj, shadows: Mapping[str, Obj]) -> tuple[str, Obj | None, str]:
    """The shadow a bound sharer's owner record names ("<namespace>/<name>"), that shadow (None when the
    record names none that exists), and what is wrong ("" when it names one shadow on the sharer's node)."""
    owners = json.loads(_annotations(sharer).get(keys.ANNOTATION_SHADOW_OWNER) or "{}")
    if len(owners) != 1:
        return "", None, f"sharer {_key(sharer)} is recorded on {len(owners)} shadows, not 1"
    (key,) = owners
    shadow = shadows.get(key)
    if shadow is None:
        return key, None, f"sharer {_key(sharer)} is recorded on {key}, which does not exist"
    node = (sharer.get("spec") or {}).get("nodeName")
    if (shadow.get("spec") or {}).get("nodeName") != node:
        return key, shadow, f"sharer {_key(sharer)} is on {node}, its shadow {key} elsewhere"
    return key, shadow, ""


def check_shadows(
    pods: Sequence[Obj], shadows: Sequence[Obj], nodes: Mapping[str, int], vendor_resource: str
) -> tuple[list[str], int, int]:
    """Problems of a run on device plugins, the GPUs in use and the idle shadows: every placed sharer
    recorded on one shadow of its own N on its own node, no shadow over N sharers, no node over its GPUs."""
    problems: list[str] = []
    by_key = {_key(s): s for s in shadows}
    users: dict[str, int] = defaultdict(int)
    whole: dict[str, int] = defaultdict(int)
    for pod in pods:
        if not is_placed(pod):
            continue
        node = str(pod["spec"]["nodeName"])
        n = _share_n(pod)
        if n is None:
            for container in pod["spec"].get("containers") or []:
                whole[node] += int(((container.get("resources") or {}).get("limits") or {}).get(vendor_resource, 0))
            continue
        shadow_key, shadow, problem = recorded_shadow(pod, by_key)
        if problem:
            problems.append(problem)
        if shadow is None:
            continue
        spec = (_meta(shadow).get("labels") or {}).get(keys.LABEL_SHARE_SPEC)
        if spec != str(n):
            problems.append(f"sharer {_key(pod)} asks 1/{n} of a GPU, its shadow {shadow_key} is cut in {spec}")
        users[shadow_key] += 1
    idle = 0
    for key, shadow in by_key.items():
        node = str((shadow.get("spec") or {}).get("nodeName") or "")
        if not node:
            continue
        whole[node] += 1
        spec = int((_meta(shadow).get("labels") or {}).get(keys.LABEL_SHARE_SPEC) or 0)
        if users[key] > spec:
            problems.append(f"shadow {key} has {users[key]} sharers, over its {spec}")
        if not users[key]:
            idle += 1
    for node, taken in sorted(whole.items()):
        if taken > nodes.get(node, 0):
            problems.append(f"{node} gives {taken} GPUs (whole pods and shadows) and has {nodes.get(node, 0)}")
    return problems, sum(whole.values()) - idle, idle


def admission_refusals(pods: Iterable[Obj], refused: Collection[str] = ()) -> list[str]:
    """Pods a node refused at admission: kubelet's ``UnexpectedAdmissionError``, and sharers the simulated
    nodes' device manager had no slot for (``refused``, "<namespace>/<name>")."""
    out = [
        f"{_key(p)} was refused by {p['spec'].get('nodeName')}: {(p.get('status') or {}).get('message', '')}"
        for p in pods
        if (p.get("status") or {}).get("reason") == ADMISSION_REFUSED
    ]
    return out + [f"{key} was bound where its node had no slot left" for key in sorted(refused)]


def gpus_in_use_exclusive(tasks: Iterable[Placement]) -> int:
    return sum(t.num_gpu for t in tasks if t.node)


def summarize(
    mode: Mode,
    *,
    seed: int,
    profile: str,
    nodes: Mapping[str, int],
    pods: Sequence[Obj],
    shadows: Sequence[Obj] = (),
    claims: Sequence[Obj] = (),
    refused: Collection[str] = (),
    vendor_resource: str,
    seconds: float,
) -> RunOutcome:
    """The run's outcome from what the API server holds once it settled; ``nodes`` maps each node to its GPUs."""
    tasks = placements(pods)
    capacity = sum(nodes.values()) * MILLI_PER_GPU
    problems = admission_refusals([*pods, *shadows], refused)
    idle = 0
    if mode.dra:
        found, in_use = check_dra(pods, claims, nodes)
    elif mode.shadows:
        found, in_use, idle = check_shadows(pods, shadows, nodes, vendor_resource)
    else:
        found, in_use = check_shadows(pods, (), nodes, vendor_resource)[0], gpus_in_use_exclusive(tasks)
    problems += found
    problems += [f"{t.name} is on {t.node}, not a simulated node" for t in tasks if t.node and t.node not in nodes]
    gpu_tasks = [t for t in tasks if t.request]
    return RunOutcome(
        mode=str(mode),
        seed=seed,
        profile=profile,
        nodes=len(nodes),
        gpus=sum(nodes.values()),
        tasks=len(tasks),
        gpu_tasks=len(gpu_tasks),
        arrived=100.0 * sum(t.request for t in tasks) / capacity,
        curve=allocation_curve(tasks, capacity),
        unplaced_gpu_tasks=sum(1 for t in gpu_tasks if not t.node),
        unplaced_cpu_tasks=sum(1 for t in tasks if not t.request and not t.node),
        gpus_in_use=in_use,
        idle_shadows=idle,
        seconds=seconds,
        problems=tuple(problems),
    )
