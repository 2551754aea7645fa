"""A tenant writes every field of its pod: what each reader does with values meant to break it.

Each value here once failed (or could fail) a whole pass; now it costs its own pod, is named
in a problem with a fixed ``field`` word, and leaves every other pod's reading as it was.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from controller.core.actions import CreateShadow
from controller.core.mapping import MappingCache
from controller.core.pod_facts import FIELD_UNREADABLE, PodRef
from controller.core.pod_problems import REASON_INVALID_POD, ProblemTracker
from controller.core.records import parse_owner_annotation, parse_users_annotation
from controller.share.cluster_view import merge_pods
from controller.share.solver import plan_shadows
from gpushare import keys
from gpushare.config import Config
from tests.unit.controller.podmaker import NODE, pod, row, sharer, snap

DEEP_JSON = "[" * 100_000 + "]" * 100_000
CFG = Config(node_name=NODE)


def test_deeply_nested_json_in_a_record_reads_as_no_record() -> None:
    # json.loads raises RecursionError here, which is not a ValueError.
    assert parse_owner_annotation(DEEP_JSON) == {}
    assert parse_users_annotation(DEEP_JSON) == {}
    assert parse_owner_annotation('{"a":' * 50_000 + "1" + "}" * 50_000) == {}


def test_an_owner_record_keeps_only_entries_shaped_like_the_agents() -> None:
    record = (
        '{"gpushare-system/shadow-share-4-0a1b2c3d-0":"uid-1",'
        '"team/other":"uid-2",'  # not a shadow's namespace
        f'"gpushare-system/{"s" * 64}":"uid-3",'  # longer than any shadow name
        '"gpushare-system/":"uid-4",'
        '"gpushare-system/x":' + '"' + "u" * 65 + '",'  # longer than a uid
        '"gpushare-system/y":7}'
    )
    assert parse_owner_annotation(record) == {"gpushare-system/shadow-share-4-0a1b2c3d-0": "uid-1"}


def test_a_sharer_with_a_deep_json_owner_record_is_still_a_sharer() -> None:
    s = snap([sharer("web", annotations={keys.ANNOTATION_SHADOW_OWNER: DEEP_JSON})])
    assert [p.ref.name for p in s.sharers] == ["web"] and s.sharers[0].owner_shadows == {}
    assert s.problems == ()


@pytest.mark.parametrize(
    ("quantity", "needle"),
    [
        ("²", "is not a whole number"),  # str.isdigit() says yes, int() says no
        ("٣", "is not a whole number"),  # int() reads it as 3: not the API's spelling
        ("9" * 5000, "is not a whole number"),  # int() refuses more than 4300 digits
        (str(2**63), "is more than"),
        (2**64, "is not a whole number"),
        (-1, "is not a whole number"),
    ],
)
def test_a_quantity_the_api_could_not_have_written_costs_only_its_pod(quantity: Any, needle: str) -> None:
    pods = [pod("bad", requests={"gpushare/share-gpu-4": "1"}), sharer("good")]
    pods[0]["spec"]["containers"][0]["resources"]["requests"]["gpushare/share-gpu-4"] = quantity
    s = snap(pods)
    assert [p.ref.name for p in s.sharers] == ["good"]
    (problem,) = s.pod_problems
    assert problem.field == "resources" and problem.ref is not None and problem.ref.name == "bad"
    assert needle in problem.message


def test_a_share_resource_with_a_non_ascii_spec_is_not_a_share_resource() -> None:
    s = snap([pod("odd", requests={"gpushare/share-gpu-²": 1})])
    assert s.sharers == () and s.problems == ()
    assert keys.parse_share_resource("gpushare/share-gpu-²") is None


def test_a_container_asking_more_slots_than_a_shadow_has_is_refused_not_multiplied() -> None:
    # Every slot of one container comes from one shadow: 10**18 slots of share-gpu-4 would have
    # asked the leader for 2.5 * 10**17 shadows in one pass.
    s = snap([sharer("greedy", qty=10**18), sharer("fine", qty=4)])
    assert [p.ref.name for p in s.sharers] == ["fine"]
    assert s.pod_problems[0].field == "resources" and "ask for at most that" in s.pod_problems[0].message
    plan = plan_shadows(s, CFG, 0.0, {})
    assert len(plan.actions) == 1


class _Exploding(dict[str, Any]):
    """A pod whose reader hits an exception no rule foresaw."""

    def get(self, key: str, default: Any = None) -> Any:
        if key == "spec":
            raise RecursionError("maximum recursion depth exceeded")
        return super().get(key, default)


def test_any_exception_while_reading_a_pod_costs_that_pod_only() -> None:
    bad = _Exploding(sharer("bad"))
    s = snap([bad, sharer("good")])
    assert [p.ref.name for p in s.sharers] == ["good"]
    (problem,) = s.pod_problems
    assert problem.field == FIELD_UNREADABLE and problem.ref == PodRef("default", "bad", "uid-default-bad")
    assert "RecursionError" in problem.message and problem.message.startswith("gpushare: ")


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda p: p["metadata"].update(labels={"a": 1}), "metadata.labels"),
        (lambda p: p["metadata"].update(annotations=["x"]), "metadata.annotations"),
        (lambda p: p["spec"].update(node_selector={"k": None}), "spec.nodeSelector"),
        (lambda p: p["spec"].update(containers=[{"image": "x"}]), "spec.containers"),
        (lambda p: p["spec"].update(containers="app"), "spec.containers"),
        (lambda p: p.update(spec=[]), "spec"),
    ],
)
def test_each_problem_names_its_field_in_a_fixed_word(mutate: Any, field: str) -> None:
    bad = sharer("bad")
    mutate(bad)
    (problem,) = snap([bad]).pod_problems
    assert problem.field == field


def test_a_forged_visibility_env_or_annotation_does_not_make_a_holder() -> None:
    """Who holds a real GPU comes from kubelet's rows alone: env and annotations are never read."""
    forger = pod(
        "forger",
        "evil",
        node=NODE,
        phase="Running",
        labels={keys.LABEL_LENDABLE: "true"},
        annotations={
            "cdi.k8s.io/gpu": "nvidia.com/gpu=GPU-1",
            keys.ANNOTATION_DEVICES_IDS: '{"nvidia.com/gpu":["GPU-1"]}',
        },
        requests={"nvidia.com/gpu": 1},
    )
    forger["spec"]["containers"][0]["env"] = [
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "GPU-1"},
        {"name": "CUDA_VISIBLE_DEVICES", "value": "0"},
    ]
    victim = pod("victim", "team", node=NODE, phase="Running", requests={"nvidia.com/gpu": 1})
    s = snap([forger, victim])
    rows = [row("team/victim", "app", "nvidia.com/gpu", "GPU-1"), row("evil/forger", "app", "nvidia.com/gpu", "GPU-2")]
    mapping = MappingCache.rebuild(rows, s.pods, ["nvidia.com/gpu"])
    holder = mapping.holder_of("GPU-1")
    assert holder is not None and holder.pod.key == "team/victim"
    owners = {o.ref.key: o.real_ids for o in mapping.owners(s, ["nvidia.com/gpu"])}
    assert owners == {"evil/forger": ("GPU-2",), "team/victim": ("GPU-1",)}
    # Without a row, the forger holds nothing at all, whatever it claims.
    mapping = MappingCache.rebuild(rows[:1], s.pods, ["nvidia.com/gpu"])
    assert [o.ref.key for o in mapping.owners(s, ["nvidia.com/gpu"])] == ["team/victim"]


