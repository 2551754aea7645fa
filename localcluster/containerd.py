"""Start a real containerd (1.7.24 or 2.x) in a private temp dir for the integration tiers.

Everything the instance touches is private: root, state, the gRPC socket (CRI lives there), the NRI
socket, runc's `Root`, a CNI dir, and a cgroup parent (`Containerd.cgroup_parent`, which
`tests.harness.cri.CriClient` puts on every pod). The shim sockets are the one exception containerd
does not let us move (`/run/containerd/s/<hash>`); `close()` ends the shims of this instance by PID.

The generated config carries the machine's traps from test-environment.md: cgroupfs,
`restrict_oom_score_adj = true`, overlayfs, NRI on with a 2 s request timeout, the locally built
pause image as sandbox image, a random stream-server port (two instances may run at once).

    inst = find_install("1.7.24")            # or "2.x"; InstallMissing says how to install
    with Containerd(inst) as cd:             # started, busybox and pause imported
        ... CriClient(cd.address) ...
        cd.restart()                         # same dirs, new process (NRI plugins must reconnect)
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tests.harness.cri import CriClient, CriError
from tests.harness.images import PAUSE_IMAGE, ensure_images
from tests.harness.lifecycle import Lifecycle, terminate

VERSIONS = ("1.7.24", "2.x")
RUNC = Path("/usr/sbin/runc")
_INSTALL_HINT = "run `make containerd-deps` (hack/containerd/install.sh)"
NRI_REQUEST_TIMEOUT = "2s"
NRI_REGISTRATION_TIMEOUT = "5s"


class InstallMissing(RuntimeError):
    """A binary of the requested containerd version is not installed; the message says how to get it."""


class ContainerdError(RuntimeError):
    """containerd did not start, stop or import as expected; the message carries its log tail."""


def cache_root() -> Path:
    return Path(os.environ.get("GPUSHARE_CACHE", "/root/.cache/gpushare"))


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
    root = (cache or cache_root()) / "containerd"
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
    nri_section = f"""
[plugins."io.containerd.nri.v1.nri"]
  disable = {str(not nri).lower()}
  disable_connections = false
  socket_path = "{paths.nri_socket}"
  plugin_path = "{paths.nri_dir}/plugins"
  plugin_config_path = "{paths.nri_dir}/conf.d"
  plugin_registration_timeout = "{NRI_REGISTRATION_TIMEOUT}"
  plugin_request_timeout = "{NRI_REQUEST_TIMEOUT}"
"""
    runc_options = f"""
        SystemdCgroup = false
        BinaryName = "{RUNC}"
        Root = "{paths.runc_root}"
