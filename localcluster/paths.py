"""Where the repository is, and the one cache the expensive builds share.

The shell scripts under hack/ spell the same default as
``CACHE="${GPUSHARE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpushare}"`` and the Makefile exports it,
so every tool finds the same builds. ``NvidiaBinaries`` finds NVIDIA's device plugin and Container
Toolkit there, as ``make nvidia-deps`` builds them.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from localcluster.errors import ClusterUnavailable

REPO = Path(__file__).resolve().parents[1]


def cache_dir() -> Path:
    """``$GPUSHARE_CACHE``, else ``${XDG_CACHE_HOME:-$HOME/.cache}/gpushare``."""
    explicit = os.environ.get("GPUSHARE_CACHE")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "gpushare"


# NVIDIA's own user space, built by `make nvidia-deps` (hack/nvidia/build.sh, mk/nvidia.mk: the same
# pins) into <cache>/nvidia/<project>/<version>/bin, each bin/ complete only with its stamp.
NVIDIA_DEVICE_PLUGIN_VERSION = "v0.17.4"
NVIDIA_CTK_VERSION = "v1.20.2"
NVIDIA_BUILD_HINT = "make nvidia-deps"


@dataclasses.dataclass(frozen=True)
class NvidiaBinaries:
    """k8s-device-plugin's and the NVIDIA Container Toolkit's commands, as built into the cache."""

    device_plugin: Path
    ctk: Path
    container_runtime: Path
    cdi_hook: Path
    container_runtime_hook: Path  # only the runtime's legacy mode puts it in a spec

    @classmethod
    def find(cls, cache: Path | None = None) -> NvidiaBinaries:
        """The cached binaries, or ClusterUnavailable naming what is missing and the command that builds it."""
        nvidia = (cache or cache_dir()) / "nvidia"
        plugin_bin = nvidia / "k8s-device-plugin" / NVIDIA_DEVICE_PLUGIN_VERSION / "bin"
        toolkit_bin = nvidia / "container-toolkit" / NVIDIA_CTK_VERSION / "bin"
        found = cls(
            device_plugin=plugin_bin / "nvidia-device-plugin",
            ctk=toolkit_bin / "nvidia-ctk",
            container_runtime=toolkit_bin / "nvidia-container-runtime",
            cdi_hook=toolkit_bin / "nvidia-cdi-hook",
            container_runtime_hook=toolkit_bin / "nvidia-container-runtime-hook",
        )
        # The stamp is written last: binaries without it are from a build that did not finish.
        wanted = [*dataclasses.astuple(found), plugin_bin / ".complete", toolkit_bin / ".complete"]
        missing = [str(p) for p in wanted if not p.is_file()]
        if missing:
            raise ClusterUnavailable(
                f"NVIDIA binaries missing: {', '.join(missing)}; build them with: {NVIDIA_BUILD_HINT}"
            )
        return found
