"""A real one-node Kubernetes on this machine, for the integration tiers and the demo (docs/cluster.md).

etcd, kube-apiserver, kube-controller-manager, kube-scheduler, containerd 2.x (NRI on) and kubelet,
all on 127.0.0.1 with private ports, one private root directory, private cgroups, and a private
mount namespace for kubelet. Everything is started here and stopped here, by PID.

    # a test tier: in its conftest.py
    from tests.harness.cluster import cluster  # noqa: F401  (session-scoped fixture)

    # a person:
    .venv/bin/python -m tests.harness.cluster up     # prints export KUBECONFIG=...
    .venv/bin/python -m tests.harness.cluster down

Why some things look the way they do:

- kubelet hard-codes its device-plugin directory to /var/lib/kubelet/device-plugins/. kubelet runs
  in a mount namespace of its own where /var/lib and /var/log are private tmpfs and that path is a
  bind mount of ``<root>/kubelet/device-plugins``; the system paths are never touched. Its root dir
  is a shared bind mount, so the volumes kubelet mounts there are seen by containerd outside.
- kubelet sets six kernel sysctls on start (vm.overcommit_memory, kernel.panic, ...). They are
  global: the machine's values are recorded once (/run) before the first kubelet starts and
  written back when the last kubelet of ours stops.
- cgroups here are v1: kubelet v1.34 runs on them with ``failCgroupV1: false``; all pod cgroups
  live under ``/<root name>`` in every hierarchy and are removed on teardown.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare.errors import GpushareError
from tests.harness.containerd import Containerd, ContainerdInstall, InstallMissing, find_install
from tests.harness.cri import CriClient, CriError

KUBE_VERSION = os.environ.get("GPUSHARE_KUBE_VERSION", "v1.34.4")
# kubelet refuses --node-ip=127.0.0.1 (loopback) and then publishes no address at all, so the
# apiserver cannot reach it for logs/exec. A node *named* by an IP gets that IP as InternalIP
# unchecked (pkg/kubelet/nodestatus NodeAddress, step 2), which is exactly what we want.
NODE_NAME = "127.0.0.1"
SERVICE_CIDR = "10.96.0.0/24"
DEFAULT_CLI_ROOT = Path("/tmp/gs-kube")
CGROUP_FS = Path("/sys/fs/cgroup")
SYSCTL_DIR = Path("/proc/sys")
# What kubelet's container manager writes on start (pkg/kubelet/cm setupKernelTunables).
KUBELET_SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)
# /run: cleared by a reboot, which also resets the sysctls.
SYSCTL_RECORD = Path("/run/gpushare-kube-sysctls.json")
KUBE_COMMANDS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl")
BUILD_HINT = "make deps   (or: hack/kube/build.sh && hack/kube/install-etcd.sh && hack/containerd/install.sh)"


class ClusterError(GpushareError):
    """The cluster could not be started, reached, or torn down. The message says which part and why."""


class ClusterUnavailable(ClusterError):
    """A binary the cluster needs is not installed; the message names the command that installs it."""


def cache_dir() -> Path:
    return Path(os.environ.get("GPUSHARE_CACHE", str(Path.home() / ".cache" / "gpushare")))


# ---------------------------------------------------------------------------------------------
# Plain data: where things are, and what each program is told. No processes, no sockets.
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Binaries:
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    kubelet: Path
    kubectl: Path
    etcd: Path

    @classmethod
    def find(cls, cache: Path, version: str = KUBE_VERSION) -> Binaries:
        """The cached binaries, or ClusterUnavailable naming what is missing and how to build it."""
        kube = cache / "kube" / version / "bin"
        etcds = sorted((cache / "etcd").glob("*/usr/bin/etcd"))
        missing = [str(kube / c) for c in KUBE_COMMANDS if not (kube / c).is_file()]
        if not etcds:
            missing.append(str(cache / "etcd" / "<version>" / "usr/bin/etcd"))
        if missing:
            raise ClusterUnavailable(f"cluster binaries missing: {', '.join(missing)}; build them with: {BUILD_HINT}")
        return cls(
            kube_apiserver=kube / "kube-apiserver",
            kube_controller_manager=kube / "kube-controller-manager",
            kube_scheduler=kube / "kube-scheduler",
            kubelet=kube / "kubelet",
            kubectl=kube / "kubectl",
            etcd=etcds[-1],
        )


@dataclasses.dataclass(frozen=True)
class Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int
    kubelet: int
    kubelet_healthz: int


@dataclasses.dataclass(frozen=True)
class Layout:
    """Every path of one cluster, all under ``root`` (a short /tmp path: unix sockets are limited)."""

    root: Path

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def etcd_data(self) -> Path:
        return self.root / "etcd"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def kubelet_root(self) -> Path:
        return self.root / "kubelet"

    @property
    def device_plugin_dir(self) -> Path:
        return self.kubelet_root / "device-plugins"

    @property
    def pod_resources_socket(self) -> Path:
        return self.kubelet_root / "pod-resources" / "kubelet.sock"

    @property
    def pod_logs(self) -> Path:
        return self.root / "pod-logs"

    @property
    def kubelet_config(self) -> Path:
        return self.root / "kubelet-config.yaml"

    @property
    def containerd_dir(self) -> Path:
        return self.root / "containerd"

    @property
    def state_file(self) -> Path:
        return self.root / "cluster.json"

    @property
    def cgroup_root(self) -> str:
        """kubelet's cgroupRoot: one private top-level cgroup per cluster, named after the root dir."""
        return "/" + self.root.name

    def kubeconfig_for(self, user: str) -> Path:
        return self.pki / f"{user}.kubeconfig"


