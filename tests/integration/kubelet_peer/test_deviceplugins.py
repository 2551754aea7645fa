"""The device plugins against a kubelet-protocol peer: real gRPC over real unix sockets.

The peer (``peer.py``) serves Registration on ``kubelet.sock`` and dials the plugin sockets
the way kubelet's device manager does. Nothing is mocked on the plugin side.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from deviceplugins import (
    AdvertisedDevice,
    FakeGpuPlugin,
    InvalidShadow,
    PluginManager,
    ShadowSlots,
    create_fake_gpu_nodes,
)
from deviceplugins._pb import api_pb2, api_pb2_grpc
from gpushare import keys
from tests.integration.kubelet_peer.peer import KubeletPeer

NS = "gpushare-system"
SHARE4 = "gpushare/share-gpu-4"
SPOT = keys.RESOURCE_SPOT_GPU
FAKE = "example.com/gpu"
ROOT = Path(__file__).resolve().parents[3]
# The `gpushare` entry point, run from the checkout with this interpreter.
CLI = [sys.executable, "-c", "from cli.main import main; main()"]

Factory = Callable[..., PluginManager]


@pytest.fixture
def managers(plugin_dir: str) -> Iterator[Factory]:
    """Build and start managers on the peer's directory; all are stopped at teardown."""
    made: list[PluginManager] = []

    def make(*args: object, **kwargs: object) -> PluginManager:
        kwargs.setdefault("check_interval_s", 0.2)
        if not args:
            mgr = PluginManager.for_gpushare(plugin_dir, **kwargs)  # type: ignore[arg-type]
        else:
            mgr = PluginManager(*args, plugin_dir, **kwargs)  # type: ignore[arg-type]
        made.append(mgr)
        mgr.start()
        assert mgr.wait_registered(10), mgr.status()
        return mgr

    yield make
    for m in made:
        m.stop()


def small(make: Factory, **kwargs: object) -> PluginManager:
    return make(share_specs=(2, 4), dev_share_specs=(8,), **kwargs)


def test_registration_fields(kubelet: KubeletPeer, managers: Factory, plugin_dir: str) -> None:
    mgr = small(managers)
    want = {
        "gpushare/share-gpu-2": "gpushare-share-gpu-2.sock",
        "gpushare/share-gpu-4": "gpushare-share-gpu-4.sock",
        "gpushare/share-dev-gpu-8": "gpushare-share-dev-gpu-8.sock",
        "gpushare/spot-gpu": "gpushare-spot-gpu.sock",
    }
    assert mgr.resources == sorted(want)
    for resource, endpoint in want.items():
        (reg,) = kubelet.wait_registrations(resource, 1)
        assert reg.version == "v1beta1"
        assert reg.endpoint == endpoint  # relative to the directory, as kubelet joins them
        assert stat.S_ISSOCK(os.stat(os.path.join(plugin_dir, endpoint)).st_mode)
        assert reg.options.get_preferred_allocation_available is True
        assert reg.options.pre_start_required is False
        assert reg.options_rpc == reg.options  # GetDevicePluginOptions agrees with Register
        assert kubelet.wait_devices(resource, lambda d: d == []) == []  # initial list: empty, sent at once
    assert kubelet.refusals == []


def test_list_and_watch_pushes_whole_list_on_change(kubelet: KubeletPeer, managers: Factory) -> None:
    mgr = small(managers)
    kubelet.wait_devices(SHARE4, lambda d: d == [])
    mgr.set_shadows([ShadowSlots(NS, "sh-a", 4), ShadowSlots(NS, "sh-b", 2)])
    ids_a = [f"{NS}/sh-a-{i}" for i in range(4)]
    got = kubelet.wait_devices(SHARE4, lambda d: len(d) == 4)
    assert got == [(i, "Healthy") for i in ids_a]
    assert kubelet.wait_devices("gpushare/share-gpu-2", lambda d: len(d) == 2) == [
        (f"{NS}/sh-b-0", "Healthy"),
        (f"{NS}/sh-b-1", "Healthy"),
    ]
    # Close one shadow's slots: the whole list again, its slots Unhealthy.
    mgr.set_devices(SHARE4, [AdvertisedDevice(i, False) for i in ids_a])
    assert kubelet.wait_devices(SHARE4, lambda d: d[0][1] == "Unhealthy") == [(i, "Unhealthy") for i in ids_a]
    # Two shadows of spec 4: count = shadows x N.
    mgr.set_shadows([ShadowSlots(NS, "sh-a", 4), ShadowSlots(NS, "sh-c", 4)])
    assert len(kubelet.wait_devices(SHARE4, lambda d: len(d) == 8)) == 8
    mgr.set_shadows([])
    assert kubelet.wait_devices(SHARE4, lambda d: d == []) == []


