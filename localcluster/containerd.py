"""A real containerd (1.7.24 or 2.x) in a private temp dir, for the integration tiers and the cluster.

Everything the instance touches is private: root, state, the gRPC socket (CRI lives there), the NRI
socket, runc's ``Root``, a CNI dir, and a cgroup parent (``Containerd.cgroup_parent``, which
``localcluster.cri.CriClient`` puts on every pod). The shim sockets are the one exception containerd
does not let us move (``/run/containerd/s/<hash>``); ``close()`` ends the shims of this instance by PID.
What it is told is in ``containerd_config``.

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
from pathlib import Path

from localcluster.containerd_config import (
    VERSIONS,
    ContainerdInstall,
    InstallMissing,
    Paths,
    find_install,
    render_config,
)
from localcluster.cri import CriClient, CriError
from localcluster.host import all_pids, cgroup_pids, cmdline, remove_cgroup_root, unmount_below
from localcluster.images import ensure_images
from localcluster.lifecycle import Lifecycle, terminate

# What containerd's NRI adaptation logs right after adding a plugin to the ones it calls, in its
# text log format: 'msg="plugin \"10-gpushare\" connected"' (1.7), '... connected and synchronized"' (2.x).
_NRI_PLUGIN_ADDED = '\\" connected'

__all__ = ["VERSIONS", "Containerd", "ContainerdError", "ContainerdInstall", "InstallMissing", "find_install"]


class ContainerdError(RuntimeError):
    """containerd did not start, stop or import as expected; the message carries its log tail."""


def shim_pids(address: str) -> list[int]:
    """PIDs of the runc shims serving this instance: a shim's argv names its containerd address.

    Only shims: other processes may name the address too (a kubelet's runtime endpoint) and are
    not ours to kill.
    """
    return [
        pid
        for pid in all_pids()
        if (argv := cmdline(pid)) and Path(argv[0]).name.startswith("containerd-shim") and address in argv
    ]


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
        1.7.24 a plugin that fails to register makes containerd exit (docs/nri.md)."""
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
        unmount_below(self.paths.base)
        remove_cgroup_root(self.cgroup_parent)
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

    def nri_plugin_registrations(self, name: str) -> int:
        """How often this instance has added the NRI plugin ``name`` to the plugins it calls.

        containerd logs it once the plugin's Synchronize has returned. The plugin logs its own
        Synchronize before it returns, so only this line says that a CreateContainer from now on
        reaches the plugin (and that a validator requiring it finds it)."""
        lines = self.log_text().splitlines()
        return sum(1 for line in lines if f"-{name}{_NRI_PLUGIN_ADDED}" in line)

    def wait_nri_plugin(self, name: str, *, more_than: int, timeout_s: float = 30.0) -> None:
        """Wait until containerd has added the plugin ``name`` more than ``more_than`` times."""
        deadline = time.monotonic() + timeout_s
        while self.nri_plugin_registrations(name) <= more_than:
            if time.monotonic() > deadline:
                raise self._fail(f"did not add the NRI plugin {name!r} within {timeout_s:g} s")
            time.sleep(0.05)

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
