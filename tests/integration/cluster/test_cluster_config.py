"""The plain-data half of the cluster harness: configs, arguments, parsers, certificates (no cluster)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from localcluster.component_config import (
    apiserver_args,
    controller_manager_args,
    etcd_args,
    kubelet_args,
    kubelet_config_doc,
    node_ready,
    scheduler_args,
)
from localcluster.errors import ClusterUnavailable
from localcluster.host import mounts_under
from localcluster.layout import NODE_NAME, Binaries, Layout, Ports
from localcluster.paths import cache_dir
from localcluster.pki import CLIENT_CERTS, make_pki

LAYOUT = Layout(Path("/tmp/gs-kABC"))
PORTS = Ports(etcd_client=2379, etcd_peer=2380, apiserver=6443, kubelet=10250, kubelet_healthz=10248, scheduler=10259)
BINS = Binaries(*(Path(f"/cache/{n}") for n in ("apiserver", "cm", "sched", "kubelet", "kubectl", "etcd")))


def test_kubelet_config_runs_on_cgroup_v1_privately() -> None:
    doc = kubelet_config_doc(LAYOUT, PORTS, Path("/tmp/gs-kABC/containerd/cd.sock"))
    assert doc["failCgroupV1"] is False
    assert doc["cgroupDriver"] == "cgroupfs"
    assert doc["cgroupRoot"] == "/gs-kABC"
    assert doc["containerRuntimeEndpoint"] == "unix:///tmp/gs-kABC/containerd/cd.sock"
    assert doc["failSwapOn"] is False and doc["registerNode"] is True
    assert doc["imageGCHighThresholdPercent"] == 100
    assert doc["readOnlyPort"] == 0 and doc["address"] == "127.0.0.1" and doc["healthzBindAddress"] == "127.0.0.1"
    assert doc["podLogsDir"].startswith(str(LAYOUT.root))
    assert doc["authentication"]["anonymous"]["enabled"] is False
    assert all(v.endswith("%") or v.endswith("Mi") for v in doc["evictionHard"].values())


def test_every_listener_is_on_loopback() -> None:
    argv = [
        *etcd_args(BINS, LAYOUT, PORTS),
        *apiserver_args(BINS, LAYOUT, PORTS),
        *controller_manager_args(BINS, LAYOUT),
        *scheduler_args(BINS, LAYOUT, PORTS),
    ]
    addresses = [a.split("=", 1)[1] for a in argv if re.match(r"--[a-z-]*(address|urls|servers)=", a)]
    assert addresses, "no listener flags found"
    for value in addresses:
        for item in value.split(","):
            host = re.sub(r"^(gpushare=)?https?://", "", item).split(":")[0]
            assert host == "127.0.0.1", f"{item} is not loopback"
    assert "--secure-port=0" in controller_manager_args(BINS, LAYOUT)
    # The scheduler serves its /metrics (loopback, bound above) and nothing else without credentials.
    sched = scheduler_args(BINS, LAYOUT, PORTS)
    assert "--secure-port=10259" in sched
    assert "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics,/configz" in sched


def test_kubelet_sees_the_private_device_plugin_dir_at_the_system_path() -> None:
    argv = kubelet_args(BINS, LAYOUT)
    assert argv[:5] == ["unshare", "--mount", "--propagation", "unchanged", "--"]
    script = argv[argv.index("-c") + 1]
    assert 'mount --bind "$1" /var/lib/kubelet/device-plugins' in script
    assert "tmpfs" in script and "/var/log" in script
    assert str(LAYOUT.device_plugin_dir) in argv
    assert f"--root-dir={LAYOUT.kubelet_root}" in argv
    assert f"--hostname-override={NODE_NAME}" in argv


def test_mounts_under_lists_deepest_first_and_ignores_siblings() -> None:
    info = "\n".join(
        [
            "22 27 0:21 / /proc rw - proc proc rw",
            "50 27 254:0 /tmp/gs-k1/kubelet /tmp/gs-k1/kubelet rw shared:1 - ext4 /dev/vda rw",
            "51 50 0:40 / /tmp/gs-k1/kubelet/pods/u/volumes/x rw - tmpfs tmpfs rw",
            "52 27 0:41 / /tmp/gs-k10/other rw - tmpfs tmpfs rw",
            r"53 27 0:42 / /tmp/gs-k1/with\040space rw - tmpfs tmpfs rw",
        ]
    )
    assert mounts_under(Path("/tmp/gs-k1"), info) == [
        "/tmp/gs-k1/with space",
        "/tmp/gs-k1/kubelet/pods/u/volumes/x",
        "/tmp/gs-k1/kubelet",
    ]
    assert mounts_under(Path("/nowhere"), info) == []


def test_mounts_under_decodes_every_mountinfo_escape() -> None:
    info = r"60 27 0:43 / /tmp/gs-k2/a\011tab\134back\012nl rw - tmpfs tmpfs rw"
    assert mounts_under(Path("/tmp/gs-k2"), info) == ["/tmp/gs-k2/a\ttab\\back\nnl"]


def test_cache_dir_is_gpushare_cache_then_xdg_then_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv("GPUSHARE_CACHE", raising=False)
    assert cache_dir() == tmp_path / ".cache" / "gpushare"
    monkeypatch.setenv("XDG_CACHE_HOME", "/xdg")
    assert cache_dir() == Path("/xdg/gpushare")
    monkeypatch.setenv("GPUSHARE_CACHE", "/builds")
    assert cache_dir() == Path("/builds")


@pytest.mark.parametrize(
    ("conditions", "ready"),
    [
        ([{"type": "Ready", "status": "True"}], True),
        ([{"type": "Ready", "status": "False"}], False),
        ([{"type": "MemoryPressure", "status": "True"}], False),
        ([], False),
    ],
)
def test_node_ready(conditions: list[dict[str, str]], ready: bool) -> None:
    assert node_ready({"status": {"conditions": conditions}}) is ready


def test_missing_binaries_name_the_build_command(tmp_path: Path) -> None:
    with pytest.raises(ClusterUnavailable) as exc:
        Binaries.find(tmp_path, "v1.34.4")
    msg = str(exc.value)
    assert "kube-apiserver" in msg and "kubelet" in msg and "etcd" in msg
    assert "hack/kube/build.sh" in msg


def test_pki_certificates_verify_and_carry_the_right_identities(tmp_path: Path) -> None:
    make_pki(tmp_path)
    for stem, cn, org in CLIENT_CERTS:
        crt = tmp_path / f"{stem}.crt"
        verify = ["openssl", "verify", "-CAfile", str(tmp_path / "ca.crt"), "-purpose", "sslclient", str(crt)]
        subprocess.run(verify, check=True, capture_output=True)
        subject = subprocess.run(
            ["openssl", "x509", "-noout", "-subject", "-nameopt", "RFC2253", "-in", str(crt)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        assert f"CN={cn}" in subject and (not org or f"O={org}" in subject), subject
    for stem in ("apiserver", "kubelet-serving"):
        verify = ["openssl", "verify", "-CAfile", str(tmp_path / "ca.crt"), "-purpose", "sslserver"]
        subprocess.run([*verify, str(tmp_path / f"{stem}.crt")], check=True, capture_output=True)
    assert (tmp_path / "sa.pub").read_text().startswith("-----BEGIN PUBLIC KEY-----")
