"""The warm pool end to end: K idle shadows stand ready, refill after use, and shrink with the config."""

from __future__ import annotations

import json
from typing import Any

from gpushare import keys
from localcluster.pods import sharer
from tests.integration.failover.conftest import Solo

SHARE4 = "gpushare/share-gpu-4"
# Every served spec of the default pool is kept warm, each shadow holding one of the 4 fake GPUs.
WARM = {"warmShadows": 1, "shareSpecs": [4], "devShareSpecs": [2]}


def shadows(s: Solo) -> list[dict[str, Any]]:
    path = f"/api/v1/namespaces/{keys.DEFAULT_NAMESPACE}/pods?labelSelector={keys.LABEL_ROLE}%3D{keys.ROLE_SHADOW}"
    items: list[dict[str, Any]] = s.cluster.request("GET", path)["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def running(s: Solo, kind: str, n: int) -> list[str]:
    return sorted(
        p["metadata"]["name"]
        for p in shadows(s)
        if p["metadata"]["labels"].get(keys.LABEL_SHARE_KIND) == kind
        and p["metadata"]["labels"].get(keys.LABEL_SHARE_SPEC) == str(n)
        and p["status"].get("phase") == "Running"
    )


def allocatable(s: Solo, resource: str) -> str:
    return str(s.cluster.node()["status"]["allocatable"].get(resource, ""))


def test_the_pool_stands_ready_refills_after_use_and_shrinks_with_the_config(solo: Solo) -> None:
    c = solo.cluster
    solo.restart_with(WARM)
    c.wait_for("one warm shadow per served spec, advertised", lambda: allocatable(solo, SHARE4) == "4", 120)
    c.wait_for("the share-dev-gpu-2 warm shadow", lambda: len(running(solo, keys.KIND_SHARE_DEV, 2)) == 1, 60)
    (warm,) = running(solo, keys.KIND_SHARE, 4)

    # A sharer takes the warm shadow's slots: the pool refills with a second share-gpu-4 shadow.
    c.kubectl("apply", "-f", "-", input=json.dumps(sharer("warm-user")))
    c.wait_pod_phase("warm-user", ["Running"], timeout_s=60)
    c.wait_for("the pool refilled", lambda: len(running(solo, keys.KIND_SHARE, 4)) == 2, 60)
    c.wait_for("its slots advertised", lambda: allocatable(solo, SHARE4) == "8", 60)
    owner = json.loads((c.pod("warm-user") or {})["metadata"]["annotations"][keys.ANNOTATION_SHADOW_OWNER])
    assert list(owner) == [f"{keys.DEFAULT_NAMESPACE}/{warm}"]  # it ran on the shadow that stood ready

    # No warm pool any more: the idle shadows drain and go (idle timeout 3 s); the used one stays.
    solo.restart_with({**WARM, "warmShadows": 0})
    c.wait_for("the pool shrank", lambda: [p["metadata"]["name"] for p in shadows(solo)] == [warm], 90)
    c.wait_for("the count follows", lambda: allocatable(solo, SHARE4) == "4", 30)
    assert (c.pod("warm-user") or {})["status"]["phase"] == "Running"
    log = solo.agent.log_text()
    assert "decision=evict" not in log
    assert log.count("decision=delete-shadow") == 2
