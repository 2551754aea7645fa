"""NVIDIA's device plugin as a process, registering with a KubeletPeer instead of kubelet.

k8s-device-plugin v0.17.4 serves its socket at ``/var/lib/kubelet/device-plugins/nvidia-gpu.sock``
whatever ``--kubelet-socket`` says (``pluginapi.DevicePluginPath`` is compiled in), and tells kubelet
only the socket's name. So it runs in a mount namespace of its own where /var/lib is a private tmpfs
and that directory is a bind mount of the peer's, as localcluster runs kubelet
(localcluster/component_config.py): the peer finds the plugin's socket next to its own, and this
machine's /var/lib is never touched.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

from fakenvidia.driver_root import DriverRoot
from localcluster.paths import NvidiaBinaries
from tests.integration.nvidia.conftest import binary_env

RESOURCE = "nvidia.com/gpu"
SYSTEM_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"

# $1: the peer's directory; the rest: the plugin's argv. Only this namespace sees the mounts.
_NAMESPACE_SCRIPT = (
    "set -e; "
    "mount -t tmpfs -o mode=0755,size=1m gs-nvidia-varlib /var/lib; "
    f"mkdir -p {SYSTEM_PLUGIN_DIR}; "
    f'mount --bind "$1" {SYSTEM_PLUGIN_DIR}; '
    'shift; exec "$@"'
)


class PluginProcess:
    def __init__(self, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.proc = proc
        self.log = log

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self) -> int:
        """SIGTERM, as kubelet's pod deletion sends; the plugin's exit status."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        return self.proc.returncode


@contextlib.contextmanager
def device_plugin(
    nvidia: NvidiaBinaries,
    root: DriverRoot,
    plugin_dir: str,
    log: Path,
    *flags: str,
    env: dict[str, str] | None = None,
) -> Iterator[PluginProcess]:
    """The plugin for ``root``'s GPUs, registering with the peer serving ``plugin_dir``.

    ``--container-driver-root`` is where the plugin itself finds ``libnvidia-ml.so.1`` (a process on
    the host gives the root itself); ``--driver-root`` is the host path it would put in CDI specs.
    """
    argv = [
        "unshare",
        "--mount",  # and private propagation, unshare's default: nothing goes back to the host
        "--",
        "/bin/sh",
        "-c",
        _NAMESPACE_SCRIPT,
        "gs-nvidia-dp",
        plugin_dir,
        str(nvidia.device_plugin),
        f"--driver-root={root.path}",
        f"--container-driver-root={root.path}",
        *flags,
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            argv, env=env if env is not None else binary_env(), stdout=out, stderr=subprocess.STDOUT
        )
    plugin = PluginProcess(proc, log)
    try:
        yield plugin
    finally:
        plugin.stop()