"""
    head = f"""
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
    if not inst.is_v2:
        cri = f"""
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
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]{runc_options}"""
        return f"version = 2\n{head}{cri}{nri_section}{extra}\n"
    cri = f"""
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
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]{runc_options}
[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""
    return f"version = 3\n{head}{cri}{nri_section}{extra}\n"


def mounts_under(base: Path) -> list[str]:
    """Mount points below `base`, deepest first (the order they must be unmounted in)."""
    found: list[str] = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mount_point = line.split()[4].replace("\\040", " ")
            if mount_point == str(base) or mount_point.startswith(f"{base}/"):
                found.append(mount_point)
    return sorted(found, key=len, reverse=True)


def shim_pids(address: str) -> list[int]:
    """PIDs of the runc shims serving this instance: a shim's argv names its containerd address.

    Only shims: other processes may name the address too (a kubelet's runtime endpoint) and are
    not ours to kill.
    """
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if Path(argv[0].decode(errors="replace")).name.startswith("containerd-shim") and address.encode() in argv:
            pids.append(int(entry.name))
    return pids


def cgroup_pids(parent: str) -> set[int]:
    """Every process in the cgroup subtree `parent`, across all hierarchies."""
    pids: set[int] = set()
    for ctl in Path("/sys/fs/cgroup").iterdir():
        top = ctl / parent.lstrip("/")
        for procs in top.rglob("cgroup.procs") if top.is_dir() else ():
            with contextlib.suppress(OSError, ValueError):
                pids.update(int(line) for line in procs.read_text().split())
    return pids


def _remove_cgroups(parent: str) -> None:
    """rmdir the cgroup subtree `parent` in every v1 controller and the unified tree, leaves first."""
    for ctl in Path("/sys/fs/cgroup").iterdir():
        top = ctl / parent.lstrip("/")
        if not top.is_dir():
            continue
        for dirpath, _dirs, _files in sorted(os.walk(top), key=lambda t: len(t[0]), reverse=True):
            with contextlib.suppress(OSError):  # busy (a process still in it) or already gone
                os.rmdir(dirpath)


class Containerd(Lifecycle):
    """One private containerd process. Use as a context manager, or call start()/close()."""

    def __init__(
        self,
        install: ContainerdInstall,
        *,
        nri: bool = True,
        extra_config: str = "",
        base_dir: Path | None = None,
        import_images: bool = True,
        preconnected_plugins: Mapping[str, str] | None = None,
    ) -> None:
        """`preconnected_plugins`: file name ("10-gpushare") -> executable text, placed in the private
        `plugin_path` so containerd launches them itself with the socket as fd 3. Only for 2.x: on
        1.7.24 a plugin that fails to register makes containerd exit (test-environment.md)."""
        self.install = install
        self.paths = Paths(base_dir or Path(tempfile.mkdtemp(prefix="gs-cd-", dir="/tmp")))
        self.cgroup_parent = f"/gpushare-test-{self.paths.base.name}"
        self._nri = nri
        self._extra = extra_config
        self._import_images = import_images
        self._preconnected = dict(preconnected_plugins or {})
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_offset = 0

    # --- public surface -------------------------------------------------------------------------
    @property
    def address(self) -> str:
        return str(self.paths.address)

    @property
    def nri_socket(self) -> str:
        return str(self.paths.nri_socket)

    @property
    def config_path(self) -> Path:
        return self.paths.config

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def start(self, timeout_s: float = 30.0) -> None:
        p = self.paths
        for d in (p.root, p.state, p.runc_root, p.cdi_dir, p.cni_dir / "bin", p.cni_dir / "conf"):
            d.mkdir(parents=True, exist_ok=True)
        for d in (p.nri_dir / "plugins", p.nri_dir / "conf.d"):
            d.mkdir(parents=True, exist_ok=True)
        for name, text in self._preconnected.items():
            (p.nri_dir / "plugins" / name).write_text(text)
            (p.nri_dir / "plugins" / name).chmod(0o755)
        p.config.write_text(render_config(self.install, p, nri=self._nri, extra=self._extra))
        self._log_offset = p.log.stat().st_size if p.log.exists() else 0
        with open(p.log, "ab") as log:
            self._proc = subprocess.Popen(
                [str(self.install.containerd), "--config", str(p.config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                # containerd finds the shim on PATH: put this version's own shim first.
                env={**os.environ, "PATH": f"{self.install.bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"},
                start_new_session=True,
            )
        self._wait_ready(timeout_s)
        if self._import_images:
            images = ensure_images()
            for image in images:
                self.ctr("images", "import", "--no-unpack", str(image.path))
            self._wait_cri_images([image.name for image in images], timeout_s)

    def stop(self, timeout_s: float = 15.0) -> None:
        """Stop containerd by PID (SIGTERM, then SIGKILL); its shims and containers keep running."""
        proc, self._proc = self._proc, None
        if proc is not None:
            terminate(proc, timeout_s)

    def restart(self, timeout_s: float = 30.0) -> None:
        """A new containerd process over the same root and state (pods survive, NRI plugins are dropped)."""
        self.stop()
        self.start(timeout_s)

    def close(self) -> None:
        """Remove every pod through CRI, stop containerd, end stray shims, unmount, remove cgroups and files."""
        if self.pid is not None:
            self._remove_all_pods()
        self.stop()
        # Pods CRI could not remove (containerd already gone): their processes sit in our cgroup
        # parent and outlive a killed shim, so they go first.
        for pid in [*cgroup_pids(self.cgroup_parent), *shim_pids(self.address)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while cgroup_pids(self.cgroup_parent) and time.monotonic() < deadline:
            time.sleep(0.05)
        for mount_point in mounts_under(self.paths.base):
            subprocess.run(["umount", "-l", mount_point], check=False, capture_output=True)
        _remove_cgroups(self.cgroup_parent)
        shutil.rmtree(self.paths.base, ignore_errors=True)

    def ctr(self, *args: str, timeout_s: float = 60.0) -> str:
        """Run `ctr -n k8s.io` against this instance; raise ContainerdError with its output on failure."""
        cmd = [str(self.install.ctr), "--address", self.address, "-n", "k8s.io", *args]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
        if res.returncode != 0:
            raise ContainerdError(f"{' '.join(cmd)} failed ({res.returncode}): {res.stderr.strip()}")
        return res.stdout

    def log_text(self, since_start: bool = False) -> str:
        try:
            with open(self.paths.log, "rb") as f:
                if since_start:
                    f.seek(self._log_offset)
                return f.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    # --- internals ------------------------------------------------------------------------------
    def _fail(self, what: str) -> ContainerdError:
        tail = "\n".join(self.log_text(since_start=True).splitlines()[-25:])
        return ContainerdError(f"containerd {self.install.version} {what}; log {self.paths.log}:\n{tail}")

    def _wait_ready(self, timeout_s: float) -> None:
        # Ready = the CRI answers Version (the NRI socket appears with CRI, when NRI is on).
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc is None or self._proc.poll() is not None:
                raise self._fail("exited during start")
            if self.paths.address.exists() and (not self._nri or self.paths.nri_socket.exists()):
                try:
                    with CriClient(self.address, cgroup_parent=self.cgroup_parent) as cri:
                        cri.version(timeout_s=2.0)
                    return
                except CriError:
                    pass
            time.sleep(0.05)
        raise self._fail(f"not ready after {timeout_s} s")

    def _wait_cri_images(self, images: list[str], timeout_s: float) -> None:
        """CRI learns imported images from events; wait until it knows ours (else it tries to pull them)."""
        deadline = time.monotonic() + timeout_s
        with CriClient(self.address) as cri:
            for image in images:
                while not cri.has_image(image):
                    if time.monotonic() > deadline:
                        raise self._fail(f"CRI never listed the imported image {image}")
                    time.sleep(0.02)

    def _remove_all_pods(self) -> None:
        try:
            with CriClient(self.address, cgroup_parent=self.cgroup_parent) as cri:
                for pod_id in cri.list_pod_ids():
                    cri.remove_pod(pod_id)
        except CriError:
            pass  # containerd is going away anyway; the shim kill and unmount below finish the job