def test_bad_shadows_change_nothing(kubelet: KubeletPeer, managers: Factory) -> None:
    mgr = small(managers)
    mgr.set_shadows([ShadowSlots(NS, "sh-a", 4)])
    kubelet.wait_devices(SHARE4, lambda d: len(d) == 4)
    with pytest.raises(InvalidShadow, match="share-gpu-3 is not served"):
        mgr.set_shadows([ShadowSlots(NS, "sh-a", 4), ShadowSlots(NS, "sh-x", 3)])
    assert mgr.shadows() == (ShadowSlots(NS, "sh-a", 4),)
    assert len(mgr.plugin(SHARE4).devices()) == 4


def test_allocate_share_annotation_exact_json(kubelet: KubeletPeer, managers: Factory) -> None:
    mgr = small(managers)
    mgr.set_shadows([ShadowSlots(NS, "sh-a", 4)])
    kubelet.wait_devices(SHARE4, lambda d: len(d) == 4)
    resp = kubelet.allocate(SHARE4, [f"{NS}/sh-a-2"])
    assert dict(resp.annotations) == {
        "gpushare.k8s.io/container-devices-from": '{"gpushare-system/sh-a/main":{"*":["gpushare-system/sh-a-2"]}}'
    }
    assert dict(resp.envs) == {} and list(resp.devices) == [] and list(resp.mounts) == []
    assert list(resp.cdi_devices) == []


def test_allocate_unknown_ids_named(kubelet: KubeletPeer, managers: Factory) -> None:
    mgr = small(managers)
    mgr.set_shadows([ShadowSlots(NS, "sh-a", 4)])
    kubelet.wait_devices(SHARE4, lambda d: len(d) == 4)
    before = len(kubelet.wait_list_count(SHARE4, 1))
    with pytest.raises(grpc.RpcError) as exc:
        kubelet.allocate(SHARE4, [f"{NS}/sh-a-0", f"{NS}/gone-1", f"{NS}/gone-0"])
    assert exc.value.code() == grpc.StatusCode.NOT_FOUND
    assert f"{NS}/gone-0, {NS}/gone-1" in exc.value.details()
    # The proto's rule after a failed Allocate: push the list again.
    kubelet.wait_list_count(SHARE4, before + 1)


def test_preferred_allocation_packs_share(kubelet: KubeletPeer, managers: Factory) -> None:
    mgr = small(managers)
    mgr.set_shadows([ShadowSlots(NS, "sh-a", 4), ShadowSlots(NS, "sh-b", 4)])
    kubelet.wait_devices(SHARE4, lambda d: len(d) == 8)
    available = [f"{NS}/sh-a-{i}" for i in range(4)] + [f"{NS}/sh-b-3"]
    assert kubelet.preferred(SHARE4, available, [], 1) == [f"{NS}/sh-b-3"]
    assert kubelet.preferred(SHARE4, available, [], 2) == [f"{NS}/sh-a-0", f"{NS}/sh-a-1"]


def test_spot_health_allocate_and_preference(kubelet: KubeletPeer, managers: Factory) -> None:
    mgr = small(managers)
    mgr.set_real_devices(
        "nvidia.com/gpu", [AdvertisedDevice("GPU-0"), AdvertisedDevice("GPU-1"), AdvertisedDevice("GPU-2")]
    )
    got = kubelet.wait_devices(SPOT, lambda d: len(d) == 3)
    assert got == [("spot-GPU-0", "Unhealthy"), ("spot-GPU-1", "Unhealthy"), ("spot-GPU-2", "Unhealthy")]
    mgr.set_spot_health("GPU-1", True)
    mgr.set_spot_health("GPU-2", True)
    kubelet.wait_devices(SPOT, lambda d: [h for _, h in d] == ["Unhealthy", "Healthy", "Healthy"])
    resp = kubelet.allocate(SPOT, ["spot-GPU-1"])
    assert dict(resp.annotations) == {"gpushare.k8s.io/container-devices-ids": '{"nvidia.com/gpu":["GPU-1"]}'}
    with pytest.raises(grpc.RpcError) as exc:
        kubelet.allocate(SPOT, ["spot-GPU-0"])
    assert exc.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "spot-GPU-0" in exc.value.details() and "Unhealthy" in exc.value.details()
    # Health is recomputed both ways: an Unhealthy GPU can come back without a restart.
    mgr.set_spot_health("GPU-1", False)
    kubelet.wait_devices(SPOT, lambda d: d[1] == ("spot-GPU-1", "Unhealthy"))
    mgr.set_spot_lent(["GPU-1"])
    assert kubelet.preferred(SPOT, ["spot-GPU-1", "spot-GPU-2"], [], 1) == ["spot-GPU-2"]


