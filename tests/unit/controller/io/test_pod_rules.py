"""CachedPodRules: the NRI plugin's view of a pod's mix of requests, from the node's pod cache."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from controller.io.pod_rules import CachedPodRules
from gpushare import keys
from nri_plugin import OracleUnavailable, PodRules
from tests.unit.controller.podmaker import NODE, pod

SHARE2 = keys.share_resource(keys.KIND_SHARE, 2)
SHARE4 = keys.share_resource(keys.KIND_SHARE, 4)


def rules(*pods: dict[str, Any]) -> CachedPodRules:
    by_key: Mapping[str, Mapping[str, Any]] = {f"{p['metadata']['namespace']}/{p['metadata']['name']}": p for p in pods}
    return CachedPodRules(by_key.get, ["nvidia.com/gpu"])


def test_it_is_the_plugins_pod_rules_and_answers_from_the_cached_pod() -> None:
    cached = rules(
        pod("mix", node=NODE, requests={SHARE2: 1, SHARE4: 1}),
        pod("fine", node=NODE, requests={SHARE4: 1}),
    )
    assert isinstance(cached, PodRules)
    why = cached.refusal("default", "mix", "uid-default-mix")
    assert why is not None and why.startswith(f"gpushare: pod default/mix asks for {SHARE2} and {SHARE4}")
    assert cached.refusal("default", "fine", "uid-default-fine") is None


def test_a_pod_the_cache_does_not_hold_by_uid_or_cannot_read_is_unknown_not_allowed() -> None:
    bad = pod("bad", node=NODE, requests={SHARE4: 1})
    bad["spec"]["containers"][0]["resources"]["requests"][SHARE4] = "1.5"
    cached = rules(pod("old", node=NODE, requests={SHARE4: 1}), bad)
    with pytest.raises(OracleUnavailable, match="has not seen it yet"):
        cached.refusal("default", "new", "u-new")
    with pytest.raises(OracleUnavailable, match="earlier pod of that name"):
        cached.refusal("default", "old", "u-recreated")
    with pytest.raises(OracleUnavailable, match="cannot read it"):
        cached.refusal("default", "bad", "uid-default-bad")
