from __future__ import annotations

import random

import pytest

from controller.core.mapping import Borrowing, Holding, MappingCache, RealHolding
from controller.core.pod_facts import PodRef
from gpushare import keys
from tests.unit.controller.podmaker import NODE, pod, row, shadow, sharer, snap

REAL = ("nvidia.com/gpu",)


def ref(name: str, ns: str = "default") -> PodRef:
    return PodRef(ns, name, f"uid-{ns}-{name}")


PODS = [
    shadow("s"),
    shadow("t", 2),
    sharer("a", node=NODE, phase="Running", containers=["app", "side"]),
    sharer("b", 2, node=NODE, phase="Running"),
    pod("spot", requests={keys.RESOURCE_SPOT_GPU: 1}, node=NODE, phase="Running"),
    pod("owner", requests={"nvidia.com/gpu": 1}, node=NODE, phase="Running"),
    pod("done", requests={"nvidia.com/gpu": 1}, node=NODE, phase="Succeeded"),
]
ROWS = [
    row("default/a", "app", "gpushare/share-gpu-4", "gpushare-system/s-1", "gpushare-system/s-0"),
    row("default/a", "side", "gpushare/share-gpu-4", "gpushare-system/s-2"),
    row("default/b", "app", "gpushare/share-gpu-2", "gpushare-system/t-0"),
    row("default/spot", "app", keys.RESOURCE_SPOT_GPU, "spot-GPU-1"),
    row("default/owner", "app", "nvidia.com/gpu", "GPU-1"),
    row("gpushare-system/s", "main", "nvidia.com/gpu", "GPU-0"),
    row("default/done", "app", "nvidia.com/gpu", "GPU-9"),  # finished: kubelet frees lazily
    row("default/vanished", "app", "nvidia.com/gpu", "GPU-7"),  # not in the pod cache (yet)
    row("default/vanished", "app", "gpushare/share-gpu-4", "gpushare-system/s-3"),
]


def test_rebuild_from_podresources_and_pods() -> None:
    s = snap(PODS)
    m = MappingCache.rebuild(ROWS, s.pods, REAL)
    assert m.holdings == (
        Holding(
            "gpushare-system/s", ref("a"), "app", "gpushare/share-gpu-4", ("gpushare-system/s-0", "gpushare-system/s-1")
        ),
        Holding("gpushare-system/s", ref("a"), "side", "gpushare/share-gpu-4", ("gpushare-system/s-2",)),
        Holding("gpushare-system/t", ref("b"), "app", "gpushare/share-gpu-2", ("gpushare-system/t-0",)),
    )
    assert m.borrowings == (Borrowing("GPU-1", ref("spot"), "app"),)
    assert m.real == (
        RealHolding(ref("owner"), "app", "nvidia.com/gpu", ("GPU-1",)),
        RealHolding(ref("s", "gpushare-system"), "main", "nvidia.com/gpu", ("GPU-0",)),
    )
    assert m.unresolved_real == frozenset({"GPU-7"})
    assert m.users_of("gpushare-system/s") == {
        "default/a/app": ("gpushare-system/s-0", "gpushare-system/s-1"),
        "default/a/side": ("gpushare-system/s-2",),
    }
    assert m.shadows_of("default/a") == frozenset({"gpushare-system/s"})
    assert m.borrowers_of("GPU-1") == (Borrowing("GPU-1", ref("spot"), "app"),)
    assert m.holder_of("GPU-1") == RealHolding(ref("owner"), "app", "nvidia.com/gpu", ("GPU-1",))
    assert m.holder_of("GPU-9") is None


@pytest.mark.parametrize("seed", range(5))
def test_restart_rebuild_gives_the_same_mapping_whatever_the_order(seed: int) -> None:
    first = MappingCache.rebuild(ROWS, snap(PODS).pods, REAL)
    rows, pods = list(ROWS), list(PODS)
    random.Random(seed).shuffle(rows)
    random.Random(seed + 100).shuffle(pods)
    assert MappingCache.rebuild(rows, snap(pods).pods, REAL) == first


def test_unreadable_virtual_id_is_listed_not_trusted() -> None:
    m = MappingCache.rebuild([row("default/a", "app", "gpushare/share-gpu-4", "not an id")], snap(PODS).pods, REAL)
    assert m.holdings == () and "not an id" in m.problems[0]


def test_records_match_the_mapping_and_survive_a_restart() -> None:
    s = snap(PODS)
    m = MappingCache.rebuild(ROWS, s.pods, REAL)
    updates = m.record_updates(s.shadows, s.sharers)
    by_pod = {(u.ref.name, u.key): u.value for u in updates}
    assert by_pod[("a", keys.ANNOTATION_SHADOW_OWNER)] == '{"gpushare-system/s":"uid-gpushare-system-s"}'
    assert by_pod[("t", keys.ANNOTATION_SHADOW_USERS)] == '{"default/b/app":["gpushare-system/t-0"]}'
    # Written back onto the pods, a restarted agent's rebuild asks for no change.
    annotated = []
    for p in PODS:
        extra = {k: v for (name, k), v in by_pod.items() if name == p["metadata"]["name"]}
        annotated.append({**p, "metadata": {**p["metadata"], "annotations": extra or None}})
    s2 = snap(annotated)
    assert MappingCache.rebuild(ROWS, s2.pods, REAL).record_updates(s2.shadows, s2.sharers) == []


def test_a_shadow_without_users_loses_its_stale_record() -> None:
    s = snap([shadow("s", users={"default/old/app": ["gpushare-system/s-0"]})])
    (u,) = MappingCache.rebuild([], s.pods, REAL).record_updates(s.shadows, s.sharers)
    assert (u.ref.name, u.key, u.value) == ("s", keys.ANNOTATION_SHADOW_USERS, None)
