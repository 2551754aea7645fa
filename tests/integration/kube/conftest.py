"""A real kube-apiserver (with its etcd) for controller.io's API modules — the control plane only.

They need the API server and nothing else (no scheduler, kubelet or containerd),
so this tier starts just etcd and kube-apiserver from the cluster harness's cached binaries,
certificates and flags (localcluster), in a private /tmp directory, on free ports,
and stops them by PID. If the binaries are missing it skips, naming the build command.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from controller.errors import KubeError
from controller.io.kube_client import KubeClient
from localcluster.component_config import apiserver_args, etcd_args, kubeconfig_doc
from localcluster.errors import ClusterUnavailable
from localcluster.host import free_port
from localcluster.layout import Binaries, Layout, Ports
from localcluster.paths import cache_dir
from localcluster.pki import make_pki

NAMESPACES = ("gpushare-system", "tenant")


@dataclass(frozen=True)
class ApiServer:
    root: Path
    kubeconfig: Path
    server: str

    def kubeconfig_for(self, user: str) -> Path:
        return Layout(self.root).kubeconfig_for(user)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _wait_ready(kubeconfig: Path, log: Path, deadline: float) -> None:
    last = ""
    while time.monotonic() < deadline:
        try:
            with KubeClient.from_kubeconfig(str(kubeconfig), timeout_s=2.0) as client:
                # What manifests/10-priorityclasses.yaml installs; shadows name it.
                pc = {"metadata": {"name": "gpushare-shadow"}, "value": 1000000, "preemptionPolicy": "Never"}
                client._call("POST", "/apis/scheduling.k8s.io/v1/priorityclasses", body=pc, ok=(409,))
                for ns in NAMESPACES:
                    client._call("POST", "/api/v1/namespaces", body={"metadata": {"name": ns}}, ok=(409,))
                    # No controller-manager here: create the "default" service account pods need.
                    sa = {"metadata": {"name": "default", "namespace": ns}}
                    client._call("POST", f"/api/v1/namespaces/{ns}/serviceaccounts", body=sa, ok=(409,))
            return
        except KubeError as exc:
            last = str(exc)
            time.sleep(0.5)
    tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
    raise RuntimeError(f"kube-apiserver not ready in time: {last}\n{tail}")


@pytest.fixture(scope="session")
def apiserver() -> Iterator[ApiServer]:
    try:
        binaries = Binaries.find(cache_dir())
    except ClusterUnavailable as exc:
        pytest.skip(str(exc))
    root = Path(tempfile.mkdtemp(prefix="gs-api", dir="/tmp"))
    layout = Layout(root)
    ports = Ports(free_port(), free_port(), free_port(), free_port(), free_port())
    server = f"https://127.0.0.1:{ports.apiserver}"
    layout.logs.mkdir(parents=True)
    make_pki(layout.pki)
    for user in ("admin", "scheduler"):
        path = layout.kubeconfig if user == "admin" else layout.kubeconfig_for(user)
        path.write_text(yaml.safe_dump(kubeconfig_doc(server, layout.pki, user)))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for name, argv in (
            ("etcd", etcd_args(binaries, layout, ports)),
            ("apiserver", apiserver_args(binaries, layout, ports)),
        ):
            with open(layout.logs / f"{name}.log", "wb") as out:
                procs.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
        _wait_ready(layout.kubeconfig, layout.logs / "apiserver.log", time.monotonic() + 120)
        yield ApiServer(root, layout.kubeconfig, server)
    finally:
        for proc in reversed(procs):
            _stop(proc)
        if not os.environ.get("GPUSHARE_KEEP_CLUSTER"):
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def client(apiserver: ApiServer) -> Iterator[KubeClient]:
    with KubeClient.from_kubeconfig(str(apiserver.kubeconfig), timeout_s=10.0) as c:
        yield c
        with contextlib.suppress(KubeError):
            for ns in NAMESPACES:
                c._call("DELETE", f"/api/v1/namespaces/{ns}/pods", query={"gracePeriodSeconds": 0})
