"""Which containerd, where a private instance keeps its files, and its config file: plain data.

The generated config carries the machine's traps from docs/testing-containerd.md: cgroupfs,
``restrict_oom_score_adj = true``, overlayfs, NRI on with a 2 s request timeout, the locally built
pause image as sandbox image, a random stream-server port (two instances may run at once).
Optionally (``render_nri_validator``, handed to ``Containerd(extra_config=...)``) containerd 2.x's
built-in NRI validator, which refuses to create a container while a plugin it requires is absent;
without it the rendered file is exactly what it always was.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from localcluster.images import PAUSE_IMAGE
from localcluster.paths import cache_dir

VERSIONS = ("1.7.24", "2.x")
RUNC = Path("/usr/sbin/runc")
_INSTALL_HINT = "run `make containerd-deps` (hack/containerd/install.sh)"
NRI_REQUEST_TIMEOUT = "2s"
NRI_REGISTRATION_TIMEOUT = "5s"
# NRI's own pod annotation (containerd 2.2+): a YAML list of the plugins that must be connected to
# containerd when a container is created; "/container.<name>" after the key scopes it to one
# container. The validator reads it from the pod sandbox only, never from a container's annotations.
NRI_REQUIRED_PLUGINS_ANNOTATION = "required-plugins.noderesource.dev"


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


@dataclass(frozen=True)
class RequiredPlugins:
    """What containerd 2.x's NRI default validator is told to require (docs/nri.md, "Failing closed").

    ``everywhere``: plugin names (``gpushare``) or ``<index>-<name>`` that every container on the node
    needs; empty means only the containers whose pod asks, through NRI_REQUIRED_PLUGINS_ANNOTATION.
    ``tolerate_annotation``: a pod annotation key whose value ``"true"`` (pod-wide, or with
    ``/container.<name>``) exempts a container from both; empty means no exemption exists.
    """

    everywhere: tuple[str, ...] = ()
    tolerate_annotation: str = ""


_PLUGIN_NAME = re.compile(r"^([0-9]{2}-)?[A-Za-z0-9][A-Za-z0-9._-]*$")
_ANNOTATION_KEY = re.compile(r"^([a-z0-9]([a-z0-9.-]*[a-z0-9])?/)?[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")


def render_nri_validator(inst: ContainerdInstall, required: RequiredPlugins) -> str:
    """The TOML that turns on the validator with ``required``, to append to this install's config.

    Raises ValueError for containerd 1.7 (its NRI v0.6.1 has no validator, and 1.7.24 silently
    ignores the table, so rendering it there would only pretend) and for a name or key that is not
    one: both end up inside TOML strings and in a plugin-name lookup.
    """
    if not inst.is_v2:
        raise ValueError(
            f"containerd {inst.version} has no NRI validator (NRI v0.6.1); required plugins need containerd 2.2 or"
            " later, and 1.7 creates containers without a plugin that is down (docs/nri.md)"
        )
    bad = [name for name in required.everywhere if not _PLUGIN_NAME.match(name)]
    if bad:
        raise ValueError(f"required plugin names must look like `gpushare` or `10-gpushare`; got {bad!r}")
    key = required.tolerate_annotation
    if key and not _ANNOTATION_KEY.match(key):
        raise ValueError(f"tolerate annotation {key!r} is not a Kubernetes annotation key ([prefix/]name)")
    names = ", ".join(f'"{name}"' for name in required.everywhere)
    return f"""
[plugins."io.containerd.nri.v1.nri".default_validator]
  enable = true
  required_plugins = [{names}]
  tolerate_missing_plugins_annotation = "{key}"
"""


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