# Client identities: (file stem, CN, O). system:masters for the controller manager and the
# apiserver's kubelet client keeps RBAC out of the way; kubelet and scheduler use their real roles.
CLIENT_CERTS: tuple[tuple[str, str, str], ...] = (
    ("admin", "gpushare-admin", "system:masters"),
    ("controller-manager", "system:kube-controller-manager", "system:masters"),
    ("scheduler", "system:kube-scheduler", ""),
    ("kubelet", f"system:node:{NODE_NAME}", "system:nodes"),
    ("apiserver-kubelet-client", "kube-apiserver-kubelet-client", "system:masters"),
)
SERVER_CERTS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (
        "apiserver",
        "kube-apiserver",
        ("IP:127.0.0.1", "IP:10.96.0.1", "DNS:localhost", "DNS:kubernetes", "DNS:kubernetes.default"),
    ),
    ("kubelet-serving", "gpushare-kubelet", ("IP:127.0.0.1", "DNS:localhost")),
)


def kubeconfig_doc(server: str, pki: Path, user: str) -> dict[str, Any]:
    """A kubeconfig that authenticates with the client certificate ``<pki>/<user>.crt``."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "gpushare", "cluster": {"server": server, "certificate-authority": str(pki / "ca.crt")}}],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate": str(pki / f"{user}.crt"),
                    "client-key": str(pki / f"{user}.key"),
                },
            }
        ],
        "contexts": [{"name": "gpushare", "context": {"cluster": "gpushare", "user": user}}],
        "current-context": "gpushare",
    }


def etcd_args(binaries: Binaries, layout: Layout, ports: Ports) -> list[str]:
    client = f"http://127.0.0.1:{ports.etcd_client}"
    peer = f"http://127.0.0.1:{ports.etcd_peer}"
    return [
        str(binaries.etcd),
        "--name=gpushare",
        f"--data-dir={layout.etcd_data}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=gpushare={peer}",
        # A throwaway test store: fsync buys nothing and costs seconds on a shared disk.
        "--unsafe-no-fsync",
        "--log-level=warn",
    ]


def apiserver_args(binaries: Binaries, layout: Layout, ports: Ports) -> list[str]:
    pki = layout.pki
    return [
        str(binaries.kube_apiserver),
        f"--etcd-servers=http://127.0.0.1:{ports.etcd_client}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={ports.apiserver}",
        f"--cert-dir={pki}",
        f"--tls-cert-file={pki / 'apiserver.crt'}",
        f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--authorization-mode=Node,RBAC",
        f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
        f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
        "--kubelet-preferred-address-types=InternalIP",
        "--allow-privileged=true",
        # The "kubernetes" Endpoints would carry 127.0.0.1, which the API refuses (loopback).
        "--endpoint-reconciler-type=none",
        "--profiling=false",
    ]


def controller_manager_args(binaries: Binaries, layout: Layout) -> list[str]:
    pki = layout.pki
    return [
        str(binaries.kube_controller_manager),
        f"--kubeconfig={layout.kubeconfig_for('controller-manager')}",
        "--bind-address=127.0.0.1",
        "--secure-port=0",  # nothing scrapes it; one port fewer
        "--leader-elect=false",
        f"--root-ca-file={pki / 'ca.crt'}",
        f"--service-account-private-key-file={pki / 'sa.key'}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--use-service-account-credentials=false",
        "--profiling=false",
    ]


def scheduler_args(binaries: Binaries, layout: Layout) -> list[str]:
    return [
        str(binaries.kube_scheduler),
        f"--kubeconfig={layout.kubeconfig_for('scheduler')}",
        "--bind-address=127.0.0.1",
        "--secure-port=0",
        "--leader-elect=false",
        "--profiling=false",
    ]


def kubelet_config_doc(layout: Layout, ports: Ports, cri_socket: Path) -> dict[str, Any]:
    """The static KubeletConfiguration. Relaxed eviction: a shared test machine is always "full"."""
    pki = layout.pki
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": "127.0.0.1",
        "port": ports.kubelet,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": ports.kubelet_healthz,
        "tlsCertFile": str(pki / "kubelet-serving.crt"),
        "tlsPrivateKeyFile": str(pki / "kubelet-serving.key"),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(pki / "ca.crt")},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "containerRuntimeEndpoint": f"unix://{cri_socket}",
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": layout.cgroup_root,
        "cgroupsPerQOS": True,
        "enforceNodeAllocatable": ["pods"],
        "failCgroupV1": False,
        "failSwapOn": False,
        # CAP_SYS_RESOURCE is missing here: lowering kubelet's own oom_score_adj would fail.
        "oomScoreAdj": 0,
        "registerNode": True,
        "podLogsDir": str(layout.pod_logs),
        "staticPodPath": "",
        "resolvConf": "/etc/resolv.conf",
        "clusterDomain": "cluster.local",
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "50Mi",
            "nodefs.available": "1%",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "1%",
        },
        "evictionPressureTransitionPeriod": "10s",
        # Faster status updates: tests wait on capacity and readiness changes.
        "nodeStatusUpdateFrequency": "4s",
        "nodeStatusReportFrequency": "10s",
        "syncFrequency": "10s",
        "fileCheckFrequency": "20s",
        "serializeImagePulls": False,
        "shutdownGracePeriod": "0s",
        "maxPods": 110,
    }


def kubelet_args(binaries: Binaries, layout: Layout) -> list[str]:
    """kubelet inside its own mount namespace (see the module docstring for why)."""
    # $1 = private device-plugin dir; the rest is kubelet's argv. /var/lib and /var/log become
    # private tmpfs in this namespace only, so kubelet's hard-coded system paths land in them.
    script = (
        "set -e; "
        'mount --make-private "$(findmnt -n -o TARGET -T /var/lib)"; '
        'mount --make-private "$(findmnt -n -o TARGET -T /var/log)"; '
        "mount -t tmpfs -o mode=0755,size=16m gs-kubelet-varlib /var/lib; "
        "mount -t tmpfs -o mode=0755,size=16m gs-kubelet-varlog /var/log; "
        "mkdir -p /var/lib/kubelet/device-plugins; "
        'mount --bind "$1" /var/lib/kubelet/device-plugins; '
        'shift; exec "$@"'
    )
    return [
        "unshare",
        "--mount",
        "--propagation",
        "unchanged",
        "--",
        "/bin/sh",
        "-c",
        script,
        "gs-kubelet-ns",
        str(layout.device_plugin_dir),
        str(binaries.kubelet),
        f"--config={layout.kubelet_config}",
        f"--kubeconfig={layout.kubeconfig_for('kubelet')}",
        f"--root-dir={layout.kubelet_root}",
        f"--cert-dir={layout.kubelet_root / 'pki'}",
        f"--hostname-override={NODE_NAME}",
        "--v=1",
    ]


def node_ready(node: dict[str, Any]) -> bool:
    conditions = node.get("status", {}).get("conditions", [])
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def mounts_under(mountinfo: str, root: Path) -> list[str]:
    """Mount points at or below ``root``, deepest (latest) first: the order to unmount them."""
    prefix = str(root).rstrip("/")
    found = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) < 5:
            continue
        # mountinfo escapes spaces and the like as octal (\040).
        point = fields[4].encode().decode("unicode_escape")
        if point == prefix or point.startswith(prefix + "/"):
            found.append(point)
    return list(reversed(found))


# ---------------------------------------------------------------------------------------------
# Side effects: certificates, processes, mounts, cgroups.
# ---------------------------------------------------------------------------------------------


def _run(argv: Sequence[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(list(argv), check=True, capture_output=True, text=True, **kw)
    except subprocess.CalledProcessError as e:
        raise ClusterError(f"{argv[0]} failed ({e.returncode}): {' '.join(argv)}\n{e.stderr.strip()}") from e


def make_pki(pki: Path) -> None:
    """A CA, server and client certificates (EC P-256, fast) and the service-account RSA key pair."""
    pki.mkdir(parents=True, exist_ok=True)

    def openssl(*args: str | Path) -> None:
        _run(["openssl", *(str(a) for a in args)])

    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    ca_crt, ca_key = pki / "ca.crt", pki / "ca.key"
    ca_ext = ("-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    openssl(
        "req", "-x509", *ec, "-days", "30", "-keyout", ca_key, "-out", ca_crt, "-subj", "/CN=gpushare-test-ca", *ca_ext
    )

    def leaf(stem: str, subject: str, ext: str) -> None:
        key, csr, crt, extfile = (pki / f"{stem}.{suffix}" for suffix in ("key", "csr", "crt", "ext"))
        extfile.write_text(ext)
        openssl("req", "-new", *ec, "-keyout", key, "-out", csr, "-subj", subject)
        serial = str(int.from_bytes(os.urandom(8), "big"))
        openssl(
            "x509",
            "-req",
            "-in",
            csr,
            "-CA",
            ca_crt,
            "-CAkey",
            ca_key,
            "-set_serial",
            serial,
            "-days",
            "30",
            "-extfile",
            extfile,
            "-out",
            crt,
        )

    for stem, cn, org in CLIENT_CERTS:
        subject = (f"/O={org}" if org else "") + f"/CN={cn}"
        leaf(stem, subject, "keyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n")
    for stem, cn, sans in SERVER_CERTS:
        ext = f"keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\nsubjectAltName={','.join(sans)}\n"
        leaf(stem, f"/CN={cn}", ext)
    openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", pki / "sa.key")
    openssl("pkey", "-in", pki / "sa.key", "-pubout", "-out", pki / "sa.pub")


def free_port() -> int:
    """A port free on 127.0.0.1 right now (the kernel picks it; a race with others is unlikely)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _pids_of(root: Path) -> list[int]:
    """Processes of the cluster in ``root``: each names a path below it (never /tmp/gs-kube2 for /tmp/gs-kube)."""
    return _pids_mentioning(f"{root}/")