def _restart_and_check(kubelet: KubeletPeer, mgr: PluginManager, wipe_dir: bool) -> float:
    mgr.set_shadows([ShadowSlots(NS, "sh-a", 4)])
    kubelet.wait_devices(SHARE4, lambda d: len(d) == 4)
    counts = {r: len(kubelet.registered(r)) for r in mgr.resources}
    start = time.monotonic()
    kubelet.restart(wipe_dir=wipe_dir)
    for r in mgr.resources:
        kubelet.wait_registrations(r, counts[r] + 1, timeout_s=30)  # a loaded machine delays, never a fixed bound
    took = time.monotonic() - start
    # The new stream starts with the full list we had.
    assert len(kubelet.wait_devices(SHARE4, lambda d: len(d) == 4)) == 4
    assert mgr.wait_registered(2), mgr.status()
    # Settled: no restart loop. (A kubelet dial that raced the wipe may add one more client,
    # as real kubelet does, so "+1 or +2" and then no further registrations.)
    time.sleep(1.5)
    settled = {r: len(kubelet.registered(r)) for r in mgr.resources}
    assert all(counts[r] + 1 <= settled[r] <= counts[r] + 2 for r in settled), (counts, settled)
    time.sleep(1.0)
    assert {r: len(kubelet.registered(r)) for r in mgr.resources} == settled
    return took


def test_kubelet_restart_every_plugin_reregisters(kubelet: KubeletPeer, managers: Factory) -> None:
    mgr = small(managers)
    for wipe_dir in (False, True):  # kubelet.sock recreated, then the directory itself
        took = _restart_and_check(kubelet, mgr, wipe_dir=wipe_dir)
        print(f"re-registration {'after a directory wipe ' if wipe_dir else ''}took {took:.2f} s")


def test_own_socket_removed_reregisters(kubelet: KubeletPeer, managers: Factory, plugin_dir: str) -> None:
    small(managers)
    before = len(kubelet.registered(SHARE4))
    os.unlink(os.path.join(plugin_dir, "gpushare-share-gpu-4.sock"))
    kubelet.wait_registrations(SHARE4, before + 1, timeout_s=30)
    assert stat.S_ISSOCK(os.stat(os.path.join(plugin_dir, "gpushare-share-gpu-4.sock")).st_mode)


def test_kubelet_ending_list_and_watch_reregisters(kubelet: KubeletPeer, managers: Factory) -> None:
    small(managers)
    before = len(kubelet.registered(SHARE4))
    kubelet.end_stream(SHARE4)
    kubelet.wait_registrations(SHARE4, before + 1, timeout_s=30)
    kubelet.wait_devices(SHARE4, lambda d: d == [])


def test_registration_waits_for_kubelet(plugin_dir: str, managers: Factory) -> None:
    """No kubelet.sock yet: the plugins retry, and register as soon as kubelet appears."""
    mgr = PluginManager.for_gpushare(plugin_dir, share_specs=(2,), dev_share_specs=(2,), check_interval_s=0.2)
    mgr.start()
    try:
        assert not mgr.wait_registered(0.5)
        peer = KubeletPeer(plugin_dir)
        peer.start()
        try:
            assert mgr.wait_registered(3), mgr.status()
        finally:
            peer.stop()
    finally:
        mgr.stop()
    assert [n for n in os.listdir(plugin_dir) if n.startswith("gpushare-")] == []  # stop removes our sockets


def test_stop_removes_sockets_and_threads(kubelet: KubeletPeer, plugin_dir: str) -> None:
    mgr = PluginManager.for_gpushare(plugin_dir, share_specs=(2,), dev_share_specs=(), spot=True)
    mgr.start()
    assert mgr.wait_registered(5)
    mgr.stop()
    assert sorted(os.listdir(plugin_dir)) == ["kubelet.sock"]
    # (the autouse fixture fails the test if any gpushare-dp-* thread is left)


# --- fake vendor plugin and spot learning ---------------------------------------------------


