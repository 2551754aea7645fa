"""`gpushare doctor`'s probes on recorded host files: a /proc tree in a temp dir, real sockets, a real gRPC server."""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import tempfile
import threading
import tomllib
from collections.abc import Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import grpc
import pytest

from cli.doctor import host_probe as probe
from cli.doctor import socket_probe as sockets
from controller._pb import podresources_pb2 as pb

CONTAINERD_17 = """
version = 2
[plugins."io.containerd.nri.v1.nri"]
  socket_path = "/run/nri/nri.sock"
[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "runc"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
    SystemdCgroup = true
"""

CONTAINERD_2 = """
version = 3
[plugins."io.containerd.nri.v1.nri"]
  disable = false
  socket_path = "/var/run/nri/nri.sock"
[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
  SystemdCgroup = false
"""


def fake_process(proc: Path, pid: int, comm: str, argv: list[str], files: dict[str, str], *, version: str = "") -> None:
    """/proc/<pid> with comm, cmdline, a root holding ``files`` and an exe that prints ``version``."""
    d = proc / str(pid)
    (d / "root").mkdir(parents=True)
    (d / "comm").write_text(comm + "\n")
    (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    for path, text in files.items():
        f = d / "root" / path.lstrip("/")
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    exe = d / "exe"
    exe.write_text(f"#!/bin/sh\necho '{version}'\n" if version else "#!/bin/sh\nexit 1\n")
    exe.chmod(0o755)


@pytest.mark.parametrize(
    ("argv", "value"),
    [
        (["containerd", "--config", "/a.toml"], "/a.toml"),
        (["containerd", "--config=/b.toml"], "/b.toml"),
        (["containerd", "-c", "/c.toml"], "/c.toml"),
        (["containerd", "--config", "/a", "--config=/z"], "/z"),
        (["containerd", "--config"], None),
        (["containerd"], None),
    ],
)
def test_flag_value(argv: list[str], value: str | None) -> None:
    assert probe.flag_value(argv, "--config", "-c") == value


@pytest.mark.parametrize(
    ("text", "major", "expected"),
    [
        (CONTAINERD_17, 1, (True, "/run/nri/nri.sock", True)),  # 1.7: NRI off unless `disable = false`
        (CONTAINERD_2, 2, (False, "/var/run/nri/nri.sock", False)),
        ("version = 3\n", 2, (False, "/var/run/nri/nri.sock", False)),  # 2.x defaults: NRI on
        ("", None, (None, "/var/run/nri/nri.sock", False)),  # version unknown: unset `disable` is unknown
        ('[plugins."io.containerd.nri.v1.nri"]\ndisable = "no"\n', 1, (True, "/var/run/nri/nri.sock", False)),
    ],
)
def test_containerd_settings(text: str, major: int | None, expected: tuple[bool | None, str, bool | None]) -> None:
    assert probe.containerd_settings(tomllib.loads(text), major) == expected


def test_probe_containerd_picks_the_one_serving_our_socket(tmp_path: Path) -> None:
    fake_process(
        tmp_path, 10, "containerd", ["containerd"], {"/etc/containerd/config.toml": CONTAINERD_17}, version="1.7.24"
    )
    fake_process(
        tmp_path,
        20,
        "containerd",
        ["containerd", "--config", "/srv/cd.toml"],
        {"/srv/cd.toml": CONTAINERD_2},
        version="containerd github.com/containerd/containerd/v2 v2.4.2 deadbeef",
    )
    fake_process(tmp_path, 30, "containerd-shim", ["containerd-shim"], {})
    fact = probe.probe_containerd("/var/run/nri/../nri/nri.sock", proc=tmp_path)
    assert (fact.pid, fact.config_path, fact.nri_disabled, fact.systemd_cgroup) == (20, "/srv/cd.toml", False, False)
    assert fact.version is not None and "v2.4.2" in fact.version
    assert fact.others == ("pid 10 (config /etc/containerd/config.toml, NRI socket /run/nri/nri.sock)",)
    old = probe.probe_containerd("/run/nri/nri.sock", proc=tmp_path)
    assert (old.pid, old.nri_disabled, old.systemd_cgroup) == (10, True, True)
    none = probe.probe_containerd("/elsewhere.sock", proc=tmp_path)
    assert none.pid is None and len(none.others) == 2


def test_probe_containerd_with_a_broken_config(tmp_path: Path) -> None:
    fake_process(
        tmp_path, 10, "containerd", ["containerd"], {"/etc/containerd/config.toml": "version = = 2"}, version="v2.1.0"
    )
    fact = probe.probe_containerd("/var/run/nri/nri.sock", proc=tmp_path)
    assert fact.pid == 10 and fact.config_error is not None and "config.toml" in fact.config_error
    assert fact.version == "v2.1.0"


def test_probe_containerd_reads_the_files_its_imports_pull_in(tmp_path: Path) -> None:
    """containerd 2.x's default config imports /etc/containerd/conf.d/*.toml; a drop-in there turns NRI off."""
    main = 'imports = ["/etc/containerd/conf.d/*.toml", "extra.toml"]\n' + CONTAINERD_2
    files = {
        "/etc/containerd/config.toml": main,
        "/etc/containerd/conf.d/10-nri.toml": '[plugins."io.containerd.nri.v1.nri"]\ndisable = true\n',
        "/etc/containerd/extra.toml": "[grpc]\naddress = '/run/x.sock'\n",
    }
    fake_process(tmp_path, 10, "containerd", ["containerd"], files, version="v2.4.2")
    fact = probe.probe_containerd("/var/run/nri/nri.sock", proc=tmp_path)
    # The drop-in replaces the whole NRI table: its socket_path falls back to the default, disable wins.
    assert (fact.pid, fact.nri_disabled, fact.nri_socket, fact.systemd_cgroup) == (
        10,
        True,
        "/var/run/nri/nri.sock",
        False,
    )
    (tmp_path / "10" / "root" / "etc" / "containerd" / "conf.d" / "20-bad.toml").write_text("= broken")
    broken = probe.probe_containerd("/var/run/nri/nri.sock", proc=tmp_path)
    assert (
        broken.config_error is not None
        and "20-bad.toml (imported by /etc/containerd/config.toml)" in broken.config_error
    )


def test_merge_imported() -> None:
    doc = {"version": 3, "plugins": {"a": {"x": 1, "y": 2}, "b": {"z": 3}}, "grpc": {"address": "/a"}}
    merged = probe.merge_imported(doc, {"plugins": {"a": {"x": 9}}, "grpc": {"uid": 1}})
    assert merged == {"version": 3, "plugins": {"a": {"x": 9}, "b": {"z": 3}}, "grpc": {"uid": 1}}
    assert probe.merge_imported({"plugins": "junk"}, {"plugins": {"a": {}}}) == {"plugins": {"a": {}}}


MOUNTS_V1 = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
"""
MOUNTS_HYBRID = MOUNTS_V1 + "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
MOUNTS_V2 = "30 23 0:27 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
MOUNTS_POD = "1 0 0:1 / / rw - overlay overlay rw\n2 1 0:2 / /host\\040cg rw - cgroup2 cgroup2 rw\n"


@pytest.mark.parametrize(
    ("text", "root", "version"),
    [
        (MOUNTS_V1, "/sys/fs/cgroup", "v1"),
        (MOUNTS_HYBRID, "/sys/fs/cgroup/", "hybrid"),
        (MOUNTS_V2, "/sys/fs/cgroup", "v2"),
        (MOUNTS_V2, "/other", None),
        (MOUNTS_POD, "/host cg", "v2"),  # \040 is a space in mountinfo
        ("garbage\n\n - \n", "/sys/fs/cgroup", None),
    ],
)
def test_cgroup_version(text: str, root: str, version: str | None) -> None:
    assert probe.cgroup_version(probe.parse_mountinfo(text), root) == version


@pytest.mark.parametrize(
    ("doc", "argv", "expected"),
    [
        ({"cgroupDriver": "systemd"}, [], ("systemd", "/")),
        ({}, [], ("cgroupfs", "/")),
        ({"cgroupDriver": "systemd", "cgroupRoot": "/gs"}, ["--cgroup-driver=cgroupfs"], ("cgroupfs", "/gs")),
        ("not a mapping", ["--cgroup-root", "/x"], ("cgroupfs", "/x")),
        ({"cgroupDriver": 3}, [], ("cgroupfs", "/")),
    ],
)
def test_kubelet_settings(doc: object, argv: list[str], expected: tuple[str, str]) -> None:
    assert probe.kubelet_settings(doc, argv) == expected


def test_probe_cgroup_reads_the_config_of_our_kubelet(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "mountinfo").write_text(MOUNTS_V2)
    other = ["kubelet", "--config=/k/other.yaml", "--root-dir=/var/lib/other"]
    ours = ["kubelet", "--config", "/k/ours.yaml", "--root-dir", "/r/kubelet"]
    fake_process(proc, 5, "kubelet", other, {"/k/other.yaml": "cgroupDriver: cgroupfs\n"})
    fake_process(proc, 6, "kubelet", ours, {"/k/ours.yaml": "cgroupDriver: systemd\n"})
    fact = probe.probe_cgroup("/sys/fs/cgroup", "/r/kubelet/device-plugins/", proc=proc)
    assert (fact.version, fact.kubelet_driver, fact.kubelet_config, fact.kubelet_error) == (
        "v2",
        "systemd",
        "/k/ours.yaml",
        None,
    )
    missing = probe.probe_cgroup("/sys/fs/cgroup", "/nowhere/device-plugins", proc=proc)
    assert missing.kubelet_driver is None and missing.kubelet_error is not None and "/nowhere" in missing.kubelet_error


def test_resolve_in_root_follows_absolute_links_inside_the_root(tmp_path: Path) -> None:
    headers = tmp_path / "usr" / "src" / "linux-headers-6.1"
    headers.mkdir(parents=True)
    (headers / "Makefile").write_text("all:\n")
    modules = tmp_path / "lib" / "modules" / "6.1"
    modules.mkdir(parents=True)
    (modules / "build").symlink_to("/usr/src/linux-headers-6.1")
    assert probe.resolve_in_root(tmp_path, "/lib/modules/6.1/build") == headers
    assert (probe.resolve_in_root(tmp_path, "/lib/modules/6.1/build") / "Makefile").exists()
    (modules / "up").symlink_to("../../../usr/src/linux-headers-6.1")  # relative, through ".."
    assert probe.resolve_in_root(tmp_path, "/lib/modules/6.1/up") == headers
    assert probe.resolve_in_root(tmp_path, "/../../lib/./modules/6.1/build") == headers  # never above the root
    (modules / "loop").symlink_to("loop")  # a cycle ends after a bounded number of links
    assert probe.resolve_in_root(tmp_path, "/lib/modules/6.1/loop").name == "loop"


def test_probe_kmod_on_this_machine_names_a_reason_or_a_version() -> None:
    fact = probe.probe_kmod()
    assert fact.package_version
    assert fact.loaded is not None or fact.load_blocker is not None or fact.build_blocker is not None or fact.release


# --- sockets ---------------------------------------------------------------------------------------------------


@pytest.fixture
def listening(tmp_path: Path) -> Iterator[str]:
    path = str(tmp_path / "ok.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(4)
    yield path
    server.close()


def test_probe_socket_states(tmp_path: Path, listening: str) -> None:
    assert sockets.probe_socket(listening).state == "ok"
    assert sockets.probe_socket(str(tmp_path / "none.sock")).state == "missing"
    (tmp_path / "file.sock").write_text("")
    assert sockets.probe_socket(str(tmp_path / "file.sock")).state == "not-socket"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(tmp_path / "stale.sock"))
    stale.close()  # the file stays; nobody listens
    fact = sockets.probe_socket(str(tmp_path / "stale.sock"))
    assert fact.state == "refused" and fact.detail


def test_probe_nri_reports_a_missing_socket_without_dialing(tmp_path: Path) -> None:
    fact = sockets.probe_nri(str(tmp_path / "nri.sock"))
    assert fact.socket.state == "missing" and fact.runtime is None and fact.error is None


def test_probe_nri_on_a_socket_that_never_answers(listening: str) -> None:
    fact = sockets.probe_nri(listening, timeout_s=0.3)
    assert fact.socket.ok and fact.error is not None and fact.runtime_version is None


def _devices(resource: str, *ids: str) -> bytes:
    payload = pb.ContainerDevices(resource_name=resource, device_ids=list(ids)).SerializeToString()
    return bytes([0x0A, len(payload)]) + payload


@pytest.fixture
def kubelet_dirs() -> Iterator[tuple[Path, Path]]:
    """A device-plugin dir with kubelet.sock, a vendor socket, gpushare's own, and a real PodResources server.

    In a short folder of its own: a socket's path must fit in 108 bytes, and pytest's tmp_path
    under a parallel run (``popen-gw0/``) does not leave room for gpushare's socket names."""
    root = Path(tempfile.mkdtemp(prefix="gs-dp-", dir="/tmp"))
    dp = root / "device-plugins"
    dp.mkdir()
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, root, ignore_errors=True)
        for name in ("kubelet.sock", "nvidia-gpu.sock", "gpushare-share-gpu-4.sock"):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            cleanup.callback(s.close)
            s.bind(str(dp / name))
            s.listen(1)
        yield from _pod_resources_server(root, cleanup)


