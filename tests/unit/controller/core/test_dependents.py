"""Which pods an uninstall would strand: sharers, borrowers, DRA claim holders; never owners or shadows."""

from __future__ import annotations

from typing import Any

from controller.core.dependents import DRA_DRIVER, WHY_BORROWER, WHY_CLAIM, WHY_SHARER, WHY_UNREADABLE, dependents
from gpushare import keys
from tests.unit.controller.podmaker import pod


def _claim(ns: str, uid: str, driver: str = DRA_DRIVER) -> dict[str, Any]:
    return {
        "metadata": {"namespace": ns, "name": f"claim-{uid}"},
        "status": {
            "allocation": {"devices": {"results": [{"driver": driver, "pool": "n", "device": "gpu-0-share4-1"}]}},
            "reservedFor": [{"resource": "pods", "name": f"p-{uid}", "uid": uid}],
        },
    }


def test_sharers_borrowers_and_claim_holders_are_listed_with_why() -> None:
    pods = [
        pod("sharer", "team-a", uid="u1", node="n1", phase="Running", requests={"gpushare/share-gpu-4": 1}),
        pod("dev", "team-a", uid="u2", node="n1", phase="Running", requests={"gpushare/share-dev-gpu-8": 1}),
        pod("borrower", "batch", uid="u3", node="n1", phase="Running", requests={keys.RESOURCE_SPOT_GPU: 1}),
        pod("claimer", "team-b", uid="u4", node="n2", phase="Running"),
        pod("pending-sharer", "team-a", uid="u5", requests={"gpushare/share-gpu-2": 1}),
    ]
    found = dependents(pods, [_claim("team-b", "u4")])
    assert [(str(d.ref), d.node, d.why) for d in found] == [
        ("batch/borrower", "n1", WHY_BORROWER),
        ("team-a/dev", "n1", WHY_SHARER),
        ("team-a/pending-sharer", "", WHY_SHARER),
        ("team-a/sharer", "n1", WHY_SHARER),
        ("team-b/claimer", "n2", WHY_CLAIM),
    ]
    assert str(found[0]) == f"batch/borrower on n1: {WHY_BORROWER}"


def test_owners_shadows_finished_and_other_drivers_pods_are_not_dependents() -> None:
    shadow_labels = {keys.LABEL_ROLE: keys.ROLE_SHADOW}
    pods = [
        pod("owner", "team-a", uid="o1", node="n1", phase="Running", requests={"nvidia.com/gpu": 1}),
        pod(
            "shadow",
            keys.DEFAULT_NAMESPACE,
            uid="s1",
            node="n1",
            phase="Running",
            labels=shadow_labels,
            requests={"nvidia.com/gpu": 1},
        ),
        pod("done", "team-a", uid="d1", node="n1", phase="Succeeded", requests={"gpushare/share-gpu-4": 1}),
        pod(
            "going", "team-a", uid="g1", node="n1", phase="Running", deleting=True, requests={"gpushare/share-gpu-4": 1}
        ),
        pod("other-claim", "team-b", uid="c1", node="n1", phase="Running"),
    ]
    assert dependents(pods, [_claim("team-b", "c1", driver="gpu.nvidia.com"), _claim("team-c", "o1")]) == []


def test_a_claim_in_another_namespace_does_not_make_a_same_uid_pod_a_dependent() -> None:
    # reservedFor names pods of the claim's own namespace only.
    assert dependents([pod("p", "team-a", uid="u1", node="n1", phase="Running")], [_claim("team-b", "u1")]) == []


def test_an_unreadable_pod_is_listed_so_the_uninstall_stops() -> None:
    bad = pod("odd", "team-a", uid="x1", node="n1", phase="Running", requests={"gpushare/share-gpu-4": 1}, camel=True)
    bad["spec"]["containers"][0]["resources"]["requests"]["gpushare/share-gpu-4"] = "many"
    (found,) = dependents([bad])
    assert (str(found.ref), found.node, found.why) == ("team-a/odd", "n1", WHY_UNREADABLE)
