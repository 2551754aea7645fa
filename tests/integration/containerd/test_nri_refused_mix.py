"""A pod whose mix of GPU requests gpushare refuses gets none of its containers from real containerd.

The plugin runs in-process, as in the agent, with ``CachedPodRules`` over a stand-in for the agent's
watch of its node (the pods as the API server would return them). Through containerd 1.7.24 and
2.x, CreateContainer of each container of such a pod fails with the rule in the admission policy's
words, which is what kubelet puts into the pod's Events; a pod that asks for one kind of GPU is
created as before, and a container of a pod the watch has not seen yet is refused only where
gpushare has an instruction for it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from controller.io.pod_rules import CachedPodRules
from gpushare import keys, rules
from gpushare.config import load_config
from localcluster.containerd import Containerd
from localcluster.cri import CriClient, CriError
from nri_plugin import Injector
from tests.harness.devices import FakeDevice
from tests.integration.containerd.common import connected_stub, run_source, same_pod_annotation

SHARE2 = keys.share_resource(keys.KIND_SHARE, 2)
SHARE4 = keys.share_resource(keys.KIND_SHARE, 4)
REAL = "example.com/gpu"


def api_pod(name: str, uid: str, containers: list[tuple[str, dict[str, str]]], **annotations: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "default", "uid": uid, "annotations": annotations},
        "spec": {
            "nodeName": "node-a",
            "containers": [{"name": c, "resources": {"limits": r}} for c, r in containers],
        },
        "status": {"phase": "Pending"},
    }


@pytest.fixture
def watched(containerd: Containerd) -> Iterator[dict[str, Any]]:
    """The in-process plugin with pod rules over ``watched`` (the agent's node cache, by "ns/name")."""
    pods: dict[str, Any] = {}
    injector = Injector(load_config(None), pod_rules=CachedPodRules(pods.get, [REAL]))
    with connected_stub(containerd, injector):
        yield pods


def test_every_container_of_a_refused_mix_fails_in_the_policys_words(
    cri: CriClient, watched: dict[str, Any], fake_gpu: FakeDevice
) -> None:
    spec = [("a", {SHARE2: "1"}), ("b", {SHARE4: "1"}), ("side", {})]
    watched["default/mix"] = api_pod("mix", "uid-mix", spec)
    why = rules.refused_mix("default/mix", [(c, list(r)) for c, r in spec], {}, [REAL])
    assert why is not None
    pod = cri.run_pod("mix", uid="uid-mix")
    for name in ("a", "b", "side"):
        with pytest.raises(CriError) as info:
            cri.create_container(pod, name)
        assert why in info.value.details and f"container '{name}' refused on the node" in info.value.details
    cri.remove_pod(pod.id)


def test_a_pod_of_one_kind_of_gpu_is_created_and_an_unseen_pod_only_loses_what_gpushare_gives(
    cri: CriClient, watched: dict[str, Any], fake_gpu: FakeDevice
) -> None:
    watched["default/fine"] = api_pod(
        "fine",
        "uid-fine",
        [("main", {REAL: "1"}), ("dind", {})],
        **{keys.POD_ANNOTATION_DEVICES_FROM_PREFIX + "dind": "main"},
    )
    pod = cri.run_pod("fine", uid="uid-fine", annotations=same_pod_annotation("dind", "main"))
    run_source(cri, pod, fake_gpu)
    cri.run_container(pod, "dind")
    cri.remove_pod(pod.id)

    # Not in the watch yet: a container with nothing from gpushare is created, a DinD target is not.
    unseen = cri.run_pod("unseen", uid="uid-unseen", annotations=same_pod_annotation("dind", "main"))
    run_source(cri, unseen, fake_gpu)
    with pytest.raises(CriError) as info:
        cri.create_container(unseen, "dind")
    assert "cannot check the GPU requests of default/unseen" in info.value.details, info.value.details
    cri.remove_pod(unseen.id)