def _pod_resources_server(root: Path, cleanup: contextlib.ExitStack) -> Iterator[tuple[Path, Path]]:
    dp = root / "device-plugins"
    pr = root / "pod-resources.sock"
    pods = pb.ListPodResourcesResponse(pod_resources=[pb.PodResources(name="p", namespace="n")]).SerializeToString()
    handlers = {
        "List": grpc.unary_unary_rpc_method_handler(lambda req, ctx: pods),
        "GetAllocatableResources": grpc.unary_unary_rpc_method_handler(
            lambda req, ctx: _devices("nvidia.com/gpu", "a", "b")
        ),
    }
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("v1.PodResourcesLister", handlers)])
    server.add_insecure_port(f"unix://{pr}")
    server.start()
    cleanup.callback(server.stop, 0)
    yield dp, pr


def test_probe_kubelet_against_a_real_grpc_server(kubelet_dirs: tuple[Path, Path]) -> None:
    dp, pr = kubelet_dirs
    fact = sockets.probe_kubelet(str(dp) + "/", str(pr))
    assert fact.plugin_dir_exists and fact.registration.ok and fact.pod_resources.ok
    assert [s.path.rsplit("/", 1)[-1] for s in fact.vendor_sockets] == ["nvidia-gpu.sock"]
    assert (fact.pods, fact.list_error, fact.devices, fact.devices_error) == (1, None, {"nvidia.com/gpu": 2}, None)
    gone = sockets.probe_kubelet(str(dp.parent / "missing"), str(dp.parent / "missing.sock"))
    assert not gone.plugin_dir_exists and gone.registration.state == "missing" and gone.pods is None


