"""controller.io's API modules against a real kube-apiserver: pods, watches, events, the Lease, error translation."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from controller.core.model import Pool, ShareKey, build_snapshot
from controller.core.pod_facts import PodRef
from controller.errors import ApiUnavailable, KubeError
from controller.io.kube_client import KubeClient
from controller.io.lease import LeaseElector
from controller.io.pod_cache import PodCache
from controller.share.solver import build_shadow_manifest, shadow_name
from gpushare import keys
from gpushare.config import Config
from tests.integration.kube.conftest import ApiServer

CFG = Config(node_name="n1", shadow_image="gpushare.local/pause:latest")
KEY = ShareKey(Pool("nvidia.com/gpu"), keys.KIND_SHARE, 4)


def wait_for(what: str, predicate: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def ref_of(pod: dict[str, Any]) -> PodRef:
    m = pod["metadata"]
    return PodRef(m["namespace"], m["name"], m["uid"])


def tenant_pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "tenant"},
        "spec": {"containers": [{"name": "app", "image": "busybox"}]},
    }


def test_shadow_manifest_is_accepted_and_reads_back_as_the_same_shadow(client: KubeClient) -> None:
    name = shadow_name(KEY, 0)
    manifest = build_shadow_manifest(KEY, name, CFG)
    stored = client.create_pod(manifest)
    assert stored is not None and stored["metadata"]["name"] == name and stored["metadata"]["uid"]
    assert client.create_pod(manifest) is None  # a repeated create meets AlreadyExists, not an error
    pods, rv = client.list_pods(
        namespace=keys.DEFAULT_NAMESPACE, label_selector=f"{keys.LABEL_ROLE}={keys.ROLE_SHADOW}"
    )
    assert rv and [p["metadata"]["name"] for p in pods] == [name]
    snap = build_snapshot(pods, CFG)  # the model reads the API's camelCase JSON as is
    assert snap.problems == () and snap.shadows[0].key == KEY
    assert pods[0]["spec"]["priorityClassName"] == CFG.shadow_priority_class


def test_delete_is_uid_checked(client: KubeClient) -> None:
    client.create_pod(tenant_pod("victim"))
    (pod,), _ = client.list_pods(namespace="tenant", field_selector="metadata.name=victim")
    ref = ref_of(pod)
    assert client.delete_pod(PodRef(ref.namespace, ref.name, "not-its-uid")) is False  # a namesake survives
    assert client.delete_pod(ref, grace_period_s=0) is True
    assert client.delete_pod(ref) is False  # already gone


def test_annotations_are_merged_and_removed(client: KubeClient) -> None:
    client.create_pod(tenant_pod("noted"))
    (pod,), _ = client.list_pods(namespace="tenant", field_selector="metadata.name=noted")
    ref = ref_of(pod)
    assert client.patch_pod_annotations(ref, {keys.ANNOTATION_SHADOW_OWNER: '{"gpushare-system/s":"u"}', "x": "1"})
    assert client.patch_pod_annotations(ref, {"x": None})
    (pod,), _ = client.list_pods(namespace="tenant", field_selector="metadata.name=noted")
    assert pod["metadata"]["annotations"] == {keys.ANNOTATION_SHADOW_OWNER: '{"gpushare-system/s":"u"}'}
    assert client.patch_pod_annotations(PodRef("tenant", "noted", "other-uid"), {"y": "2"}) is False


def test_events_are_recorded_on_the_pod(client: KubeClient) -> None:
    client.create_pod(tenant_pod("evicted"))
    (pod,), _ = client.list_pods(namespace="tenant", field_selector="metadata.name=evicted")
    ref = ref_of(pod)
    client.record_event(ref, "ShadowGone", "gpushare: shadow gone", type_="Warning", host="n1")
    (event,) = client.list_events("tenant", involved_uid=ref.uid)
    assert (event["reason"], event["type"], event["message"]) == ("ShadowGone", "Warning", "gpushare: shadow gone")
    assert event["source"]["component"] == "gpushare"


@pytest.fixture
def cache(client: KubeClient) -> Iterator[PodCache]:
    stop = threading.Event()
    changed = threading.Event()
    cache = PodCache(client, namespace="tenant", resync_s=300, on_change=changed.set)
    thread = threading.Thread(target=cache.run, args=(stop,), name="gpushare-controller-watch-test")
    client.watch_timeout_s = 2  # short watches, so stopping takes at most ~2 s
    thread.start()
    try:
        wait_for("the first LIST", lambda: cache.view().is_synced)
        yield cache
    finally:
        stop.set()
        thread.join(timeout=20)
        assert not thread.is_alive()


def test_watch_cache_sees_creates_and_remembers_deletes(client: KubeClient, cache: PodCache) -> None:
    client.create_pod(tenant_pod("watched"))
    wait_for("ADDED", lambda: any(p["metadata"]["name"] == "watched" for p in cache.view().pods))
    (pod,), _ = client.list_pods(namespace="tenant", field_selector="metadata.name=watched")
    client.delete_pod(ref_of(pod), grace_period_s=0)
    wait_for("DELETED", lambda: ref_of(pod) in cache.view().deleted)
    view = cache.view()
    assert not view.is_fresh and all(p["metadata"]["name"] != "watched" for p in view.pods)


def test_watch_ends_by_itself_after_timeout_seconds(client: KubeClient) -> None:
    _, rv = client.list_pods(namespace="tenant")
    started = time.monotonic()
    events = list(client.watch_pods(rv, namespace="tenant", timeout_s=1))
    took = time.monotonic() - started
    assert all(e.type == "BOOKMARK" for e in events)
    assert took >= 0.9, f"the watch ended after {took:.2f} s, before the 1 s the server was asked for"


def test_lease_one_leader_release_hands_over_and_expiry_takes_over(client: KubeClient) -> None:
    now = [1000.0]

    def elector(holder: str) -> LeaseElector:
        return LeaseElector(client, holder, name=f"test-lease-{id(now)}", duration_s=5, clock=lambda: now[0])

    a, b = elector("agent-a"), elector("agent-b")
    assert a.try_acquire_or_renew() and a.is_leader()
    assert not b.try_acquire_or_renew() and not b.is_leader()
    now[0] += 2
    assert a.try_acquire_or_renew()  # renew
    assert not b.try_acquire_or_renew()  # the record changed: b's clock starts again
    a.release()
    assert not a.is_leader()
    assert b.try_acquire_or_renew() and b.is_leader()  # released: taken at once
    # b stops renewing (killed): a takes over only after the lease is unchanged for its duration.
    assert not a.try_acquire_or_renew()
    now[0] += 4.9
    assert not a.try_acquire_or_renew()
    assert not b.is_leader()  # b's own view expired first (0.8 x duration): no two leaders
    now[0] += 0.2
    assert a.try_acquire_or_renew() and a.is_leader()
    lease = client.get_lease(keys.DEFAULT_NAMESPACE, a.name)
    assert lease is not None and lease["spec"]["holderIdentity"] == "agent-a"
    assert lease["spec"]["leaseTransitions"] == 2


def test_refusals_and_unreachable_servers_become_our_errors(client: KubeClient, apiserver: ApiServer) -> None:
    bad = tenant_pod("Bad_Name")
    with pytest.raises(KubeError, match=r"was refused with 422: .*Bad_Name"):
        client.create_pod(bad)
    scheduler = KubeClient.from_kubeconfig(str(apiserver.kubeconfig_for("scheduler")))
    with scheduler, pytest.raises(KubeError, match=r"refused with 403: .*cannot create.*manifests/20-rbac.yaml"):
        scheduler.create_pod(tenant_pod("not-allowed"))
    with KubeClient.from_kubeconfig(str(apiserver.kubeconfig), timeout_s=1.0) as gone:
        gone._api.configuration.host = "https://127.0.0.1:9"  # nothing listens on the discard port
        gone.host = gone._api.configuration.host
        with pytest.raises(ApiUnavailable, match=r"did not answer GET /api/v1/pods"):
            gone.list_pods()
