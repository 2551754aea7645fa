"""NVIDIA's device plugin as a process, registering with a KubeletPeer instead of kubelet.

k8s-device-plugin v0.17.4 serves its socket at ``/var/lib/kubelet/device-plugins/nvidia-gpu.sock``
whatever ``--kubelet-socket`` says (``pluginapi.DevicePluginPath`` is compiled in), and tells kubelet
only the socket's name. So it runs in a mount namespace of its own where /var/lib is a private tmpfs
and that directory is a bind mount of the peer's, as localcluster runs kubelet
(localcluster/component_config.py): the peer finds the plugin's socket next to its own, and this
machine's /var/lib is never touched.

With a CDI ``--device-list-strategy`` the plugin also writes its own CDI spec (kind
``k8s.device-plugin.nvidia.com/gpu``) to ``/var/run/cdi``, a path compiled in too
(``internal/cdi/cdi.go``); given ``cdi_dir``, the namespace puts a private tmpfs on /run and that
directory at /run/cdi, so the spec lands there and this machine's /run is never touched.
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
_PLUGIN_DIR_MOUNTS = (
    "set -e; "
    "mount -t tmpfs -o mode=0755,size=1m gs-nvidia-varlib /var/lib; "
    f"mkdir -p {SYSTEM_PLUGIN_DIR}; "
    f'mount --bind "$1" {SYSTEM_PLUGIN_DIR}; '
)
_NAMESPACE_SCRIPT = _PLUGIN_DIR_MOUNTS + 'shift; exec "$@"'
# The same, and $2 at /run/cdi (/var/run is a link to /run).
_NAMESPACE_SCRIPT_CDI = (
    _PLUGIN_DIR_MOUNTS
    + "mount -t tmpfs -o mode=0755,size=1m gs-nvidia-run /run; mkdir /run/cdi; "
    + 'mount --bind "$2" /run/cdi; shift 2; exec "$@"'
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


def plugin_argv(
    nvidia: NvidiaBinaries, root: DriverRoot, plugin_dir: str, *flags: str, cdi_dir: str | None = None
) -> list[str]:
    """The plugin's command line for ``root``'s GPUs, in a mount namespace of its own (module docstring).

    ``--container-driver-root`` is where the plugin itself finds ``libnvidia-ml.so.1`` (a process on
    the host gives the root itself); ``--driver-root`` is the host path it would put in CDI specs.
    ``cdi_dir``: where the plugin's /var/run/cdi is, for the CDI strategies (None: the plugin's
    namespace leaves /run as the host's, for strategies that write no spec).
    """
    namespace = [_NAMESPACE_SCRIPT, "gs-nvidia-dp", plugin_dir]
    if cdi_dir is not None:
        namespace = [_NAMESPACE_SCRIPT_CDI, "gs-nvidia-dp", plugin_dir, cdi_dir]
    return [
        "unshare",
        "--mount",  # and private propagation, unshare's default: nothing goes back to the host
        "--",
        "/bin/sh",
        "-c",
        *namespace,
        str(nvidia.device_plugin),
        f"--driver-root={root.path}",
        f"--container-driver-root={root.path}",
        *flags,
    ]


@contextlib.contextmanager
def device_plugin(
    nvidia: NvidiaBinaries,
    root: DriverRoot,
    plugin_dir: str,
    log: Path,
    *flags: str,
    env: dict[str, str] | None = None,
    cdi_dir: str | None = None,
) -> Iterator[PluginProcess]:
    """The plugin for ``root``'s GPUs, registering with the peer serving ``plugin_dir`` (``plugin_argv``)."""
    argv = plugin_argv(nvidia, root, plugin_dir, *flags, cdi_dir=cdi_dir)
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            argv, env=env if env is not None else binary_env(), stdout=out, stderr=subprocess.STDOUT
        )
    plugin = PluginProcess(proc, log)
    try:
        yield plugin
    finally:
        plugin.stop()