class _Agent(BaseHTTPRequestHandler):
    answers: dict[str, tuple[int, dict[str, Any]]] = {}

    def do_GET(self) -> None:
        code, doc = self.answers.get(self.path, (404, {}))
        body = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.parametrize(
    ("answers", "healthz", "spot", "mode"),
    [
        ({"/healthz": (200, {}), "/status": (200, {"spot_runtime": {"mode": "m"}})}, 200, True, "m"),
        ({"/healthz": (200, {}), "/status": (200, {"node": "n"})}, 200, False, None),
        ({"/healthz": (503, {})}, 503, None, None),
    ],
)
def test_probe_agent(
    answers: dict[str, tuple[int, dict[str, Any]]], healthz: int, spot: bool | None, mode: str | None
) -> None:
    _Agent.answers = answers
    server = HTTPServer(("127.0.0.1", 0), _Agent)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        fact = sockets.probe_agent(f"0.0.0.0:{server.server_port}")
    finally:
        server.shutdown()
        server.server_close()
    assert (fact.healthz, fact.spot, fact.spot_mode, fact.error) == (healthz, spot, mode, None)


def test_probe_agent_not_running() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    fact = sockets.probe_agent(f"127.0.0.1:{port}", timeout_s=0.5)
    assert fact.healthz is None and fact.error
    assert sockets.probe_agent("no-port").error
