"""The rules more than one part evaluates (gpushare/rules.py): one table each, and each caller agrees."""

from __future__ import annotations

import pytest

from controller.core.model import is_shadow, refusal_of
from controller.core.pod_facts import parse_pod
from deviceplugins.errors import InvalidShadow
from deviceplugins.policies import ShadowSlots, check_shadows
from gpushare import keys, rules
from gpushare.config import load_config
from gpushare.errors import ConfigError
from gpushare.rules import ReturnSignal
from tests.unit.controller.podmaker import pod

SHADOW_LABELS = {keys.LABEL_ROLE: keys.ROLE_SHADOW}


@pytest.mark.parametrize(
    ("namespace", "labels", "expected"),
    [
        (keys.DEFAULT_NAMESPACE, SHADOW_LABELS, True),
        # The label alone is what any tenant can write on its own pod.
        ("tenant", SHADOW_LABELS, False),
        (keys.DEFAULT_NAMESPACE, {}, False),
        (keys.DEFAULT_NAMESPACE, {keys.LABEL_ROLE: "Shadow"}, False),
        (keys.DEFAULT_NAMESPACE, {"example.com/role": keys.ROLE_SHADOW}, False),
    ],
)
def test_a_shadow_is_labelled_one_in_the_shadows_namespace(
    namespace: str, labels: dict[str, str], expected: bool
) -> None:
    assert rules.is_shadow(namespace, labels) is expected


def test_the_selectors_name_shadows_pending_pods_and_a_nodes_pods() -> None:
    assert f"{keys.LABEL_ROLE}={keys.ROLE_SHADOW}" == rules.SHADOW_SELECTOR
    assert rules.PENDING_UNBOUND_SELECTOR == "spec.nodeName=,status.phase=Pending"
    assert rules.on_node_selector("gpu-1") == "spec.nodeName=gpu-1"


@pytest.mark.parametrize(("n", "expected"), [(1, False), (2, True), (4, True), (64, True), (65, False), (0, False)])
def test_share_specs_run_from_2_to_64(n: int, expected: bool) -> None:
    assert rules.is_share_spec(n) is expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("default", True),
        ("a", True),
        ("a" * 63, True),
        ("a" * 64, False),
        ("a-b-0", True),
        ("-a", False),
        ("a-", False),
        ("A", False),
        ("a.b", False),
        ("", False),
        ("a\n", False),
    ],
)
def test_a_dns_label_is_lower_case_rfc_1123_of_at_most_63(value: str, expected: bool) -> None:
    assert rules.is_dns_label(value) is expected


@pytest.mark.parametrize(
    ("name", "ours", "device", "vendor"),
    [
        ("gpushare/share-gpu-4", True, True, False),
        ("gpushare/spot-gpu", True, True, False),
        ("nvidia.com/gpu", False, True, True),
        ("amd.com/gpu", False, True, True),
        ("cpu", False, False, False),
        ("hugepages-2Mi", False, False, False),
        ("kubernetes.io/batch", False, False, False),
        ("example.kubernetes.io/x", False, False, False),
    ],
)
def test_resources_are_ours_a_vendors_or_no_device(name: str, ours: bool, device: bool, vendor: bool) -> None:
    assert rules.is_gpushare_resource(name) is ours
    assert rules.is_device_resource(name) is device
    assert rules.is_vendor_resource(name) is vendor


@pytest.mark.parametrize(
    ("healthy", "lent_here", "reclaimed", "expected"),
    [
        (True, False, False, True),  # the owner is away: a newcomer may borrow
        (False, True, False, True),  # a borrower's container restarting while closed to newcomers
        (False, False, False, False),
        (True, True, True, False),  # reclaimed is final, whatever the device says since
        (True, False, True, False),
    ],
)
def test_a_borrower_may_have_a_gpu_only_while_its_lend_is_active(
    healthy: bool, lent_here: bool, reclaimed: bool, expected: bool
) -> None:
    assert rules.may_borrow(device_healthy=healthy, lent_to_this_pod=lent_here, reclaimed=reclaimed) is expected


@pytest.mark.parametrize(
    ("kmod", "users", "expected"),
    [
        (True, True, ReturnSignal.KERNEL_MODULE),
        (True, False, ReturnSignal.KERNEL_MODULE),
        (False, True, ReturnSignal.UTILIZATION),
        (False, False, ReturnSignal.NONE),
    ],
)
def test_a_return_is_seen_by_the_module_or_by_metrics_naming_users(
    kmod: bool, users: bool, expected: ReturnSignal
) -> None:
    assert rules.return_signal(kmod_watches=kmod, metrics_name_users=users) is expected


# Each caller asks the rule: a change to it reaches all of them.


def test_the_config_and_the_share_plugins_refuse_the_same_specs() -> None:
    for n in (1, 65):
        with pytest.raises(ConfigError, match="between 2 and 64"):
            load_config(text=f"version: v1\nshareSpecs: [{n}]\n")
        with pytest.raises(InvalidShadow, match=r"outside 2\.\.64"):
            check_shadows([ShadowSlots(keys.DEFAULT_NAMESPACE, "s", n)], None)
    load_config(text="version: v1\nshareSpecs: [2, 64]\n")
    check_shadows([ShadowSlots(keys.DEFAULT_NAMESPACE, "s", 64)], None)