def test_merge_pods_keeps_an_object_without_metadata_for_the_snapshot_to_report() -> None:
    merged = merge_pods([sharer("a"), {"metadata": "x"}], ["not a pod"])
    s = snap(list(merged))
    assert [p.ref.name for p in s.sharers] == ["a"] and len(s.pod_problems) == 2


def _problems(names: list[str]) -> Iterator[Any]:
    for n in names:
        yield from snap([sharer(n, annotations=None)] if n == "ok" else [_bad(n)]).pod_problems


def _bad(name: str) -> dict[str, Any]:
    p = sharer(name)
    p["metadata"]["labels"] = {"k": 1}
    return p


def test_the_tracker_reports_a_problem_once_and_owes_each_pod_a_warning() -> None:
    tracker = ProblemTracker()
    new, events = tracker.update(_problems(["a", "b", "c"]))
    assert [p.ref.name for p in new if p.ref] == ["a", "b", "c"] and tracker.counts == {"metadata.labels": 3}
    assert [(e.ref.name, e.reason, e.type) for e in events] == [
        ("a", REASON_INVALID_POD, "Warning"),
        ("b", REASON_INVALID_POD, "Warning"),
        ("c", REASON_INVALID_POD, "Warning"),
    ]
    assert events[0].message.endswith("; gpushare ignores this pod until it is fixed")
    new, events = tracker.update(_problems(["a", "b", "c"]))
    assert new == [] and len(events) == 3 and tracker.counts == {"metadata.labels": 3}  # the applier de-duplicates
    # Fixed, then broken again: new again.
    tracker.update(_problems(["b", "c"]))
    new, _ = tracker.update(_problems(["a", "b", "c"]))
    assert [p.ref.name for p in new if p.ref] == ["a"] and tracker.counts == {"metadata.labels": 4}


def test_a_lone_surrogate_in_a_node_selector_names_a_shadow_all_the_same() -> None:
    s = snap([sharer("odd", selector={"gpu": "\ud800"}), sharer("plain")])
    made = [a for a in plan_shadows(s, CFG, 0.0, {}).actions if isinstance(a, CreateShadow)]
    assert len(made) == 2 and made[0].name != made[1].name
