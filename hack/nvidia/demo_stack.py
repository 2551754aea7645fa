"""NVIDIA's stack on the demo's node: `make demo VENDOR=nvidia`.

The demo's one-node cluster gets what a GPU node with NVIDIA's software has, all real NVIDIA
binaries on fakenvidia's driver root (docs/fakenvidia.md): 2 fake GPUs with a mock NVML, their CDI
spec written by ``nvidia-ctk cdi generate`` into the node containerd's CDI directory, and NVIDIA's
device plugin v0.17.4 in the ``cdi-cri`` strategy (GPU Operator's default since v25.10: containerd
resolves the CDI names itself), registered with the cluster's kubelet as ``nvidia.com/gpu``.

The plugin runs as a host process in a mount namespace of its own, like the NVIDIA tier runs it
(tests/integration/nvidia/device_plugin.py); its pid is kept in the demo's side directory so that
``make demo-down`` stops it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

from fakenvidia.driver_root import DriverRoot, build_driver_root
from fakenvidia.gpus import FakeGpus
from localcluster.cluster import Cluster
from localcluster.containerd_config import Paths
from localcluster.paths import NvidiaBinaries
from tests.integration.nvidia.conftest import binary_env, nvidia_ctk_generate
from tests.integration.nvidia.device_plugin import RESOURCE, plugin_argv

PID_FILE = "nvidia-device-plugin.pid"
STRATEGY = "cdi-cri"


class NvidiaStack:
    def __init__(self, cluster: Cluster, side: Path, count: int = 2) -> None:
        self.cluster = cluster
        self.side = side
        self.count = count
        # The node containerd's CDI directory (localcluster's config names it in cdi_spec_dirs).
        self.cdi_dir = Paths(cluster.layout.containerd_dir).cdi_dir
        self.log = side / "nvidia-device-plugin.log"
        self.root: DriverRoot | None = None

    def start(self) -> None:
        nvidia = NvidiaBinaries.find()
        self.root = build_driver_root(self.side / "nvidia-root", FakeGpus(count=self.count, uuid_seed="demo"))
        self.cdi_dir.mkdir(parents=True, exist_ok=True)
        nvidia_ctk_generate(nvidia, self.root, self.cdi_dir / "nvidia.yaml")
        plugin = plugin_argv(
            nvidia,
            self.root,
            str(self.cluster.device_plugin_dir),
            f"--device-list-strategy={STRATEGY}",
            f"--nvidia-cdi-hook-path={nvidia.cdi_hook}",
            cdi_dir=str(self.cdi_dir),
        )
        with open(self.log, "wb") as out:
            proc = subprocess.Popen(
                plugin,
                env=binary_env(LD_LIBRARY_PATH=str(self.root.lib_dir)),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # it outlives `make demo`, until `make demo-down`
            )
        (self.side / PID_FILE).write_text(str(proc.pid))

    @staticmethod
    def stop(side: Path) -> None:
        pid_file = side / PID_FILE
        try:
            pid = int(pid_file.read_text())
        except (OSError, ValueError):
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)


__all__ = ["RESOURCE", "STRATEGY", "NvidiaStack"]
