"""Reading pod dicts: both spellings of the client, and refusals that name the pod and field."""

from __future__ import annotations

from typing import Any

import pytest

from controller.core.pod_facts import PodRef, parse_pod
from controller.errors import InvalidObject
from tests.unit.controller.podmaker import NODE, pod


def test_to_dict_and_api_json_spellings_read_the_same() -> None:
    args: dict[str, Any] = {
        "node": NODE,
        "phase": "Running",
        "selector": {"zone": "a"},
        "requests": {"gpushare/share-gpu-4": 1, "cpu": "100m"},
        "container_ids": {"app": "abc123"},
        "deleting": True,
    }
    snake, camel = parse_pod(pod("p", **args)), parse_pod(pod("p", camel=True, **args))
    assert snake == camel
    assert snake.node_name == NODE and snake.is_terminating and snake.node_selector == (("zone", "a"),)
    assert snake.containers[0].container_id == "abc123"  # the runtime scheme is stripped
    assert snake.containers[0].resources == (("gpushare/share-gpu-4", 1),)  # cpu is not a device


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda p: p["metadata"].pop("uid"), "lacks metadata.namespace, name or uid"),
        (lambda p: p["spec"]["containers"][0]["resources"]["requests"].update({"nvidia.com/gpu": "0.5"}), "0.5"),
        # a digit int() cannot read: refused like any other bad quantity, not a crash of the pass
        (lambda p: p["spec"]["containers"][0]["resources"]["requests"].update({"nvidia.com/gpu": "²"}), "'²'"),
        (lambda p: p["metadata"].update(labels={"a": 1}), "metadata.labels"),
        (lambda p: p["spec"]["containers"][0].pop("name"), "has no name"),
        (lambda p: p["spec"].update(containers=True), "spec.containers must be a list of objects"),
        (lambda p: p.update(status="Running"), "status must be an object"),
        (lambda p: p["spec"]["containers"][0].update(resources={"limits": [1]}), "resources.limits must be an object"),
    ],
)
def test_unreadable_pod_is_refused_with_its_name_and_field(mutate: object, needle: str) -> None:
    raw = pod("broken")
    mutate(raw)  # type: ignore[operator]
    with pytest.raises(InvalidObject, match="gpushare: ") as err:
        parse_pod(raw)
    assert needle in str(err.value)


def test_pod_ref_key() -> None:
    assert PodRef("ns", "p", "u").key == "ns/p" == str(PodRef("ns", "p", "u"))
    assert (
        f"{PodRef('ns', 'p', 'u')}" == "ns/p"
        and repr(PodRef("ns", "p", "u")) == "PodRef(namespace='ns', name='p', uid='u')"
    )


def test_pod_refs_order_hash_and_compare_by_namespace_name_uid() -> None:
    # What sorting the snapshot's roles, sets of refs and equal actions rely on.
    refs = [PodRef("b", "a", "1"), PodRef("a", "b", "2"), PodRef("a", "b", "1"), PodRef("a", "a", "9")]
    assert sorted(refs) == [PodRef("a", "a", "9"), PodRef("a", "b", "1"), PodRef("a", "b", "2"), PodRef("b", "a", "1")]
    assert PodRef("a", "b", "1") == PodRef("a", "b", "1") != PodRef("a", "b", "2")
    assert len({PodRef("a", "b", "1"), PodRef("a", "b", "1"), PodRef("a", "b", "2")}) == 2
    with pytest.raises(AttributeError):
        PodRef("a", "b", "1").uid = "2"  # type: ignore[misc]