def _process_identity(pid: int) -> tuple[int, int] | None:
    """(pid, start time in clock ticks): a PID alone may be reused by another process."""
    try:
        return pid, int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _pids_mentioning(text: str) -> list[int]:
    """Live processes whose command line mentions ``text`` (our root dir: every process we start)."""
    me = os.getpid()
    return [
        int(e.name)
        for e in Path("/proc").iterdir()
        if e.name.isdigit()
        and int(e.name) != me
        and any(text in a for a in _cmdline(int(e.name)))
        and _alive(int(e.name))
    ]


def _stop_pid(pid: int, popen: subprocess.Popen[bytes] | None, timeout_s: float = 15.0) -> None:
    """SIGTERM, then SIGKILL after ``timeout_s``; reaps the child when we started it in this process."""
    if not _alive(pid):
        if popen is not None:
            popen.wait()
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if popen is not None and popen.poll() is not None:
            return
        if popen is None and not _alive(pid):
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    if popen is not None:
        popen.wait(timeout=10)


def _cgroup_hierarchies() -> list[Path]:
    return sorted(p for p in CGROUP_FS.iterdir() if p.is_dir()) if CGROUP_FS.is_dir() else []


def make_cgroup_root(name: str) -> None:
    """kubelet refuses a cgroupRoot that does not exist; create it in every v1 hierarchy."""
    for h in _cgroup_hierarchies():
        if h.name == "unified":  # the v2 part of a hybrid setup: kubelet on v1 does not use it
            continue
        d = h / name.lstrip("/")
        d.mkdir(exist_ok=True)
        if h.name == "cpuset":  # a new v1 cpuset is empty (no cpus, no mems) and refuses tasks
            for f in ("cpuset.cpus", "cpuset.mems"):
                if not (d / f).read_text().strip():
                    (d / f).write_text((h / f).read_text())


