"""Theft attempts, written as an attacker would (design §8).

A user controls pod annotations only: containers' annotations come from kubelet and the device
plugins. So every attack below is a pod annotation, and the rule under test is that only an
annotation gpushare's own device plugin wrote for the container (checked against kubelet's
PodResources) ever moves a device across pods.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpushare import codecs, keys
from localcluster.pods import pod_manifest, sharer
from tests.integration.e2e.conftest import Env
from tests.integration.e2e.test_sharing import DEV_SCRIPT, _running

VICTIM_NS = "gs-victim"
ATTACKER_NS = "gs-attacker"


def _waiting(e: Env, name: str, namespace: str) -> dict[str, Any]:
    pod = e.cluster.pod(name, namespace) or {}
    for st in (pod.get("status") or {}).get("containerStatuses") or ():
        waiting = (st.get("state") or {}).get("waiting")
        if waiting and waiting.get("reason") == "CreateContainerError":
            return dict(waiting)
    return {}


@pytest.fixture
def victim(e2e: Env) -> dict[str, Any]:
    """Two sharers in their own namespace on one shadow, and the picture we expect to stay unchanged."""
    for ns in (VICTIM_NS, ATTACKER_NS):
        e2e.cluster.kubectl("create", "namespace", ns, check=False)
    names = ["victim-0", "victim-1"]
    e2e.start_pods([sharer(n, namespace=VICTIM_NS) for n in names])
    e2e.wait("users recorded", lambda: sum(len(s["users"]) for s in e2e.agent.status()["shadows"]) == 2, 20)
    (shadow,) = e2e.agent.status()["shadows"]
    return {"shadow": shadow, "names": names, "uids": _uids(e2e, VICTIM_NS)}


def _uids(e: Env, ns: str) -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in e.pods(ns)}


def _victim_unchanged(e: Env, victim: dict[str, Any]) -> None:
    assert _uids(e, VICTIM_NS) == victim["uids"]
    assert _running(e, victim["names"], VICTIM_NS)
    status = e.agent.status()
    # The victims' slots are untouched (an attacker that is itself a sharer holds a slot of its own).
    users = [[u for u in s["users"] if u.startswith(VICTIM_NS + "/")] for s in status["shadows"]]
    assert users == [victim["shadow"]["users"]], status["shadows"]
    assert not [ev for ev in status["evictions"] if ev["pod"].startswith(VICTIM_NS + "/")], status["evictions"]


def _victim_ids(victim: dict[str, Any]) -> list[str]:
    # users: ["gs-victim/victim-0/app", ...]; the IDs are the shadow's first slots: read them from the record.
    ns, name = victim["shadow"]["pod"].split("/")
    return [f"{ns}/{name}-{i}" for i in range(2)]


def test_refused_when_naming_another_namespaces_container(e2e: Env, victim: dict[str, Any]) -> None:
    key = keys.POD_ANNOTATION_DEVICES_FROM_PREFIX + "app"
    e2e.apply(pod_manifest("thief-ns", namespace=ATTACKER_NS, annotations={key: f"{VICTIM_NS}/victim-0/app"}))
    e2e.wait("CreateContainerError", lambda: bool(_waiting(e2e, "thief-ns", ATTACKER_NS)), 40)
    message = _waiting(e2e, "thief-ns", ATTACKER_NS)["message"]
    assert "gpushare:" in message and "not a container of this pod" in message, message
    _victim_unchanged(e2e, victim)


def test_refused_when_naming_a_shadow_from_a_pod_annotation(e2e: Env, victim: dict[str, Any]) -> None:
    key = keys.POD_ANNOTATION_DEVICES_FROM_PREFIX + "app"
    e2e.apply(pod_manifest("thief-shadow", namespace=ATTACKER_NS, annotations={key: f"{victim['shadow']['pod']}/main"}))
    e2e.wait("CreateContainerError", lambda: bool(_waiting(e2e, "thief-shadow", ATTACKER_NS)), 40)
    message = _waiting(e2e, "thief-shadow", ATTACKER_NS)["message"]
    assert "gpushare:" in message and "not a container of this pod" in message, message
    _victim_unchanged(e2e, victim)


def test_a_sharer_that_sets_devices_from_itself_is_refused(e2e: Env, victim: dict[str, Any]) -> None:
    """A real sharer (so its container does get our annotation) also sets the key on the pod, naming the
    victims' slots: refused, since a pod annotation may be what reached the container."""
    ns, name = victim["shadow"]["pod"].split("/")
    stolen = codecs.encode_devices_from(ns, name, _victim_ids(victim))
    e2e.apply(sharer("thief-mirror", namespace=ATTACKER_NS, annotations={keys.ANNOTATION_DEVICES_FROM: stolen}))
    e2e.wait("CreateContainerError", lambda: bool(_waiting(e2e, "thief-mirror", ATTACKER_NS)), 40)
    message = _waiting(e2e, "thief-mirror", ATTACKER_NS)["message"]
    assert "gpushare:" in message and "also a pod annotation" in message, message
    _victim_unchanged(e2e, victim)


@pytest.mark.parametrize(
    "key, value",
    [
        (keys.ANNOTATION_DEVICES_FROM, "from-shadow"),
        (keys.ANNOTATION_DEVICES_IDS, codecs.encode_devices_ids({"example.com/gpu": ["fakegpu0", "fakegpu1"]})),
    ],
)
def test_a_plain_pod_setting_the_container_keys_gets_nothing(
    e2e: Env, victim: dict[str, Any], key: str, value: str
) -> None:
    """Without a device-plugin allocation the keys are inert: the pod runs, with no GPU at all."""
    if value == "from-shadow":
        ns, name = victim["shadow"]["pod"].split("/")
        value = codecs.encode_devices_from(ns, name, _victim_ids(victim))
    pod = "thief-plain-" + ("from" if key == keys.ANNOTATION_DEVICES_FROM else "ids")
    e2e.apply(pod_manifest(pod, namespace=ATTACKER_NS, annotations={key: value}))
    e2e.wait(f"{pod} Running", lambda: _running(e2e, [pod], ATTACKER_NS), 40)
    devs, visible = e2e.exec(pod, "app", DEV_SCRIPT, namespace=ATTACKER_NS).split("\n")[:2]
    assert devs.strip() == "" and visible == "none", (devs, visible, json.dumps(value))
    _victim_unchanged(e2e, victim)
