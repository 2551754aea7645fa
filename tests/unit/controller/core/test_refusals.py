"""The pods the node will not run on a GPU (controller/core/refusals.py), and what a refused pod keeps."""

from __future__ import annotations

from controller.core.actions import Evict, KillPods, PodToKill, RecordEvent
from controller.core.mapping import MappingCache
from controller.core.model import PodRef
from controller.core.refusals import (
    REASON_POD_UNREADABLE,
    REASON_REQUESTS_REFUSED,
    plan_node_refusals,
    plan_pending_refusals,
)
from gpushare import keys
from tests.unit.controller.podmaker import NODE, pod, row, shadow, snap

SHARE2 = keys.share_resource(keys.KIND_SHARE, 2)
SHARE4 = keys.share_resource(keys.KIND_SHARE, 4)
TWO_SPECS = {SHARE2: 1, SHARE4: 1}


def ref(name: str, ns: str = "default") -> PodRef:
    return PodRef(ns, name, f"uid-{ns}-{name}")


def test_a_refused_pod_on_this_node_is_evicted_in_the_policys_words() -> None:
    s = snap(
        [
            pod("mix", node=NODE, phase="Running", requests=TWO_SPECS),
            pod("elsewhere", node="node-b", phase="Running", requests=TWO_SPECS),
            pod("going", node=NODE, phase="Running", requests=TWO_SPECS, deleting=True),
            pod("fine", node=NODE, phase="Running", requests={SHARE4: 1}),
        ]
    )
    (evict,) = plan_node_refusals(s)
    assert isinstance(evict, Evict) and evict.ref == ref("mix") and evict.reason == REASON_REQUESTS_REFUSED
    assert evict.message.startswith(f"gpushare: pod default/mix asks for {SHARE2} and {SHARE4}; all the slots")
    assert "whether or not the admission policy is on" in evict.message


def test_the_slots_of_a_refused_pod_keep_their_shadows_until_it_is_gone() -> None:
    # The GPU given twice: two specs' shadows deleted as unused while the pod still ran on them.
    rows = [
        row("default/mix", "a", SHARE2, "gpushare-system/s2-0-0"),
        row("default/mix", "b", SHARE4, "gpushare-system/s4-0-1"),
    ]
    s = snap(
        [
            pod("mix", node=NODE, phase="Running", requests=TWO_SPECS),
            shadow("s2-0", 2, users={}),
            shadow("s4-0", 4, users={}),
        ],
        pod_resources=rows,
    )
    mapping = MappingCache.rebuild(rows, s.pods, ["nvidia.com/gpu"])
    assert mapping.users_of("gpushare-system/s2-0") == {"default/mix/a": ("gpushare-system/s2-0-0",)}
    # The users record the leader's idle count reads names it, so neither shadow is empty.
    written = {a.ref.name: a.value for a in mapping.record_updates(s.shadows, s.sharers)}
    assert set(written) == {"s2-0", "s4-0"} and all(v and "default/mix" in v for v in written.values())


def test_an_unreadable_pod_holding_a_gpushare_device_is_killed_then_evicted() -> None:
    bad = pod("bad", node=NODE, phase="Running", requests={SHARE4: 1})
    bad["spec"]["containers"][0]["resources"]["requests"][SHARE4] = "1.5"
    quiet = pod("quiet", node=NODE, phase="Running", requests={"nvidia.com/gpu": 1})
    quiet["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = "x"
    rows = [
        row("default/bad", "app", SHARE4, "gpushare-system/s4-0::0"),
        row("default/quiet", "app", "nvidia.com/gpu", "GPU-1"),
    ]
    s = snap([bad, quiet], pod_resources=rows)
    assert len(s.pod_problems) == 2
    kill, evict = plan_node_refusals(s)
    assert kill == KillPods((PodToKill(ref("bad"), 0),), REASON_POD_UNREADABLE)
    assert isinstance(evict, Evict) and evict.ref == ref("bad") and evict.reason == REASON_POD_UNREADABLE
    assert "1.5" in evict.message and "cannot account for" in evict.message
    # A vendor GPU's holder the agent cannot read is an unknown owner: never lent, so left alone.


def test_the_leader_tells_an_unscheduled_refused_pod_why_once_per_pass() -> None:
    s = snap(
        [
            pod("waiting", requests=TWO_SPECS),
            pod("bound", node=NODE, phase="Running", requests=TWO_SPECS),
            pod("plain", requests={SHARE4: 1}),
        ]
    )
    (event,) = plan_pending_refusals(s)
    assert isinstance(event, RecordEvent) and event.ref == ref("waiting") and event.type == "Warning"
    assert event.reason == REASON_REQUESTS_REFUSED and "gives it no GPU on any node" in event.message
