"""controller.spot.kmod_bridge against a recording client: commands, the view, notices, an absent module."""

from __future__ import annotations

import errno

import pytest

from controller.core.actions import KmodCommand
from controller.spot.kmod_bridge import KmodBridge
from gpukmod import KmodError
from tests.unit.controller.spot.spotfakes import RecordingClient


def test_bridge_registers_applies_commands_and_keeps_the_view() -> None:
    client = RecordingClient()
    wakes: list[int] = []
    bridge = KmodBridge(client_factory=lambda unit: client, wake=lambda: wakes.append(1))
    assert bridge.start() and client.registered
    for op, ino in [("add", 1), ("detect", 2), ("add", 3), ("undetect", 2), ("detect", 3), ("delete", 1)]:
        bridge.apply(KmodCommand(op, ino))  # type: ignore[arg-type]
    view = bridge.view()
    assert view.available and view.added == {2, 3} and view.detecting == {3}
    assert client.calls[-1] == ("delete", 1)
    # A notice arrives on the reader thread: queued with its time, the loop woken.
    assert client.callback is not None
    client.callback(3)
    drained = bridge.drain()
    assert [p for p, _ in drained] == [3] and wakes == [1] and bridge.drain() == []
    bridge.apply(KmodCommand("release", 3))
    assert bridge.view().detecting == frozenset()  # release disarms until the next detect
    bridge.close()
    assert client.closed and not bridge.available


def test_bridge_without_module_reports_utilization_alone_and_retries_later() -> None:
    now = [0.0]
    tries: list[int] = []

    def factory(unit: int) -> RecordingClient:
        tries.append(unit)
        raise KmodError(errno.EPROTONOSUPPORT, "open")

    bridge = KmodBridge(unit=29, client_factory=factory, clock=lambda: now[0], retry_s=30.0)
    assert not bridge.start()
    assert "not loaded; spot works on utilization alone" in bridge.reason
    assert bridge.view() == bridge.view() and not bridge.view().available
    assert tries == [29]  # no retry before retry_s
    bridge.apply(KmodCommand("detect", 5))  # nothing to keep in step: a no-op, not an error
    now[0] = 31.0
    bridge.view()
    assert tries == [29, 29]


def test_bridge_treats_enoent_on_undo_commands_as_done_but_raises_others() -> None:
    client = RecordingClient(fail={"undetect": errno.ENOENT, "add": errno.ENOSPC})
    bridge = KmodBridge(client_factory=lambda unit: client)
    bridge.start()
    bridge.apply(KmodCommand("undetect", 7))
    with pytest.raises(KmodError) as info:
        bridge.apply(KmodCommand("add", 8))
    assert info.value.errno == errno.ENOSPC and bridge.view().added == frozenset()
    bridge.close()


def test_bridge_drops_a_vanished_module() -> None:
    client = RecordingClient(fail={"detect": errno.ECONNREFUSED})
    bridge = KmodBridge(client_factory=lambda unit: client)
    bridge.start()
    with pytest.raises(KmodError):
        bridge.apply(KmodCommand("detect", 9))
    assert not bridge.available and client.closed and "unusable" in bridge.reason


def test_a_notice_goes_to_the_return_path_first_and_release_keeps_the_view_armed() -> None:
    client = RecordingClient()
    wakes: list[int] = []
    bridge = KmodBridge(client_factory=lambda unit: client, wake=lambda: wakes.append(1), clock=lambda: 5.0)
    bridge.start()
    bridge.apply(KmodCommand("detect", 3))
    seen: list[tuple[int, float]] = []
    bridge.on_notice = lambda pidns, at: seen.append((pidns, at))
    assert client.callback is not None
    client.callback(3)
    # The return path decides when the notice is queued and wakes the loop itself once it is done,
    # so no pass competes with the kill.
    assert seen == [(3, 5.0)] and bridge.drain() == [] and wakes == []
    bridge.on_notice = None
    client.callback(4)  # no return path: queued and the pass woken here
    assert bridge.drain() == [(4, 5.0)] and wakes == [1]
    bridge.queue_notice(3, 5.0)
    bridge.release(3)
    assert client.calls[-1] == ("release", 3)
    # Still armed in the view: the pass that drains the notice undetects it; meanwhile none re-arms it.
    assert bridge.view().detecting == {3} and bridge.drain() == [(3, 5.0)]
    client.fail["release"] = errno.ENOENT  # already gone from the table (module reloaded): done
    bridge.release(3)
    client.fail["release"] = errno.EIO
    with pytest.raises(KmodError):
        bridge.release(3)
    bridge.close()