def test_spot_learns_from_fake_vendor_plugin(kubelet: KubeletPeer, managers: Factory, plugin_dir: str) -> None:
    dev_dir = os.path.join(plugin_dir, "dev")
    os.makedirs(dev_dir)
    fake = FakeGpuPlugin(FAKE, plugin_dir, dev_dir, 3)
    vendor = managers([fake])
    kubelet.wait_devices(FAKE, lambda d: len(d) == 3)
    # The vendor's Allocate, as kubelet would get it for a pod asking for example.com/gpu.
    resp = kubelet.allocate(FAKE, ["fakegpu1", "fakegpu2"])
    assert dict(resp.envs) == {"FAKE_VISIBLE_DEVICES": "fakegpu1,fakegpu2"}
    assert [(d.container_path, d.host_path, d.permissions) for d in resp.devices] == [
        ("/dev/fakegpu1", f"{dev_dir}/fakegpu1", "rw"),
        ("/dev/fakegpu2", f"{dev_dir}/fakegpu2", "rw"),
    ]
    mgr = managers(share_specs=(2,), dev_share_specs=(), spot_sources={FAKE: fake.socket_path})
    got = kubelet.wait_devices(SPOT, lambda d: len(d) == 3)
    assert got == [("spot-fakegpu0", "Unhealthy"), ("spot-fakegpu1", "Unhealthy"), ("spot-fakegpu2", "Unhealthy")]
    assert mgr.real_devices() == {FAKE: ("fakegpu0", "fakegpu1", "fakegpu2")}
    mgr.set_spot_health("fakegpu1", True)
    kubelet.wait_devices(SPOT, lambda d: d[1] == ("spot-fakegpu1", "Healthy"))
    resp = kubelet.allocate(SPOT, ["spot-fakegpu1"])
    assert dict(resp.annotations) == {"gpushare.k8s.io/container-devices-ids": '{"example.com/gpu":["fakegpu1"]}'}
    # The vendor marks the GPU unhealthy: not lendable, whatever the controller says.
    fake.set_health("fakegpu1", False)
    kubelet.wait_devices(SPOT, lambda d: d[1] == ("spot-fakegpu1", "Unhealthy"))
    fake.set_health("fakegpu1", True)
    kubelet.wait_devices(SPOT, lambda d: d[1] == ("spot-fakegpu1", "Healthy"))
    # The vendor plugin goes away: fail closed; it comes back: spot follows again.
    vendor.stop()
    kubelet.wait_devices(SPOT, lambda d: d[1] == ("spot-fakegpu1", "Unhealthy"))
    vendor2 = managers([FakeGpuPlugin(FAKE, plugin_dir, dev_dir, 4)])
    assert vendor2.wait_registered(5)
    got = kubelet.wait_devices(SPOT, lambda d: len(d) == 4, timeout_s=10)
    assert got[1] == ("spot-fakegpu1", "Healthy")


