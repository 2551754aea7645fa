"""The Stub against a byte-level fake runtime over a real Unix socket (mux + ttrpc on the wire)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from gpushare import keys
from gpushare.config import load_config
from gpushare.errors import InstructionRefused
from nri_plugin import Injector, NriError, Stub, derive_mask
from nri_plugin._pb import nri_pb2
from nri_plugin.errors import ConnectionClosed, DeadlineExceeded, RpcStatusError
from nri_plugin.stub import VALID_EVENTS_MASK

from .fake_runtime import FakeRuntime

FAILED_PRECONDITION, DEADLINE_EXCEEDED, UNIMPLEMENTED, INVALID_ARGUMENT = 9, 4, 12, 3


@pytest.fixture
def runtime() -> Iterator[FakeRuntime]:
    rt = FakeRuntime()
    rt.listen()
    yield rt
    rt.cleanup()


class Running:
    """A stub serving in a thread until the test ends."""

    def __init__(self, plugin: object, rt: FakeRuntime, **kwargs: object) -> None:
        self.stub = Stub(plugin, socket_path=rt.path, backoff_initial_s=0.05, **kwargs)  # type: ignore[arg-type]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.stub.run, args=(self.stop,), name="gpushare-nri-run")
        self.thread.start()

    def wait_connections(self, n: int, timeout_s: float = 30.0) -> int:
        """The runtime sees Synchronize answered a moment before the stub counts the handshake; on a
        machine running three lanes of clusters that moment has exceeded 5 s."""
        deadline = time.monotonic() + timeout_s
        while self.stub.connections < n and time.monotonic() < deadline:
            time.sleep(0.005)
        return self.stub.connections

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        self.stub.close()
        assert not self.thread.is_alive()


@pytest.fixture
def injector() -> Injector:
    return Injector(load_config(None))


@pytest.fixture
def running(runtime: FakeRuntime, injector: Injector) -> Iterator[Running]:
    r = Running(injector, runtime)
    assert runtime.ready.wait(30), "handshake did not finish"
    yield r
    r.close()


def _pod(pid: str = "p1", **ann: str) -> nri_pb2.PodSandbox:
    return nri_pb2.PodSandbox(id=pid, name="pod-" + pid, namespace="ns", annotations=ann)


def _ctr(cid: str, name: str, pid: str = "p1", devices: int = 1) -> nri_pb2.Container:
    c = nri_pb2.Container(id=cid, pod_sandbox_id=pid, name=name, env=["NVIDIA_VISIBLE_DEVICES=0", "HOME=/root"])
    for i in range(devices):
        d = c.linux.devices.add(path=f"/dev/fakegpu{i}", type="c", major=10, minor=200 + i)
        d.file_mode.value = 0o666
    return c


DIND = {keys.POD_ANNOTATION_DEVICES_FROM_PREFIX + "dind": "main"}


def _create(rt: FakeRuntime, pod: nri_pb2.PodSandbox, ctr: nri_pb2.Container, **kw: object):  # type: ignore[no-untyped-def]
    return rt.call("CreateContainer", nri_pb2.CreateContainerRequest(pod=pod, container=ctr), **kw)  # type: ignore[arg-type]


# --- mask ---------------------------------------------------------------------------------------


class _Create:
    def create_container(self, pod: object, ctr: object) -> None: ...


class _Lifecycle(_Create):
    def remove_container(self, pod: object, ctr: object) -> None: ...
    def remove_pod_sandbox(self, pod: object) -> None: ...
    def synchronize(self, pods: object, ctrs: object) -> None: ...
    # Not an event: must not change the mask.
    def update_pod_sandbox(self, pod: object) -> None: ...


class _Nothing:
    def synchronize(self, pods: object, ctrs: object) -> None: ...


class _All:
    pass


for _name in [
    "run_pod_sandbox",
    "stop_pod_sandbox",
    "remove_pod_sandbox",
    "create_container",
    "post_create_container",
    "start_container",
    "post_start_container",
    "update_container",
    "post_update_container",
    "stop_container",
    "remove_container",
    "validate_container_adjustment",
    "post_update_pod_sandbox",
]:
    setattr(_All, _name, lambda self, *a: None)


@pytest.mark.parametrize(("plugin", "mask"), [(_Create(), 0x008), (_Lifecycle(), 0x40C), (_All(), 0x7FF)])
def test_mask_is_derived_from_methods_and_capped(plugin: object, mask: int) -> None:
    assert derive_mask(plugin) == mask
    assert derive_mask(plugin) & ~VALID_EVENTS_MASK == 0


def test_injector_mask_and_a_plugin_that_handles_nothing_is_refused(injector: Injector) -> None:
    assert derive_mask(injector) == 0x44C  # create, post-start (a shadow started), remove container, remove pod
    with pytest.raises(NriError, match="handles no NRI event"):
        derive_mask(_Nothing())


@pytest.mark.parametrize(("kwargs", "needle"), [({"index": "1"}, "two digits"), ({"name": ""}, "must not be empty")])
def test_bad_name_or_index_is_refused_before_dialing(kwargs: dict[str, str], needle: str) -> None:
    with pytest.raises(NriError, match=needle):
        Stub(_Create(), socket_path="/nonexistent", **kwargs)


# --- handshake and dispatch -------------------------------------------------------------------


def test_handshake_registers_name_index_and_mask(runtime: FakeRuntime, running: Running) -> None:
    assert runtime.registration is not None
    assert (runtime.registration.plugin_name, runtime.registration.plugin_idx) == ("gpushare", "10")
    assert runtime.configure_reply is not None and runtime.configure_reply.events == 0x44C
    assert running.wait_connections(1) == 1


def test_dind_adjustment_then_refusal_keeps_plugin_connected(runtime: FakeRuntime, running: Running) -> None:
    pod = _pod(**DIND)
    assert _create(runtime, pod, _ctr("c1", "main")).code == 0
    reply = _create(runtime, pod, nri_pb2.Container(id="c2", pod_sandbox_id="p1", name="dind"))
    assert reply.code == 0
    adj = nri_pb2.CreateContainerResponse.FromString(reply.payload).adjust
    assert [(d.path, d.type, d.major, d.minor, d.file_mode.value) for d in adj.linux.devices] == [
        ("/dev/fakegpu0", "c", 10, 200, 0o666)
    ]
    assert [(e.key, e.value) for e in adj.env] == [("NVIDIA_VISIBLE_DEVICES", "0")]
    # A target whose source is unknown: that container fails with a message, the plugin stays.
    bad = _create(runtime, _pod("p2", **DIND), nri_pb2.Container(id="c3", pod_sandbox_id="p2", name="dind"))
    assert bad.code == FAILED_PRECONDITION
    assert bad.message.startswith("gpushare:") and "not created yet" in bad.message
    assert _create(runtime, _pod("p3"), _ctr("c4", "main", "p3")).code == 0
    assert runtime.accepts == 1


def test_remove_container_event_forgets_the_source(runtime: FakeRuntime, running: Running) -> None:
    pod = _pod(**DIND)
    main = _ctr("c1", "main")
    assert _create(runtime, pod, main).code == 0
    ev = nri_pb2.StateChangeEvent(event=nri_pb2.REMOVE_CONTAINER, pod=pod, container=main)
    assert runtime.call("StateChange", ev).code == 0
    reply = _create(runtime, pod, nri_pb2.Container(id="c2", pod_sandbox_id="p1", name="dind"))
    assert reply.code == FAILED_PRECONDITION


def test_dedicated_v012_remove_rpcs_reach_the_plugin(
    runtime: FakeRuntime, running: Running, injector: Injector
) -> None:
    pod = _pod(**DIND)
    main = _ctr("c1", "main")
    assert _create(runtime, pod, main).code == 0
    assert runtime.call("RemoveContainer", nri_pb2.RemoveContainerRequest(pod=pod, container=main)).code == 0
    assert "c1" not in injector.cache.view.containers
    assert runtime.call("RemovePodSandbox", nri_pb2.RemovePodSandboxRequest(pod=pod)).code == 0
    assert "p1" not in injector.cache.view.pods
    # An event the plugin does not handle is still answered (it is simply not subscribed).
    assert runtime.call("StartContainer", nri_pb2.RemoveContainerRequest(pod=pod, container=main)).code == 0


def test_split_synchronize_is_collected(runtime: FakeRuntime, running: Running, injector: Injector) -> None:
    pod = _pod(**DIND)
    first = runtime.call("Synchronize", nri_pb2.SynchronizeRequest(pods=[pod], more=True))
    assert first.code == 0 and nri_pb2.SynchronizeResponse.FromString(first.payload).more
    last = runtime.call("Synchronize", nri_pb2.SynchronizeRequest(containers=[_ctr("c1", "main")]))
    resp = nri_pb2.SynchronizeResponse.FromString(last.payload)
    assert not resp.more and not resp.update
    assert set(injector.cache.view.containers) == {"c1"}
    assert _create(runtime, pod, nri_pb2.Container(id="c2", pod_sandbox_id="p1", name="dind")).code == 0


@pytest.mark.parametrize(
    ("service", "method", "needle"),
    [
        ("nri.pkg.api.v1alpha1.Plugin", "PostUpdatePodSandbox", "method PostUpdatePodSandbox"),
        ("nri.pkg.api.v1alpha1.Plugin", "ValidateContainerAdjustment", "method ValidateContainerAdjustment"),
        ("some.Other", "Configure", "service some.Other"),
    ],
)
def test_unknown_method_or_service_is_unimplemented(
    runtime: FakeRuntime, running: Running, service: str, method: str, needle: str
) -> None:
    reply = runtime.call(method, nri_pb2.Empty(), service=service)
    assert (reply.code, reply.message) == (UNIMPLEMENTED, needle)


def test_even_or_reused_stream_ids_are_invalid(runtime: FakeRuntime, running: Running) -> None:
    # The handshake used 1 and 3.
    assert runtime.call("Shutdown", nri_pb2.Empty(), sid=4).code == INVALID_ARGUMENT
    assert runtime.call("Shutdown", nri_pb2.Empty(), sid=3).code == INVALID_ARGUMENT
    runtime._next_sid = 9
    assert runtime.call("Shutdown", nri_pb2.Empty()).code == 0


def test_large_reply_starts_with_a_frame_of_at_most_4096_bytes(runtime: FakeRuntime, running: Running) -> None:
    pod = _pod(**DIND)
    assert _create(runtime, pod, _ctr("c1", "main", devices=300)).code == 0
    runtime.frames_seen.clear()
    reply = _create(runtime, pod, nri_pb2.Container(id="c2", pod_sandbox_id="p1", name="dind"))
    adj = nri_pb2.CreateContainerResponse.FromString(reply.payload).adjust
    assert len(adj.linux.devices) == 300 and len(reply.payload) > 8192
    assert runtime.max_first_frame_seen <= 4096
    assert runtime.frames_seen[0][1] == 4096 and len(runtime.frames_seen) == 2


class _Slow:
    def __init__(self) -> None:
        self.release = threading.Event()
        self.returned = threading.Event()

    def create_container(self, pod: object, ctr: object) -> None:
        self.release.wait(60)
        self.returned.set()


def test_slow_handler_answers_deadline_exceeded_and_stays_connected(runtime: FakeRuntime) -> None:
    plugin = _Slow()
    r = Running(plugin, runtime)
    try:
        assert runtime.ready.wait(30)
        reply = _create(runtime, _pod(), _ctr("c1", "main"), timeout_nano=400_000_000)
        assert reply.code == DEADLINE_EXCEEDED and "did not finish" in reply.message
        assert not plugin.returned.is_set()  # answered at the deadline, not when the handler gave up
        plugin.release.set()
        assert _create(runtime, _pod(), _ctr("c2", "main")).code == 0
    finally:
        plugin.release.set()
        r.close()


class _Crashing:
    def create_container(self, pod: object, ctr: object) -> None:
        raise RuntimeError("boom")


def test_handler_crash_is_internal_error(runtime: FakeRuntime) -> None:
    r = Running(_Crashing(), runtime)
    try:
        assert runtime.ready.wait(30)
        reply = _create(runtime, _pod(), _ctr("c1", "main"))
        assert reply.code == 13 and "boom" in reply.message
    finally:
        r.close()


# --- connection lifecycle ---------------------------------------------------------------------


def test_reconnects_after_runtime_restart(runtime: FakeRuntime, running: Running) -> None:
    runtime.stop()
    runtime.ready.clear()
    time.sleep(0.2)
    runtime.listen()
    assert runtime.ready.wait(30), "stub did not reconnect"
    assert running.wait_connections(2) == 2
    assert _create(runtime, _pod(), _ctr("c1", "main")).code == 0


def test_refused_registration_fails_connect_without_leaking(runtime: FakeRuntime) -> None:
    runtime.register_status = (2, 'invalid plugin index "1"')
    stub = Stub(_Create(), socket_path=runtime.path, timeout_s=2.0)
    with pytest.raises(RpcStatusError, match="invalid plugin index") as err:
        stub.connect()
    assert err.value.code == 2
    stub.close()
    stub.close()  # idempotent


def test_missing_socket_names_the_path_and_leaves_nothing(tmp_path: object) -> None:
    before = set(threading.enumerate())
    stub = Stub(_Create(), socket_path="/tmp/gs-does-not-exist/nri.sock")
    with pytest.raises(ConnectionClosed, match=r"/tmp/gs-does-not-exist/nri\.sock"):
        stub.connect()
    assert set(threading.enumerate()) == before
    stub.close()
    with pytest.raises(ConnectionClosed, match="closed"):
        stub.connect()


def test_run_retries_until_the_socket_appears(tmp_path: object) -> None:
    rt = FakeRuntime()
    r = Running(_Create(), rt)
    try:
        time.sleep(0.3)  # a few failed dials with back-off
        rt.listen()
        assert rt.ready.wait(30)
    finally:
        r.close()
        rt.cleanup()


def test_preconnected_fd(monkeypatch: pytest.MonkeyPatch, injector: Injector) -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    rt = FakeRuntime()
    rt.serve_socket(theirs)
    monkeypatch.setenv("NRI_PLUGIN_SOCKET", str(ours.detach()))
    monkeypatch.setenv("NRI_PLUGIN_IDX", "42")
    stub = Stub.from_environment(injector)
    stop = threading.Event()
    t = threading.Thread(target=stub.run, args=(stop,), name="gpushare-nri-run")
    t.start()
    try:
        assert rt.ready.wait(30)
        assert rt.registration is not None and rt.registration.plugin_idx == "42"
        assert _create(rt, _pod(), _ctr("c1", "main")).code == 0
        rt.drop_connection()  # a pre-connected plugin cannot redial: run returns
        t.join(5)
        assert not t.is_alive()
    finally:
        stop.set()
        t.join(5)
        stub.close()
        rt.cleanup()


def test_from_environment_requires_the_fd(monkeypatch: pytest.MonkeyPatch, injector: Injector) -> None:
    monkeypatch.delenv("NRI_PLUGIN_SOCKET", raising=False)
    with pytest.raises(NriError, match="NRI_PLUGIN_SOCKET"):
        Stub.from_environment(injector)


def test_refusal_is_instruction_refused_type() -> None:
    # The stub maps InstructionRefused to FAILED_PRECONDITION; pin that the injector raises it.
    inj = Injector(load_config(None))
    with pytest.raises(InstructionRefused):
        inj.create_container(_pod(**DIND), nri_pb2.Container(id="c2", pod_sandbox_id="p1", name="dind"))


def test_silent_runtime_is_a_deadline_not_a_hang(runtime: FakeRuntime) -> None:
    runtime.silent = True
    stub = Stub(_Create(), socket_path=runtime.path, timeout_s=0.5)
    start = time.monotonic()
    with pytest.raises(DeadlineExceeded, match="RegisterPlugin"):
        stub.connect()
    assert time.monotonic() - start < 2.0
    stub.close()


def test_garbage_from_the_runtime_drops_the_connection_and_the_stub_reconnects(
    runtime: FakeRuntime, running: Running
) -> None:
    runtime.ready.clear()
    runtime.send_raw(b"\x00\x00\x00\x00\x00\x00\x00\x04junk")  # mux frame for reserved conn id 0
    assert runtime.ready.wait(30), "stub did not reconnect after a protocol error"
    assert running.wait_connections(2) == 2
    assert _create(runtime, _pod(), _ctr("c1", "main")).code == 0


def test_frames_for_unopened_connections_are_dropped(runtime: FakeRuntime, running: Running) -> None:
    runtime.send_raw(b"\x00\x00\x00\x07\x00\x00\x00\x03abc")  # conn 7: nobody listens there
    assert _create(runtime, _pod(), _ctr("c1", "main")).code == 0
    assert running.wait_connections(1) == 1
