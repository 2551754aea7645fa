"""Which containerd, where a private instance keeps its files, and its config file: plain data.

The generated config carries the machine's traps from docs/testing-containerd.md: cgroupfs,
``restrict_oom_score_adj = true``, overlayfs, NRI on with a 2 s request timeout, the locally built
pause image as sandbox image, a random stream-server port (two instances may run at once).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from localcluster.images import PAUSE_IMAGE
from localcluster.paths import cache_dir

VERSIONS = ("1.7.24", "2.x")
RUNC = Path("/usr/sbin/runc")
_INSTALL_HINT = "run `make containerd-deps` (hack/containerd/install.sh)"
NRI_REQUEST_TIMEOUT = "2s"
NRI_REGISTRATION_TIMEOUT = "5s"


class InstallMissing(RuntimeError):
    """A binary of the requested containerd version is not installed; the message says how to get it."""


@dataclass(frozen=True)
class ContainerdInstall:
    version: str  # "1.7.24" or "2.x"
    bin_dir: Path

    @property
    def containerd(self) -> Path:
        return self.bin_dir / "containerd"

    @property
    def ctr(self) -> Path:
        return self.bin_dir / "ctr"

    @property
    def shim(self) -> Path:
        return self.bin_dir / "containerd-shim-runc-v2"

    @property
    def is_v2(self) -> bool:
        return self.version != "1.7.24"

    @property
    def device_injector(self) -> Path | None:
        """The Go NRI device-injector built next to containerd 2.x (benchmark baseline), if present."""
        path = self.bin_dir / "nri-device-injector"
        return path if path.is_file() else None


def find_install(version: str, cache: Path | None = None) -> ContainerdInstall:
    """Locate an installed containerd; raise InstallMissing naming the command that installs it."""
    root = (cache or cache_dir()) / "containerd"
    if version == "1.7.24":
        inst = ContainerdInstall(version, root / "1.7.24" / "usr" / "bin")
        how = f"{_INSTALL_HINT}, step `base`"
    elif version == "2.x":
        inst = ContainerdInstall(version, root / "2.x" / "bin")
        how = (
            f"{_INSTALL_HINT}, step `go` (needs the Go toolchain and the Go module proxy serving"
            " github.com/containerd/containerd/v2; when it cannot build, it prints SKIP and why)"
        )
    else:
        raise ValueError(f"unknown containerd version {version!r}; known: {', '.join(VERSIONS)}")
    missing = [p.name for p in (inst.containerd, inst.ctr, inst.shim) if not os.access(p, os.X_OK)]
    if missing:
        raise InstallMissing(f"containerd {version}: {', '.join(missing)} not found in {inst.bin_dir}; {how}")
    if not os.access(RUNC, os.X_OK):
        raise InstallMissing(f"runc not found at {RUNC}; {_INSTALL_HINT}, step `base`")
    return inst


@dataclass(frozen=True)
class Paths:
    """The private layout of one instance (short: Unix socket paths are limited to 107 bytes)."""

    base: Path

    def __getattr__(self, name: str) -> Path:
        try:
            return self.base / _LAYOUT[name]
        except KeyError:
            raise AttributeError(name) from None


_LAYOUT = {
    "root": "root",
    "state": "state",
    "address": "cd.sock",
    "nri_socket": "nri.sock",
    "runc_root": "runc",
    "cni_dir": "cni",
    "cdi_dir": "cdi",
    "nri_dir": "nri",
    "config": "config.toml",
    "log": "containerd.log",
}


def render_config(inst: ContainerdInstall, paths: Paths, *, nri: bool = True, extra: str = "") -> str:
    """The containerd config for this instance: version 2 schema for 1.7, version 3 for 2.x."""
    if not inst.is_v2:
        return f"version = 2\n{_head(paths)}{_cri_1_7(paths)}{_nri(paths, nri)}{extra}\n"
    return f"version = 3\n{_head(paths)}{_cri_2(paths)}{_nri(paths, nri)}{extra}\n"


def _head(paths: Paths) -> str:
    return f"""
root = "{paths.root}"
state = "{paths.state}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "{paths.address}"
[ttrpc]
  address = "{paths.address}.ttrpc"
[debug]
  level = "info"
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{paths.base}/opt"
"""


def _nri(paths: Paths, nri: bool) -> str:
    return f"""
[plugins."io.containerd.nri.v1.nri"]
  disable = {str(not nri).lower()}
  disable_connections = false
  socket_path = "{paths.nri_socket}"
  plugin_path = "{paths.nri_dir}/plugins"
  plugin_config_path = "{paths.nri_dir}/conf.d"
  plugin_registration_timeout = "{NRI_REGISTRATION_TIMEOUT}"
  plugin_request_timeout = "{NRI_REQUEST_TIMEOUT}"
"""


def _runc_options(paths: Paths) -> str:
    return f"""
        SystemdCgroup = false
        BinaryName = "{RUNC}"
        Root = "{paths.runc_root}"
"""


def _cri_1_7(paths: Paths) -> str:
    return f"""
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  systemd_cgroup = false
  disable_apparmor = true
  enable_cdi = true
  cdi_spec_dirs = ["{paths.cdi_dir}"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{paths.cni_dir}/bin"
    conf_dir = "{paths.cni_dir}/conf"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]{_runc_options(paths)}"""


def _cri_2(paths: Paths) -> str:
    return f"""
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{PAUSE_IMAGE}"
[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
  disable_apparmor = true
  cdi_spec_dirs = ["{paths.cdi_dir}"]
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{paths.cni_dir}/bin"]
    conf_dir = "{paths.cni_dir}/conf"
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]{_runc_options(paths)}
[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""