def _gpushare(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*CLI, *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _stop_cli(proc: subprocess.Popen[str]) -> str:
    proc.terminate()
    out, _ = proc.communicate(timeout=15)
    assert proc.returncode == 0, out
    return out


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root; run `sudo make test` (or as root in CI)")
def test_fake_gpus_command(kubelet: KubeletPeer, plugin_dir: str) -> None:
    dev_dir = os.path.join(plugin_dir, "dev")
    proc = _gpushare("fake-gpus", "--count", "2", "--dev-dir", dev_dir, "--plugin-dir", plugin_dir)
    try:
        (reg,) = kubelet.wait_registrations(FAKE, 1, timeout_s=20)
        assert reg.endpoint == "example.com-gpu.sock"
        assert reg.options.get_preferred_allocation_available is False
        assert kubelet.wait_devices(FAKE, lambda d: len(d) == 2) == [("fakegpu0", "Healthy"), ("fakegpu1", "Healthy")]
        for i in range(2):
            st = os.stat(os.path.join(dev_dir, f"fakegpu{i}"))
            assert stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == (1, 3)
            with open(os.path.join(dev_dir, f"fakegpu{i}"), "r+b", buffering=0) as f:  # opens like /dev/null
                assert f.write(b"x") == 1
                assert f.read() == b""
    finally:
        out = _stop_cli(proc)
    assert not os.path.exists(os.path.join(plugin_dir, "example.com-gpu.sock")), out


def test_fake_gpus_refuses_a_wrong_node(plugin_dir: str) -> None:
    dev_dir = os.path.join(plugin_dir, "dev")
    os.makedirs(dev_dir)
    Path(dev_dir, "fakegpu0").write_text("not a device")
    with pytest.raises(Exception, match="not a character device 1:3"):
        create_fake_gpu_nodes(dev_dir, 1)
    assert Path(dev_dir, "fakegpu0").read_text() == "not a device"


def test_deviceplugins_run_command(kubelet: KubeletPeer, plugin_dir: str) -> None:
    cfg = os.path.join(plugin_dir, "cfg.yaml")
    Path(cfg).write_text("version: v1\nshareSpecs: [4]\ndevShareSpecs: [2]\n")
    proc = _gpushare(
        "deviceplugins", "run", "--config", cfg, "--plugin-dir", plugin_dir,
        "--shadow", f"{NS}/sh-a:4", "--shadow", f"{NS}/sh-d:2:share-dev",
    )  # fmt: skip
    try:
        kubelet.wait_registrations(SPOT, 1, timeout_s=20)
        assert len(kubelet.wait_devices(SHARE4, lambda d: len(d) == 4)) == 4
        assert kubelet.wait_devices("gpushare/share-dev-gpu-2", lambda d: len(d) == 2) == [
            (f"{NS}/sh-d-0", "Healthy"),
            (f"{NS}/sh-d-1", "Healthy"),
        ]
        sock = f"{plugin_dir}/gpushare-share-gpu-4.sock"
        listing = subprocess.run(
            [*CLI, "deviceplugins", "list", sock],
            cwd=ROOT, capture_output=True, text=True, timeout=30, check=True,
        )  # fmt: skip
        assert f'"ID": "{NS}/sh-a-3"' in listing.stdout
    finally:
        _stop_cli(proc)


def test_deviceplugins_run_refuses_bad_shadow(plugin_dir: str) -> None:
    proc = _gpushare("deviceplugins", "run", "--plugin-dir", plugin_dir, "--shadow", "ns/sh:7")
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert "share-gpu-7 is not served" in out


def test_stream_limit_protects_unary_workers(kubelet: KubeletPeer, managers: Factory, plugin_dir: str) -> None:
    """ListAndWatch streams pin workers: beyond max_streams they are refused, Allocate still answers."""
    mgr = small(managers)
    mgr.set_shadows([ShadowSlots(NS, "sh-a", 4)])
    path = os.path.join(plugin_dir, "gpushare-share-gpu-4.sock")
    limit = mgr.plugin(SHARE4).max_streams
    channel = grpc.insecure_channel("unix:" + path)
    stub = api_pb2_grpc.DevicePluginStub(channel)
    calls = []
    try:
        for _ in range(limit - 1):  # kubelet already holds one
            call = stub.ListAndWatch(api_pb2.Empty())
            next(call)
            calls.append(call)
        extra = stub.ListAndWatch(api_pb2.Empty())
        with pytest.raises(grpc.RpcError) as exc:
            next(extra)
        assert exc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert kubelet.allocate(SHARE4, [f"{NS}/sh-a-0"]).annotations
    finally:
        for c in calls:
            c.cancel()
        channel.close()


def test_socket_dir_missing_is_named(plugin_dir: str) -> None:
    missing = os.path.join(plugin_dir, "nope")
    mgr = PluginManager.for_gpushare(missing, share_specs=(2,), dev_share_specs=(), spot=False)
    mgr.start()
    try:
        deadline = time.monotonic() + 5
        while not mgr.status()["gpushare/share-gpu-2"]["error"] and time.monotonic() < deadline:
            time.sleep(0.05)
        err = mgr.status()["gpushare/share-gpu-2"]["error"]
        assert missing in err and "directory does not exist" in err
    finally:
        mgr.stop()
    shutil.rmtree(missing, ignore_errors=True)


def test_vendor_resync_does_not_flap_spot(kubelet: KubeletPeer, managers: Factory, plugin_dir: str) -> None:
    """The vendor stream is reopened every resync period; spot's list must not change because of it."""
    fake = FakeGpuPlugin(FAKE, plugin_dir, os.path.join(plugin_dir, "dev"), 2)
    managers([fake])
    mgr = managers(share_specs=(2,), dev_share_specs=(), spot_sources={FAKE: fake.socket_path}, vendor_resync_s=0.2)
    mgr.set_spot_health("fakegpu0", True)
    kubelet.wait_devices(SPOT, lambda d: d == [("spot-fakegpu0", "Healthy"), ("spot-fakegpu1", "Unhealthy")])
    before = len(kubelet.wait_list_count(SPOT, 1))
    time.sleep(1.5)  # about seven resyncs
    assert len(kubelet.wait_list_count(SPOT, 1)) == before
    # ...and it still follows the vendor after all those reopenings.
    fake.set_health("fakegpu0", False)
    kubelet.wait_devices(SPOT, lambda d: d[0] == ("spot-fakegpu0", "Unhealthy"))