def remove_cgroup_root(name: str) -> list[str]:
    """Kill whatever still lives below ``name`` and rmdir the tree, leaves first. Returns what stayed."""
    left: list[str] = []
    for _attempt in range(50):
        left = []
        for h in _cgroup_hierarchies():
            top = h / name.lstrip("/")
            if not top.is_dir():
                continue
            for dirpath, _dirs, _files in sorted(os.walk(top), key=lambda t: len(t[0]), reverse=True):
                with contextlib.suppress(OSError):
                    for pid in Path(dirpath, "cgroup.procs").read_text().split():
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(int(pid), signal.SIGKILL)
                try:
                    os.rmdir(dirpath)
                except OSError:
                    left.append(dirpath)
        if not left:
            return []
        time.sleep(0.1)
    return left


def read_sysctls() -> dict[str, str]:
    return {k: (SYSCTL_DIR / k).read_text().strip() for k in KUBELET_SYSCTLS if (SYSCTL_DIR / k).exists()}


def write_sysctls(values: dict[str, str]) -> None:
    for key, value in values.items():
        path = SYSCTL_DIR / key
        with contextlib.suppress(OSError):
            if path.read_text().strip() != value:
                path.write_text(value)


def our_kubelets() -> list[int]:
    """Live kubelets started by this harness (any cluster): their command line carries our node name."""
    found = []
    for pid in _pids_mentioning(f"--hostname-override={NODE_NAME}"):
        argv = _cmdline(pid)  # empty if it just exited
        if argv and Path(argv[0]).name == "kubelet" and any(a.startswith("--config=/tmp/") for a in argv):
            found.append(pid)
    return found


def record_sysctls(record: Path = SYSCTL_RECORD) -> None:
    """Before a kubelet starts: remember the machine's values, unless a record already exists.

    One record for the machine, not one per cluster: a second cluster started while a first
    kubelet runs would otherwise remember kubelet's values and put those "back".
    """
    record.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError), open(record, "x") as f:
        json.dump(read_sysctls(), f)


def restore_sysctls(record: Path = SYSCTL_RECORD) -> None:
    """After a kubelet stopped: when no kubelet of ours runs any more, write the record back."""
    if our_kubelets() or not record.exists():
        return
    with contextlib.suppress(OSError, ValueError):
        write_sysctls(json.loads(record.read_text()))
        record.unlink()


def leftovers(root: Path) -> list[str]:
    """What a torn-down cluster must not leave: processes, mounts and cgroups of ``root``."""
    found = [f"process {pid}: {' '.join(_cmdline(pid))}" for pid in _pids_of(root)]
    found += [f"mount {m}" for m in mounts_under(Path("/proc/self/mountinfo").read_text(), root)]
    found += [f"cgroup {h / root.name}" for h in _cgroup_hierarchies() if (h / root.name).exists()]
    return found


