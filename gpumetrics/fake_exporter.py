"""Fake GPU metrics for machines without GPUs: a dcgm-exporter text file that tests and the demo rewrite.

The agent reads it with ``metrics.source: /path/file.prom`` through ``gpumetrics.scrape``
and the real NVIDIA adapter, exactly like a live scrape, so nothing of the metrics path is
faked but the exporter. Pod labels name the pods whose processes use the GPU, so set
``metrics.processLevel: true`` (docs/spot.md) and a test can make an owner "return" by
writing its pod as a user with utilization above the threshold.

    write_dcgm(path, [FakeGpu("fakegpu0", 0.0), FakeGpu("fakegpu1", 80.0, ("team/dev",))])
    parse_fake_gpu("fakegpu1=80@team/dev,team/other")   # the CLI's spelling
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

DCGM_BLANK = 2147483632  # dcgm-exporter's "no value" sentinel: the adapter reads it as unknown
HOSTNAME = "gpushare-fake"


@dataclass(frozen=True)
class FakeGpu:
    """One GPU: ``device_id`` (the real ID the device plugin advertises), utilization (None = unknown), users."""

    device_id: str
    utilization_pct: float | None
    users: tuple[str, ...] = ()  # "ns/pod" or "ns/pod/container"

    def __post_init__(self) -> None:
        if not self.device_id or any(c in self.device_id for c in '"\\\n'):
            raise ValueError(f"fake GPU id {self.device_id!r} must be non-empty and free of quotes and newlines")
        if self.utilization_pct is not None and not 0 <= self.utilization_pct <= 100:
            raise ValueError(
                f"fake GPU {self.device_id}: utilization must be within 0..100 (got {self.utilization_pct})"
            )
        for user in self.users:
            parts = user.split("/")
            if len(parts) not in (2, 3) or not all(parts) or any(c in user for c in '"\\\n'):
                raise ValueError(f"fake GPU {self.device_id}: user {user!r} is not ns/pod or ns/pod/container")


def render_dcgm(gpus: Iterable[FakeGpu]) -> str:
    """dcgm-exporter text: one DCGM_FI_DEV_GPU_UTIL series per (GPU, user), or one unlabelled if none."""
    lines = [
        "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).",
        "# TYPE DCGM_FI_DEV_GPU_UTIL gauge",
    ]
    for index, gpu in enumerate(gpus):
        value = str(DCGM_BLANK) if gpu.utilization_pct is None else f"{gpu.utilization_pct:g}"
        base = f'gpu="{index}",UUID="{gpu.device_id}",device="nvidia{index}",Hostname="{HOSTNAME}"'
        if not gpu.users:
            lines.append(f"DCGM_FI_DEV_GPU_UTIL{{{base}}} {value}")
        for user in gpu.users:
            ns, pod, *container = user.split("/")
            labels = f'{base},namespace="{ns}",pod="{pod}"' + (f',container="{container[0]}"' if container else "")
            lines.append(f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {value}")
    return "\n".join(lines) + "\n"


def write_dcgm(path: str | Path, gpus: Iterable[FakeGpu]) -> None:
    """Replace ``path`` atomically (temp file in the same dir + rename): a scrape never sees half a file."""
    path = Path(path)
    text = render_dcgm(list(gpus))
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def parse_fake_gpu(spec: str) -> FakeGpu:
    """``ID=UTIL[@ns/pod[,ns/pod...]]``; UTIL ``unknown`` writes the DCGM blank. ValueError names the problem."""
    head, _, users = spec.partition("@")
    device_id, sep, util = head.partition("=")
    if not sep:
        raise ValueError(f"{spec!r}: expected ID=UTIL[@ns/pod,...], e.g. fakegpu0=0 or fakegpu0=80@team/dev")
    try:
        value = None if util == "unknown" else float(util)
    except ValueError:
        raise ValueError(f"{spec!r}: utilization {util!r} is not a number or 'unknown'") from None
    return FakeGpu(device_id, value, tuple(u for u in users.split(",") if u) if users else ())


__all__ = ["DCGM_BLANK", "FakeGpu", "parse_fake_gpu", "render_dcgm", "write_dcgm"]
