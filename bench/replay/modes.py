"""How each way of giving out GPUs asks for a trace task's GPU: the pod a task becomes, per mode.

- ``exclusive`` (the baseline, no sharing): every GPU task asks whole GPUs of the vendor's resource;
- ``share-gpu``: a task of part of a GPU asks ``gpushare/share-gpu-N: 1``, N the finest offered
  spec it fits in (device plugins and shadows); whole GPUs as in ``exclusive``;
- ``dra-share-gpu``: the same extended resource, which a DRA DeviceClass backs (the scheduler
  makes its claim); whole GPUs by a ResourceClaim for N ``gpu`` devices;
- ``dra-exact``: a claim for the ``exact`` device with ``capacity.requests.milli`` of its size;
  whole GPUs as in ``dra-share-gpu``.

A task too big for any offered 1/N (over 500 milli with the default specs) takes a whole GPU in
the two 1/N modes: the trace's most common sharing size, 810, is one of them. Every pod carries
its place in the workload and its trace size, so the outcome can be read back from the API
server alone (``bench/replay/outcome.py``).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from bench.replay.trace import MILLI_PER_GPU, TracePod
from gpushare import keys

NAMESPACE = "replay"
LABEL_SEQ = "replay.gpushare.test/seq"
ANNOTATION_MILLI = "replay.gpushare.test/gpu-milli"  # of each GPU
ANNOTATION_GPUS = "replay.gpushare.test/num-gpu"
ANNOTATION_TASK = "replay.gpushare.test/task"
CLASS_WHOLE = keys.DRA_CLASS_GPU
CLASS_EXACT = f"exact.{keys.DOMAIN}"
CLAIM_NAME = "gpu"  # the pod's one claim, as its container names it


class Mode(enum.StrEnum):
    EXCLUSIVE = "exclusive"
    SHARE = "share-gpu"
    DRA_SHARE = "dra-share-gpu"
    DRA_EXACT = "dra-exact"

    @property
    def dra(self) -> bool:
        return self in (Mode.DRA_SHARE, Mode.DRA_EXACT)

    @property
    def shadows(self) -> bool:
        """Sharers are served by shadow pods that the leader agent makes."""
        return self is Mode.SHARE


def share_spec(gpu_milli: int, specs: Iterable[int]) -> int | None:
    """The largest N among ``specs`` whose 1/N holds ``gpu_milli``; None when none does (a whole GPU)."""
    fits = [n for n in specs if n * gpu_milli <= MILLI_PER_GPU]
    return max(fits) if fits else None


def claim_name(seq: int) -> str:
    return f"{pod_name(seq)}-gpu"


def claim_manifest(mode: Mode, seq: int, task: TracePod, specs: Sequence[int]) -> dict[str, Any] | None:
    """The ResourceClaim task ``seq`` holds its GPUs by in ``mode``; None when it asks for none this way.

    A claim per task, created just before its pod, rather than a template: the controller-manager
    makes a template's claim only after the pod exists, and the scheduler cannot try the pod until
    then, so tasks without a claim would overtake the ones with one and the replay would no longer
    place them in their order.
    """
    if not mode.dra or not task.num_gpu:
        return None
    exactly: dict[str, Any]
    if task.shares and mode is Mode.DRA_EXACT:
        exactly = {"deviceClassName": CLASS_EXACT, "capacity": {"requests": {"milli": str(task.gpu_milli)}}}
    elif task.shares and share_spec(task.gpu_milli, specs) is not None:
        return None  # the extended resource: the scheduler makes its claim
    else:
        exactly = {"deviceClassName": CLASS_WHOLE}
        if task.num_gpu != 1:
            exactly |= {"allocationMode": "ExactCount", "count": task.num_gpu}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": claim_name(seq), "namespace": NAMESPACE, "labels": {LABEL_SEQ: str(seq)}},
        "spec": {"devices": {"requests": [{"name": CLAIM_NAME, "exactly": exactly}]}},
    }


def pod_name(seq: int) -> str:
    return f"task-{seq:05d}"


def pod_manifest(
    mode: Mode,
    seq: int,
    task: TracePod,
    *,
    specs: Sequence[int],
    vendor_resource: str,
    node_selector: Mapping[str, str],
    image: str,
) -> dict[str, Any]:
    """Task ``seq`` of the workload as a pod for ``mode``: its trace CPU and memory as requests, its GPU as
    the mode asks for it, and ``node_selector`` (the simulated nodes)."""
    limits: dict[str, str] = {}
    claim = claim_manifest(mode, seq, task, specs)
    if task.num_gpu and claim is None:
        n = share_spec(task.gpu_milli, specs) if task.shares else None
        if n is not None and mode is not Mode.EXCLUSIVE:
            limits[keys.share_resource(keys.KIND_SHARE, n)] = "1"
        else:
            limits[vendor_resource] = str(task.num_gpu)
    resources: dict[str, Any] = {"requests": {"cpu": f"{task.cpu_milli}m", "memory": f"{task.memory_mib}Mi"}}
    if limits:
        resources["limits"] = limits
    if claim is not None:
        resources["claims"] = [{"name": CLAIM_NAME}]
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": image, "resources": resources}],
        "nodeSelector": dict(node_selector),
        "terminationGracePeriodSeconds": 0,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
    }
    if claim is not None:
        spec["resourceClaims"] = [{"name": CLAIM_NAME, "resourceClaimName": claim_name(seq)}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(seq),
            "namespace": NAMESPACE,
            "labels": {LABEL_SEQ: str(seq)},
            "annotations": {
                ANNOTATION_TASK: task.name,
                ANNOTATION_MILLI: str(task.gpu_milli),
                ANNOTATION_GPUS: str(task.num_gpu),
            },
        },
        "spec": spec,
    }