def test_the_agents_model_trusts_the_pods_the_rule_does() -> None:
    # The NRI plugin's side: tests/unit/nri_plugin/test_decide.py, the impostor in a tenant namespace.
    impostor = parse_pod(pod("fake-shadow", "tenant", labels=SHADOW_LABELS))
    real = parse_pod(pod("shadow-a", keys.DEFAULT_NAMESPACE, labels=SHADOW_LABELS))
    assert not is_shadow(impostor)
    assert is_shadow(real)


# -- the mixes of GPU requests (docs/security.md's table; the admission tier checks the policy's words) ----------

SPOT = keys.RESOURCE_SPOT_GPU
SHARE2 = keys.share_resource(keys.KIND_SHARE, 2)
SHARE4 = keys.share_resource(keys.KIND_SHARE, 4)
DEV4 = keys.share_resource(keys.KIND_SHARE_DEV, 4)
GPU = "nvidia.com/gpu"
DIND = keys.POD_ANNOTATION_DEVICES_FROM_PREFIX


@pytest.mark.parametrize(
    ("containers", "annotations", "refusal"),
    [
        ([("app", [SPOT, SHARE4])], {}, f"asks for {SPOT} and {SHARE4}; a borrower is killed whole"),
        ([("train", [SPOT]), ("serve", [SHARE4])], {}, f"asks for {SPOT} and {SHARE4};"),
        ([("a", [SHARE2]), ("b", [SHARE4])], {}, f"asks for {SHARE2} and {SHARE4}; all the slots of a pod"),
        ([("app", [SHARE4, DEV4])], {}, f"asks for {SHARE4} and {DEV4}; all the slots"),
        ([("serve", [SHARE4]), ("train", [GPU])], {}, f"asks for {SHARE4} and {GPU}; a sharer is evicted whole"),
        ([("app", [SPOT]), ("keep", [GPU])], {}, f"asks for {SPOT} and {GPU}; a borrower is killed whole"),
        (
            [("main", [SHARE4]), ("dind", [SHARE4])],
            {DIND + "dind": "main"},
            f'container "dind" is named by the annotation {DIND}dind and also asks for a GPU resource',
        ),
        ([("main", [GPU]), ("dind", [GPU])], {DIND + "dind": "main"}, 'remove the resource from "dind"'),
        # A resource of another vendor, not in realResources, is not gpushare's to judge.
        ([("main", [GPU]), ("dind", ["amd.com/gpu"])], {DIND + "dind": "main"}, None),
        ([("a", [SHARE4]), ("b", [SHARE4])], {}, None),
        ([("a", [SPOT]), ("b", [SPOT])], {}, None),
        ([("main", [SHARE4]), ("dind", [])], {DIND + "dind": "main"}, None),
        ([("main", [SPOT]), ("dind", [])], {DIND + "dind": "_/_/main"}, None),
        ([("main", [GPU]), ("dind", [])], {DIND + "dind": "main"}, None),
        ([("app", [GPU, "example.com/nic"])], {}, None),
    ],
)
def test_refused_mix_has_one_outcome_per_row(
    containers: list[tuple[str, list[str]]], annotations: dict[str, str], refusal: str | None
) -> None:
    got = rules.refused_mix("tenant/job", containers, annotations, [GPU])
    if refusal is None:
        assert got is None
    else:
        assert got is not None and got.startswith("gpushare: pod tenant/job") and refusal in got, got


def test_refused_mix_checks_the_rules_in_the_policys_order() -> None:
    # A pod that breaks two rules gets the first one's words, as the policy gives them.
    got = rules.refused_mix("t/p", [("a", [SPOT, SHARE2]), ("b", [SHARE4, GPU])], {}, [GPU])
    assert got is not None and f"asks for {SPOT} and {SHARE2};" in got


def test_the_agent_reads_every_container_and_init_container_into_the_rule() -> None:
    raw = pod("job", "tenant", requests={SHARE4: 1})
    raw["spec"]["init_containers"] = [
        {"name": "warmup", "image": "busybox", "resources": {"limits": {SPOT: "1"}}},
    ]

    got = refusal_of(parse_pod(raw), [GPU])
    assert got is not None and f"asks for {SPOT} and {SHARE4}" in got
    assert refusal_of(parse_pod(pod("ok", "tenant", requests={SHARE4: 1})), [GPU]) is None


def test_an_init_container_asking_for_a_gpushare_resource_is_refused_a_sidecar_is_not() -> None:
    containers = [("app", [SHARE4]), ("warmup", [SHARE4])]
    got = rules.refused_mix("t/p", containers, {}, [GPU], init_containers=["warmup"])
    assert got is not None and 'init container "warmup" asks for gpushare/share-gpu-4' in got
    assert "restartPolicy: Always" in got
    assert rules.refused_mix("t/p", containers, {}, [GPU]) is None  # "warmup" a sidecar
    # The vendor's own GPU in an init container is the vendor's business.
    assert rules.refused_mix("t/p", [("app", []), ("warmup", [GPU])], {}, [GPU], init_containers=["warmup"]) is None
    spot = rules.refused_mix("t/p", [("app", []), ("warmup", [SPOT])], {}, [GPU], init_containers=["warmup"])
    assert spot is not None and f"asks for {SPOT}" in spot
