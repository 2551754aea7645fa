"""The kube-scheduler configurations a replay runs under, as plain data; docs/install.md recommends the best measured.

- ``default``: kube-scheduler's own scoring (``NodeResourcesFit`` LeastAllocated on CPU and
  memory, which spreads pods, and the adaptive share of nodes scored: about 40 % at 1,200 nodes).
- ``binpack``: what an operator who wants GPUs packed sets: ``NodeResourcesFit`` MostAllocated
  over CPU, memory and the GPU resources (the vendor's and gpushare's share resources, weighted
  higher), and every feasible node scored (``percentageOfNodesToScore: 100``), so the fullest
  node wins rather than the fullest of the first few hundred found.
- ``gpu-binpack``: the same, but MostAllocated over the GPU resources alone: nodes are filled by
  their GPUs, and CPU and memory are left out of the score, so a node's last CPUs are not packed
  away from the GPUs beside them.

On DRA nodes ``gpushare/share-gpu-N`` is an extended resource backed by DRA, and scoring one makes
NodeResourcesFit count the devices allocated for it on every node for every pod: in a full-size
replay that was 1,100 of the scheduler's 1,400 plugin-seconds, 0.3 pods a second. The DRA family
is therefore scored on CPU and memory only (``share_specs=()``); its GPUs are packed by the DRA
allocator, which takes a node's devices in order.

Both raise the scheduler's client to 500 requests a second (burst 1,000) against its default
50: at 50, a replay of 10,000 pods waits minutes on the scheduler's token bucket
(docs/scale.md), and the bucket changes when a pod is placed, not where.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpushare import keys

PROFILES = ("default", "binpack", "gpu-binpack")
CLIENT = {"qps": 500, "burst": 1000}
GPU_WEIGHT = 5


def scheduler_settings(profile: str, *, vendor_resource: str, share_specs: Sequence[int]) -> dict[str, Any]:
    """The KubeSchedulerConfiguration fields for ``profile`` (``localcluster.component_config.scheduler_config_doc``
    adds the client's kubeconfig and leader election)."""
    if profile not in PROFILES:
        raise ValueError(f"unknown scheduler profile {profile!r}; expected one of {', '.join(PROFILES)}")
    settings: dict[str, Any] = {"clientConnection": dict(CLIENT)}
    if profile == "default":
        return settings
    gpu = [vendor_resource, *(keys.share_resource(keys.KIND_SHARE, n) for n in share_specs)]
    host = [{"name": "cpu", "weight": 1}, {"name": "memory", "weight": 1}] if profile == "binpack" else []
    fit_args = {
        "scoringStrategy": {
            "type": "MostAllocated",
            "resources": [*host, *({"name": r, "weight": GPU_WEIGHT} for r in gpu)],
        }
    }
    return {
        **settings,
        "percentageOfNodesToScore": 100,
        "profiles": [
            {
                "schedulerName": "default-scheduler",
                "pluginConfig": [{"name": "NodeResourcesFit", "args": fit_args}],
            }
        ],
    }
