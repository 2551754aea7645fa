"""Inside the QEMU guest: the agent's kernel client against the real gpukmod.ko.

A watched owner (pid 1 of its own pid namespace) issues one 0x46 ioctl while lent: the agent's
KmodBridge gets exactly one notice, one loop pass turns it into exactly one return (state
``back``) and the plan's ``release`` lets the ioctl run — long before ``max_block_ms``. A later
pass sees no second return. Run by tests/integration/kernel/test_qemu.py; skips on the host.
"""

from __future__ import annotations

import time

import pytest

from controller.core.actions import KmodCommand
from controller.spot.killer import PodKiller
from controller.spot.kmod_bridge import KmodBridge
from controller.spot.runtime import SpotRuntime
from controller.spot.solver import SpotState
from tests.integration.kernel.guest.common import Worker, in_guest, module_loaded
from tests.integration.spot.world import agent_pass, spot_world

pytestmark = pytest.mark.skipif(not in_guest(), reason="runs inside the QEMU guest: make kmod-test")

MAX_BLOCK_MS = 3000


def test_watched_owner_ioctl_gives_one_return_released_by_the_agent() -> None:
    with module_loaded(MAX_BLOCK_MS):
        owner = Worker.start()
        woken: list[float] = []
        rt = SpotRuntime(None, KmodBridge(wake=lambda: woken.append(time.monotonic())), PodKiller())
        try:
            assert rt.bridge.start(), rt.bridge.reason
            assert rt.mode() == "kernel module + utilization"
            # One borrower not started yet (no container: nothing to kill), owner away for the window.
            world = spot_world([""], owner_pidns=owner.pidns)
            plan = agent_pass(rt, world)
            assert [g.state for g in plan.gpus] == [SpotState.STOLEN]
            assert KmodCommand("detect", owner.pidns) in plan.actions
            assert rt.kmod_view().detecting == {owner.pidns}

            started = time.monotonic()
            owner.ioctl_async()
            deadline = started + 2.0
            while not woken and time.monotonic() < deadline:
                time.sleep(0.001)
            assert woken, "no notice reached the agent's bridge"
            plan = agent_pass(rt, world)  # the pass the wake triggers
            (_, seconds), *_ = owner.result()
            assert [g.state for g in plan.gpus] == [SpotState.BACK]
            assert [a.op for a in plan.actions if isinstance(a, KmodCommand)][:2] == ["release", "undetect"]
            # Released by the agent: far below the module's own limit.
            assert seconds < MAX_BLOCK_MS / 1000 / 2, seconds
            print(f"owner ioctl held {seconds * 1000:.1f} ms; notice -> wake {(woken[0] - started) * 1000:.1f} ms")

            # Exactly one: no further notice, and the next pass sees no return.
            owner.ioctl()
            time.sleep(0.2)
            assert rt.bridge.drain() == []
            assert rt.bridge.notices_total == 1
            again = agent_pass(rt, world)
            assert SpotState.BACK not in [g.state for g in again.gpus]
        finally:
            rt.close()
            owner.stop()
