"""A rising share count goes out as soon as kubelet holds the devices, never past what kubelet holds
or the agent offers, and a catch-up that kubelet never answers gives up."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

from controller.errors import KubeError
from controller.io.podresources import PodResourcesError
from controller.share.count_catch_up import CountCatchUp

R = "gpushare/share-gpu-4"
OTHER = "gpushare/share-gpu-2"


class World:
    def __init__(self) -> None:
        self.kubelet: dict[str, tuple[str, ...]] = {}
        self.published: list[dict[str, int]] = []
        self.now = 0.0
        self.fail: Exception | None = None
        self.during_publish: Callable[[], None] = lambda: None

    def allocatable(self) -> Mapping[str, tuple[str, ...]]:
        if self.fail is not None:
            raise self.fail
        return dict(self.kubelet)

    def publish(self, counts: Callable[[], Mapping[str, int]]) -> Mapping[str, int]:
        self.during_publish()
        out = dict(counts())
        if out:
            self.published.append(out)
        return out

    def catch_up(self) -> CountCatchUp:
        return CountCatchUp(self.allocatable, self.publish, give_up_s=2.0, clock=lambda: self.now)


def ids(n: int) -> tuple[str, ...]:
    return tuple(f"s{i}" for i in range(n))


def test_a_rise_is_published_once_kubelet_holds_it_and_not_before() -> None:
    w = World()
    c = w.catch_up()
    c.offered(R, 4)
    assert c.waiting() == [R]
    c.step()
    assert w.published == []  # kubelet has not taken the list yet
    w.kubelet[R] = ids(4)
    c.step()
    assert w.published == [{R: 4}]
    assert c.waiting() == []
    c.step()
    assert w.published == [{R: 4}]


def test_only_a_rise_is_awaited() -> None:
    w = World()
    c = w.catch_up()
    c.offered(R, 0)
    c.offered(OTHER, 2)
    c.offered(OTHER, 1)  # lowered before kubelet took it: the lower is the applier's to publish
    assert c.waiting() == []


def test_a_list_shortened_meanwhile_caps_what_goes_out() -> None:
    w = World()
    c = w.catch_up()
    c.offered(R, 8)
    w.kubelet[R] = ids(8)
    # Read under the Node watch's lock: the applier withdrew four slots just before it was taken.
    w.during_publish = lambda: c.offered(R, 4)
    c.step()
    assert w.published == [{R: 4}]


def test_past_the_bound_what_kubelet_holds_goes_out_and_the_wait_ends() -> None:
    w = World()
    c = w.catch_up()
    c.offered(R, 8)
    w.kubelet[R] = ids(3)
    c.step()
    assert w.published == []
    w.now = 2.5
    c.step()
    assert w.published == [{R: 3}]
    assert c.waiting() == []


def test_a_kubelet_that_does_not_answer_delays_nothing_else_and_publishes_nothing() -> None:
    w = World()
    c = w.catch_up()
    c.offered(R, 4)
    w.fail = PodResourcesError("gpushare: kubelet's pod-resources socket does not answer")
    c.step()
    w.now = 3.0
    c.step()
    assert w.published == []
    assert c.waiting() == []


def test_a_failed_publish_ends_that_wait_with_a_warning() -> None:
    w = World()
    c = w.catch_up()
    c.offered(R, 4)
    w.kubelet[R] = ids(4)

    def refuse() -> None:
        raise KubeError("gpushare: PATCH refused")

    w.during_publish = refuse
    c.step()
    assert c.waiting() == []


def test_the_thread_publishes_a_rise_and_stops() -> None:
    w = World()
    w.kubelet[R] = ids(4)
    c = CountCatchUp(w.allocatable, w.publish, poll_s=0.001)
    stop = threading.Event()
    t = threading.Thread(target=c.run, args=(stop,))
    t.start()
    c.offered(R, 4)
    for _ in range(2000):
        if w.published:
            break
        stop.wait(0.001)
    stop.set()
    t.join(5)
    assert not t.is_alive()
    assert w.published == [{R: 4}]
