"""The shortcuts the leader's pod reading takes answer exactly as the plain code they replace.

Reading a pod is most of a leader pass, so its hot spots take shortcuts: json's scanner
without json.loads around it, a str.join instead of a loop to test that a map holds only
text, and one ContainerFacts for equal containers of one snapshot. Each is held here to the
plain version on tenant-shaped input, good and bad.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from controller.core.pod_facts import ReadCache, parse_pod
from controller.core.records import parse_users_annotation
from controller.errors import InvalidObject

_JSON_TEXT = st.text(alphabet=' \t\n\r\ufeff{}[]":,0123456789.-eEtrufalsn\\/ab', max_size=40)
_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
_SPACE = st.text(alphabet=" \t\n\r", max_size=3)


def _users_by_json_loads(value: str | None) -> dict[str, tuple[str, ...]]:
    """parse_users_annotation as it was: json.loads, then a loop over each list."""
    if not value:
        return {}
    try:
        doc = json.loads(value)
    except (ValueError, RecursionError):
        return {}
    if not isinstance(doc, dict):
        return {}
    return {
        user: tuple(sorted(ids))
        for user, ids in doc.items()
        if isinstance(ids, list) and all(isinstance(i, str) for i in ids)
    }


@settings(max_examples=400, deadline=None)
@given(st.one_of(_JSON_TEXT, st.tuples(_SPACE, _JSON_VALUES, _SPACE).map(lambda t: t[0] + json.dumps(t[1]) + t[2])))
def test_users_record_reads_as_json_loads_reads_it(text: str) -> None:
    assert parse_users_annotation(text) == _users_by_json_loads(text)


_SCALARS = st.one_of(
    st.text(max_size=6), st.integers(-2, 2**64), st.booleans(), st.none(), st.floats(allow_nan=False), st.just(b"x")
)


def _pod(labels: Any, requests: Any, started: bool) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": "Pending"}
    if started:
        status["containerStatuses"] = [{"name": "app", "containerID": "containerd://abc", "state": {"running": {}}}]
    return {
        "metadata": {"namespace": "t", "name": "p", "uid": "u", "labels": labels},
        "spec": {"containers": [{"name": "app", "resources": {"requests": requests, "limits": requests}}]},
        "status": status,
    }


def _read(pod: dict[str, Any], cache: ReadCache | None) -> object:
    try:
        return parse_pod(pod, cache)
    except InvalidObject as exc:
        return ("refused", str(exc), exc.field)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(_SCALARS, _SCALARS, max_size=3),
    st.lists(
        st.tuples(st.dictionaries(st.sampled_from(["nvidia.com/gpu", "gpushare/share-gpu-2", "cpu"]), _SCALARS)),
        min_size=1,
        max_size=4,
    ),
    st.booleans(),
)
def test_one_snapshots_shared_reads_change_no_pods_facts(labels: Any, requests: list[Any], started: bool) -> None:
    """Pods read through one ReadCache, in any order, read as each does alone: 1, True and "1" stay apart."""
    cache = ReadCache()
    for (req,) in requests:
        pod = _pod(labels, req, started)
        assert _read(pod, cache) == _read(pod, None)