class Cluster:
    """One cluster: start(), use, stop(). The attributes below are what later tiers need."""

    def __init__(self, root: Path, binaries: Binaries, containerd: ContainerdInstall) -> None:
        self.layout = Layout(root)
        self.binaries = binaries
        self.containerd_install = containerd
        self.node_name = NODE_NAME
        self.ports = Ports(*(free_port() for _ in dataclasses.fields(Ports)))
        self.containerd: Containerd | None = None
        self.timings: dict[str, float] = {}
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._pids: dict[str, int] = {}
        # The process whose death makes this cluster garbage (None: detached, `make cluster-up`).
        self.owner: tuple[int, int] | None = _process_identity(os.getpid())

    # -- what tests use ----------------------------------------------------------------------
    @property
    def root(self) -> Path:
        return self.layout.root

    @property
    def kubeconfig(self) -> Path:
        return self.layout.kubeconfig

    @property
    def kubelet_root(self) -> Path:
        return self.layout.kubelet_root

    @property
    def device_plugin_dir(self) -> Path:
        return self.layout.device_plugin_dir

    @property
    def pod_resources_socket(self) -> Path:
        return self.layout.pod_resources_socket

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports.apiserver}"

    @property
    def cri_socket(self) -> Path:
        return self.layout.containerd_dir / "cd.sock"

    @property
    def nri_socket(self) -> Path:
        return self.layout.containerd_dir / "nri.sock"

    @property
    def pids(self) -> dict[str, int]:
        return dict(self._pids)

    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None, timeout_s: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        """kubectl with the admin kubeconfig; on failure (check) a ClusterError carries stderr."""
        argv = [str(self.binaries.kubectl), f"--kubeconfig={self.kubeconfig}", *args]
        res = subprocess.run(argv, capture_output=True, text=True, input=input, timeout=timeout_s, check=False)
        if check and res.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args)} failed ({res.returncode}): {res.stderr.strip()}")
        return res

    def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        """One API call with the admin certificate (no client library: cheap enough to poll)."""
        ctx = ssl.create_default_context(cafile=str(self.layout.pki / "ca.crt"))
        ctx.load_cert_chain(str(self.layout.pki / "admin.crt"), str(self.layout.pki / "admin.key"))
        conn = http.client.HTTPSConnection("127.0.0.1", self.ports.apiserver, context=ctx, timeout=10)
        try:
            data = None if body is None else json.dumps(body).encode()
            conn.request(method, path, body=data, headers={"Content-Type": content_type, "Accept": "application/json"})
            resp = conn.getresponse()
            text = resp.read().decode()
        finally:
            conn.close()
        if resp.status >= 300:
            raise ClusterError(f"{method} {path}: HTTP {resp.status}: {text[:500]}")
        return json.loads(text) if text.startswith(("{", "[")) else text

    def api(self) -> Any:
        """A ``kubernetes.client.ApiClient`` for the admin kubeconfig (the caller closes it)."""
        from kubernetes import config  # noqa: PLC0415  (heavy import, only for tests that want it)

        return config.new_client_from_config(config_file=str(self.kubeconfig))  # type: ignore[no-untyped-call]

    def node(self) -> dict[str, Any]:
        node: dict[str, Any] = self.request("GET", f"/api/v1/nodes/{self.node_name}")
        return node

    def rss_mib(self) -> dict[str, float]:
        """Resident memory of each process we started, in MiB (VmRSS)."""
        out = {}
        for name, pid in self.pids.items():
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        out[name] = int(line.split()[1]) / 1024
        return out

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self, timeout_s: float = 120.0) -> None:
        t0 = time.monotonic()
        deadline = t0 + timeout_s
        lay = self.layout
        for d in (lay.logs, lay.etcd_data, lay.device_plugin_dir, lay.pod_logs, lay.kubelet_root / "pki"):
            d.mkdir(parents=True, exist_ok=True)
        make_pki(lay.pki)
        for user in ("admin", "controller-manager", "scheduler", "kubelet"):
            path = lay.kubeconfig if user == "admin" else lay.kubeconfig_for(user)
            path.write_text(yaml.safe_dump(kubeconfig_doc(self.server, lay.pki, user)))
        self.timings["pki"] = time.monotonic() - t0

        self._spawn("etcd", etcd_args(self.binaries, lay, self.ports))
        self._spawn("kube-apiserver", apiserver_args(self.binaries, lay, self.ports))
        self._start_containerd()
        self.timings["containerd"] = time.monotonic() - t0
        self._prepare_kubelet_host()
        self._spawn("kube-controller-manager", controller_manager_args(self.binaries, lay))
        self._spawn("kube-scheduler", scheduler_args(self.binaries, lay))
        self.start_kubelet(wait=False)
        self._wait("kube-apiserver ready", self._apiserver_ready, deadline)
        self.timings["apiserver"] = time.monotonic() - t0
        self.wait_node_ready(deadline - time.monotonic())
        self.timings["node_ready"] = time.monotonic() - t0
        # The ServiceAccount admission refuses pods until the controller made "default".
        self._wait("default service account", self._default_sa_exists, deadline)
        self.timings["ready"] = time.monotonic() - t0

    def stop(self) -> list[str]:
        """Tear everything down by PID; returns what could not be removed (empty when clean)."""
        lay = self.layout
        self.stop_kubelet()
        self._remove_pods()
        for name in ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
            self._stop(name)
        self._stop_containerd()
        for pid in _pids_of(lay.root):  # stray shims or children
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for point in mounts_under(Path("/proc/self/mountinfo").read_text(), lay.root):
            subprocess.run(["umount", "-l", point], check=False, capture_output=True)
        problems = remove_cgroup_root(lay.cgroup_root)
        restore_sysctls()
        return problems + leftovers(lay.root)

    def stop_kubelet(self) -> None:
        self._stop("kubelet")

    def start_kubelet(self, wait: bool = True, timeout_s: float = 60.0) -> None:
        """Start kubelet; with ``wait``, until it is healthy, has made a new kubelet.sock and the node is Ready."""
        record_sysctls()
        doc = kubelet_config_doc(self.layout, self.ports, self.cri_socket)
        self.layout.kubelet_config.write_text(yaml.safe_dump(doc))
        started = time.time()
        self._spawn("kubelet", kubelet_args(self.binaries, self.layout))
        if not wait:
            return
        deadline = time.monotonic() + timeout_s
        self._wait("kubelet healthz", self._kubelet_healthy, deadline)
        sock = self.device_plugin_dir / "kubelet.sock"

        def fresh_socket() -> bool:
            # ctime, not the inode number: ext4 hands a freed inode number straight back.
            with contextlib.suppress(OSError):
                return sock.is_socket() and sock.stat().st_ctime >= started - 1
            return False

        self._wait("a new kubelet.sock", fresh_socket, deadline)
        self.wait_node_ready(max(1.0, deadline - time.monotonic()))

    def restart_kubelet(self, timeout_s: float = 60.0) -> None:
        """Stop kubelet by PID and start it again (new process, same root dir); wait for Ready."""
        self.stop_kubelet()
        self.start_kubelet(wait=True, timeout_s=timeout_s)

    def restart_containerd(self, timeout_s: float = 60.0) -> None:
        """A new containerd process over the same dirs; pods keep running; wait for the node Ready."""
        if self.containerd is None:
            raise ClusterError("containerd is not running in this process (cluster started elsewhere?)")
        self.containerd.restart()
        self._pids["containerd"] = self.containerd.pid or 0
        self._save_state()
        self.wait_node_ready(timeout_s)

    def wait_for(self, what: str, ok: Callable[[], bool], timeout_s: float = 60.0) -> None:
        """Poll ``ok`` until true; ClusterError (with log tails) on timeout or if a component died."""
        self._wait(what, ok, time.monotonic() + timeout_s)

    def pod(self, name: str, namespace: str = "default") -> dict[str, Any] | None:
        """The pod as JSON, or None when it does not exist."""
        try:
            pod: dict[str, Any] = self.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
        except ClusterError as e:
            if "HTTP 404" in str(e):
                return None
            raise
        return pod

    def wait_pod_phase(
        self, name: str, phases: Sequence[str], namespace: str = "default", timeout_s: float = 60.0
    ) -> dict[str, Any]:
        """Wait until the pod's phase is one of ``phases``; return the pod."""
        seen: dict[str, Any] = {}

        def reached() -> bool:
            seen["pod"] = self.pod(name, namespace)
            return seen["pod"] is not None and seen["pod"].get("status", {}).get("phase") in phases

        self.wait_for(f"pod {namespace}/{name} in {'/'.join(phases)}", reached, timeout_s)
        pod: dict[str, Any] = seen["pod"]
        return pod

    def wait_node_ready(self, timeout_s: float = 60.0) -> None:
        def ready() -> bool:
            try:
                return node_ready(self.node())
            except (ClusterError, OSError):
                return False

        self._wait(f"node {self.node_name} Ready", ready, time.monotonic() + timeout_s)

    def state(self) -> dict[str, Any]:
        """What `down` in another process needs (JSON-able)."""
        return {
            "root": str(self.root),
            "ports": dataclasses.asdict(self.ports),
            "pids": self.pids,
            "owner": list(self.owner) if self.owner else None,
            "kubeconfig": str(self.kubeconfig),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Cluster:
        c = cls(Path(state["root"]), Binaries.find(cache_dir()), find_install("2.x"))
        c.ports = Ports(**state["ports"])
        c._pids = {k: int(v) for k, v in state["pids"].items()}
        return c

    # -- internals ---------------------------------------------------------------------------
    def _spawn(self, name: str, argv: list[str]) -> None:
        with open(self.layout.logs / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        self._procs[name] = proc
        self._pids[name] = proc.pid
        self._save_state()

    def _save_state(self) -> None:
        # Always on disk, so `python -m tests.harness.cluster down --root <root>` can clean up a
        # cluster whose test process was killed.
        self.layout.state_file.write_text(json.dumps(self.state(), indent=2))

    def _stop(self, name: str) -> None:
        pid = self._pids.pop(name, 0)
        popen = self._procs.pop(name, None)
        # A PID from a state file may have been reused: only stop a process that is ours.
        if pid and (popen is not None or pid in _pids_of(self.root)):
            _stop_pid(pid, popen)

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.layout.logs / f"{name}.log"
        try:
            return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def _wait(self, what: str, ok: Callable[[], bool], deadline: float) -> None:
        while True:
            for name, proc in self._procs.items():
                if proc.poll() is not None:
                    raise ClusterError(
                        f"{name} exited ({proc.returncode}) while waiting for {what}; "
                        f"{self.layout.logs / (name + '.log')}:\n{self.log_tail(name)}"
                    )
            if ok():
                return
            if time.monotonic() > deadline:
                tails = "\n".join(f"--- {n}:\n{self.log_tail(n, 10)}" for n in self._procs)
                raise ClusterError(f"timed out waiting for {what}; logs in {self.layout.logs}\n{tails}")
            time.sleep(0.2)

    def _kubelet_healthy(self) -> bool:
        conn = http.client.HTTPConnection("127.0.0.1", self.ports.kubelet_healthz, timeout=2)
        try:
            conn.request("GET", "/healthz")
            return conn.getresponse().read() == b"ok"
        except OSError:
            return False
        finally:
            conn.close()

    def _apiserver_ready(self) -> bool:
        try:
            return bool(self.request("GET", "/readyz") == "ok")
        except (ClusterError, OSError):
            return False

    def _default_sa_exists(self) -> bool:
        try:
            self.request("GET", "/api/v1/namespaces/default/serviceaccounts/default")
            return True
        except (ClusterError, OSError):
            return False

    def _start_containerd(self) -> None:
        base = self.layout.containerd_dir
        # A CNI config makes containerd report NetworkReady (kubelet's node Ready needs it); the
        # plugin only ever configures the pod's own namespace (hack/kube/cni/gs-netns).
        plugin = Path(__file__).resolve().parents[2] / "hack" / "kube" / "cni" / "gs-netns"
        (base / "cni" / "bin").mkdir(parents=True, exist_ok=True)
        (base / "cni" / "conf").mkdir(parents=True, exist_ok=True)
        for name in ("gs-netns", "loopback"):
            shutil.copy2(plugin, base / "cni" / "bin" / name)
        (base / "cni" / "conf" / "10-gpushare.conflist").write_text(
            json.dumps({"cniVersion": "1.0.0", "name": "gpushare-pods", "plugins": [{"type": "gs-netns"}]})
        )
        self.containerd = Containerd(self.containerd_install, nri=True, base_dir=base)
        self.containerd.start()
        self._pids["containerd"] = self.containerd.pid or 0
        self._save_state()

    def _stop_containerd(self) -> None:
        if self.containerd is None:  # started by another process: stop it by PID first
            self._stop("containerd")
            self.containerd = Containerd(self.containerd_install, nri=True, base_dir=self.layout.containerd_dir)
        self._pids.pop("containerd", None)
        self.containerd.close()
        self.containerd = None

    def _remove_pods(self) -> None:
        """Remove every pod through CRI while containerd still runs: shims exit cleanly, sockets go."""
        if not self.cri_socket.exists():
            return
        with contextlib.suppress(CriError), CriClient(str(self.cri_socket)) as cri:
            for pod_id in cri.list_pod_ids():
                with contextlib.suppress(CriError):
                    cri.remove_pod(pod_id)

    def _prepare_kubelet_host(self) -> None:
        """The host side of kubelet's setup: its cgroup root, and its root dir as a shared mount."""
        make_cgroup_root(self.layout.cgroup_root)
        root = str(self.layout.kubelet_root)
        if root not in mounts_under(Path("/proc/self/mountinfo").read_text(), self.layout.kubelet_root):
            _run(["mount", "--bind", root, root])
        _run(["mount", "--make-shared", root])


# ---------------------------------------------------------------------------------------------
# pytest fixture and command line.
# ---------------------------------------------------------------------------------------------


def find_installs() -> tuple[Binaries, ContainerdInstall]:
    """The cached binaries, or ClusterUnavailable naming what is missing and the command that builds it."""
    if os.geteuid() != 0:
        raise ClusterUnavailable("the cluster needs root (mounts, cgroups, runc); run `sudo make test`")
    binaries = Binaries.find(cache_dir())
    try:
        return binaries, find_install("2.x")
    except InstallMissing as e:
        raise ClusterUnavailable(f"{e}; or: {BUILD_HINT}") from e


def new_cluster(root: Path | None = None) -> Cluster:
    """A not yet started cluster in ``root`` (default: a fresh /tmp/gs-kXXXX); ClusterUnavailable if not built."""
    binaries, containerd = find_installs()
    if root is None:
        root = Path(tempfile.mkdtemp(prefix="gs-k", dir="/tmp"))
    root.mkdir(parents=True, exist_ok=True)
    return Cluster(root, binaries, containerd)


@contextlib.contextmanager
def running_cluster(root: Path | None = None, keep: bool = False) -> Iterator[Cluster]:
    """Start a cluster, yield it, tear it down; raises ClusterError if the teardown left anything."""
    c = new_cluster(root)
    try:
        c.start()
        yield c
    finally:
        problems = c.stop()
        if not keep and not problems:
            shutil.rmtree(c.root, ignore_errors=True)
    if problems:
        raise ClusterError(f"teardown of {c.root} left: {problems}")


def reap_dead_clusters(tmp: Path = Path("/tmp")) -> list[Path]:
    """Tear down clusters left by a killed test run; returns their roots.

    Garbage: a state file whose owner process is gone (a detached `make cluster-up` cluster has
    no owner), or none of whose processes is alive any more.
    """
    reaped = []
    for state_file in sorted(tmp.glob("gs-k*/cluster.json")):
        root = state_file.parent
        try:
            state = json.loads(state_file.read_text())
            pids = [int(p) for p in state["pids"].values()]
            owner = tuple(state.get("owner") or ())
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if state.get("root") != str(root):
            continue
        owner_gone = len(owner) == 2 and _process_identity(int(owner[0])) != owner
        all_dead = not any(_alive(p) for p in pids) and not _pids_of(root)
        if not (owner_gone or all_dead):
            continue
        if not Cluster.from_state(state).stop():
            shutil.rmtree(root, ignore_errors=True)
            reaped.append(root)
    return reaped


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


class _SessionCluster:
    """One cluster per pytest process, however many conftests import the fixture.

    Each conftest that re-exports ``cluster`` makes its own fixture definition, and pytest keeps
    one value per definition; a reference count here makes them all share the first cluster,
    stopped when the last user is torn down (at session end).
    """

    def __init__(self) -> None:
        self.stack: contextlib.ExitStack | None = None
        self.cluster: Cluster | None = None
        self.users = 0

    def acquire(self) -> Cluster:
        if self.cluster is None:
            reap_dead_clusters()
            stack = contextlib.ExitStack()
            # `timeout` and CI end a run with SIGTERM, which by default skips every finally: turn it
            # into KeyboardInterrupt so pytest tears the session down and the cluster goes with it.
            if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
                signal.signal(signal.SIGTERM, _interrupt)
                stack.callback(signal.signal, signal.SIGTERM, signal.SIG_DFL)
            try:
                self.cluster = stack.enter_context(running_cluster(keep=bool(os.environ.get("GPUSHARE_KEEP_CLUSTER"))))
            except BaseException:
                stack.close()
                raise
            self.stack = stack
        self.users += 1
        return self.cluster

    def release(self) -> None:
        self.users -= 1
        if self.users == 0 and self.stack is not None:
            stack, self.stack, self.cluster = self.stack, None, None
            stack.close()


_SESSION = _SessionCluster()


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """A Ready one-node cluster shared by the whole session (skips, naming the build command, if absent)."""
    try:
        find_installs()
    except ClusterUnavailable as e:
        pytest.skip(str(e))
    c = _SESSION.acquire()
    try:
        yield c
    finally:
        _SESSION.release()


def _cli_up(root: Path) -> int:
    reap_dead_clusters()
    if (root / "cluster.json").exists():
        print(f"a cluster is already up in {root} (make cluster-down first)", file=sys.stderr)
        return 1
    c = new_cluster(root)
    c.owner = None  # detached: it lives on after this command, until `down`
    try:
        c.start()
    except BaseException:
        c.stop()
        c.layout.state_file.unlink(missing_ok=True)  # logs stay for reading; a new `up` may run
        raise
    t = c.timings
    print(f"# cluster up in {t['ready']:.1f} s (node Ready at {t['node_ready']:.1f} s); logs in {c.layout.logs}")
    print(f"# device plugins: {c.device_plugin_dir}  pod-resources: {c.pod_resources_socket}")
    print(f"# CRI: {c.cri_socket}  NRI: {c.nri_socket}")
    print(f"export KUBECONFIG={c.kubeconfig}")
    return 0


def _cli_down(root: Path) -> int:
    state_file = Layout(root).state_file
    if not state_file.exists():
        print(f"no cluster state in {state_file}; nothing to stop", file=sys.stderr)
        return 0
    c = Cluster.from_state(json.loads(state_file.read_text()))
    problems = c.stop()
    if problems:
        print("teardown left:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    shutil.rmtree(root, ignore_errors=True)
    print(f"# cluster in {root} stopped; nothing left behind")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.harness.cluster", description=__doc__.split("\n")[0])
    parser.add_argument("action", choices=("up", "down"))
    parser.add_argument("--root", type=Path, default=DEFAULT_CLI_ROOT, help=f"cluster dir (default {DEFAULT_CLI_ROOT})")
    args = parser.parse_args(argv)
    try:
        return _cli_up(args.root) if args.action == "up" else _cli_down(args.root)
    except ClusterError as e:
        print(str(e), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
