"""``Cluster``: one real one-node Kubernetes on this machine (etcd, the control plane, containerd 2.x
with NRI, kubelet), on 127.0.0.1 with private ports, started and stopped here by PID. Its state is
always on disk (``cluster.json`` in its root), so another process can stop a cluster whose owner
was killed (``bringup.reap_dead_clusters``, ``python -m localcluster down``)."""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import json
import os
import shutil
import signal
import ssl
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from localcluster.component_config import (
    CNI_CONFLIST,
    CNI_PLUGIN,
    apiserver_args,
    audit_policy_doc,
    controller_manager_args,
    etcd_args,
    kubeconfig_doc,
    kubelet_args,
    kubelet_config_doc,
    node_ready,
    scheduler_args,
    scheduler_config_doc,
)
from localcluster.containerd import Containerd, ContainerdInstall, find_install
from localcluster.cri import CriClient, CriError
from localcluster.errors import ClusterError
from localcluster.host import (
    cgroup_hierarchies,
    cmdline,
    free_port,
    http_body,
    make_cgroup_root,
    mounts_under,
    pids_mentioning,
    process_identity,
    remove_cgroup_root,
    rss_mib,
    run_command,
    stop_pid,
    unmount_below,
)
from localcluster.layout import NODE_NAME, Binaries, Layout, Ports
from localcluster.paths import cache_dir
from localcluster.pki import make_pki
from localcluster.sysctls import record_sysctls, restore_sysctls


def pids_of(root: Path) -> list[int]:
    """Processes of the cluster in ``root``: each names a path below it (never /tmp/gs-kube2 for /tmp/gs-kube)."""
    return pids_mentioning(f"{root}/")


def leftovers(root: Path) -> list[str]:
    """What a torn-down cluster must not leave: processes, mounts and cgroups of ``root``."""
    found = [f"process {pid}: {' '.join(cmdline(pid))}" for pid in pids_of(root)]
    found += [f"mount {m}" for m in mounts_under(root)]
    found += [f"cgroup {h / root.name}" for h in cgroup_hierarchies() if (h / root.name).exists()]
    return found


class Cluster:
    """One cluster: start(), use, stop(). The attributes below are what later tiers need."""

    def __init__(
        self, root: Path, binaries: Binaries, containerd: ContainerdInstall, *, containerd_extra_config: str = ""
    ) -> None:
        """``containerd_extra_config``: TOML appended to containerd's config (e.g. its NRI validator)."""
        self.layout = Layout(root)
        self.containerd_extra_config = containerd_extra_config
        self.binaries = binaries
        self.containerd_install = containerd
        self.node_name = NODE_NAME
        self.ports = Ports(*(free_port() for _ in dataclasses.fields(Ports)))
        self.containerd: Containerd | None = None
        self.timings: dict[str, float] = {}
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._pids: dict[str, int] = {}
        # The process whose death makes this cluster garbage (None: detached, `make cluster-up`).
        self.owner: tuple[int, int] | None = process_identity(os.getpid())

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
        return {name: mib for name, pid in self.pids.items() if (mib := rss_mib(pid)) is not None}

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
        lay.audit_policy.write_text(yaml.safe_dump(audit_policy_doc()))
        self._spawn("kube-apiserver", apiserver_args(self.binaries, lay, self.ports, audit=True))
        self._start_containerd()
        self.timings["containerd"] = time.monotonic() - t0
        self._prepare_kubelet_host()
        self._spawn("kube-controller-manager", controller_manager_args(self.binaries, lay))
        self._spawn("kube-scheduler", scheduler_args(self.binaries, lay, self.ports))
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
        for pid in pids_of(lay.root):  # stray shims or children
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        unmount_below(lay.root)
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

    def restart_scheduler(self, settings: Mapping[str, Any] | None = None, timeout_s: float = 60.0) -> None:
        """A new kube-scheduler process: with ``settings``, from a KubeSchedulerConfiguration made of
        them (``scheduler_config_doc``); without, with the flags it starts with. Waits until it is ready."""
        self._stop("kube-scheduler")
        config = None
        if settings is not None:
            config = self.layout.root / "kube-scheduler.yaml"
            config.write_text(yaml.safe_dump(scheduler_config_doc(self.layout, settings)))
        self._spawn("kube-scheduler", scheduler_args(self.binaries, self.layout, self.ports, config))
        self._wait("kube-scheduler ready", self._scheduler_ready, time.monotonic() + timeout_s)

    def _scheduler_ready(self) -> bool:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE  # its own self-signed serving certificate, on loopback
        conn = http.client.HTTPSConnection("127.0.0.1", self.ports.scheduler, context=ctx, timeout=5)
        try:
            conn.request("GET", "/readyz")
            return conn.getresponse().status == 200
        except OSError:
            return False
        finally:
            conn.close()

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
        # Always on disk, so `python -m localcluster down --root <root>` can clean up a
        # cluster whose test process was killed.
        self.layout.state_file.write_text(json.dumps(self.state(), indent=2))

    def _stop(self, name: str) -> None:
        pid = self._pids.pop(name, 0)
        popen = self._procs.pop(name, None)
        # A PID from a state file may have been reused: only stop a process that is ours.
        if pid and (popen is not None or pid in pids_of(self.root)):
            stop_pid(pid, popen)

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
        return http_body(self.ports.kubelet_healthz, "/healthz") == b"ok"

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
        # A CNI config makes containerd report NetworkReady (kubelet's node Ready needs it).
        (base / "cni" / "bin").mkdir(parents=True, exist_ok=True)
        (base / "cni" / "conf").mkdir(parents=True, exist_ok=True)
        for name in ("gs-netns", "loopback"):
            shutil.copy2(CNI_PLUGIN, base / "cni" / "bin" / name)
        (base / "cni" / "conf" / "10-gpushare.conflist").write_text(json.dumps(CNI_CONFLIST))
        self.containerd = Containerd(
            self.containerd_install, nri=True, base_dir=base, extra_config=self.containerd_extra_config
        )
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
        if root not in mounts_under(self.layout.kubelet_root):
            run_command(["mount", "--bind", root, root])
        run_command(["mount", "--make-shared", root])
