"""The admission policies (manifests/50-admission.yaml) agree with the contract in gpushare/keys.py
and with the rest of the chart. What they refuse is tested in the real API server, in
tests/integration/admission/; here, offline, that every key of the contract has an owner, the
policy reserves exactly the agent's, and the shadow it allows is the one the agent makes."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.core.share_key import Pool, ShareKey
from controller.share.solver import build_shadow_manifest, shadow_name
from gpushare import keys
from gpushare.config import load_config
from localcluster.errors import ClusterUnavailable
from localcluster.helm import helm_binary

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "manifests"
CHART = MANIFESTS / "chart"

# Who writes each key of the contract (docs/design.md §4.3, docs/security.md). A key added to
# gpushare/keys.py fails the test below until it is listed here, and, if only the agent writes
# it, in the policy's agentAnnotations.
AGENT_ANNOTATIONS = {
    "gpushare.k8s.io/shadow-users",
    "gpushare.k8s.io/shadow-owner",
    "gpushare.k8s.io/draining",
    "gpushare.k8s.io/drained",
}
SHADOW_LABELS = {"gpushare.k8s.io/role", "gpushare.k8s.io/share-kind", "gpushare.k8s.io/share-spec"}
PLUGINS_ONLY = "a container annotation from our device plugins; as a pod annotation the NRI plugin refuses it"
NOT_THE_AGENTS = {
    "gpushare.k8s.io/pool-resource": "the tenant's request for a pool",
    "gpushare.k8s.io/lendable": "the tenant's consent to lend",
    "gpushare.k8s.io/container-devices-from.": "the tenant's Docker-in-Docker source, inside its own pod",
    "gpushare.k8s.io/container-devices-from": PLUGINS_ONLY,
    "gpushare.k8s.io/container-devices-ids": PLUGINS_ONLY,
    "gpushare.k8s.io/owner-active": "a taint on the DRA driver's own spot devices, not a pod key",
    "gpushare.k8s.io/reclaimed": "a taint on the DRA driver's own spot devices, not a pod key",
    "gpushare.k8s.io/uninstall": "on the installation's namespace, the operator's; read by the uninstall hook",
}


def _docs() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((MANIFESTS / "50-admission.yaml").read_text()) if d]


def _named(kind: str, name: str, docs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    (doc,) = [d for d in (docs or _docs()) if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def _variable(policy: dict[str, Any], name: str) -> str:
    (expr,) = [v["expression"] for v in policy["spec"]["variables"] if v["name"] == name]
    return str(expr)


def _strings(cel_list: str) -> set[str]:
    return set(re.findall(r"'([^']*)'", cel_list))


def test_every_key_of_the_contract_has_an_owner() -> None:
    ours = keys.DOMAIN + "/"
    contract = {v for k, v in vars(keys).items() if k.isupper() and isinstance(v, str) and v.startswith(ours)}
    unowned = contract - AGENT_ANNOTATIONS - SHADOW_LABELS - set(NOT_THE_AGENTS)
    assert not unowned, f"gpushare/keys.py has keys no one here owns: {sorted(unowned)}; list them in this test"


def test_the_policy_reserves_exactly_the_agents_keys() -> None:
    policy = _named("ValidatingAdmissionPolicy", "gpushare-pods")
    assert _strings(_variable(policy, "agentAnnotations")) == AGENT_ANNOTATIONS
    assert _strings(_variable(policy, "shadowLabels")) == SHADOW_LABELS
    assert {keys.ANNOTATION_SHADOW_USERS, keys.ANNOTATION_SHADOW_OWNER} <= AGENT_ANNOTATIONS
    assert {keys.LABEL_ROLE, keys.LABEL_SHARE_KIND, keys.LABEL_SHARE_SPEC} == SHADOW_LABELS
    dind = _variable(policy, "dindTargets")
    assert f"substring({len(keys.POD_ANNOTATION_DEVICES_FROM_PREFIX)})" in dind
    assert keys.POD_ANNOTATION_DEVICES_FROM_PREFIX in _variable(policy, "dindKeys")
    asked = _variable(policy, "shares") + _variable(policy, "asksSpot")
    for prefix in (keys.RESOURCE_SHARE_GPU_PREFIX, keys.RESOURCE_SHARE_DEV_GPU_PREFIX, keys.RESOURCE_SPOT_GPU):
        assert f"'{prefix}" in asked, prefix


def test_the_policies_name_the_agents_service_account_and_config() -> None:
    rbac = list(yaml.safe_load_all((MANIFESTS / "20-rbac.yaml").read_text()))
    (sa,) = [d for d in rbac if d and d["kind"] == "ServiceAccount"]
    user = f"system:serviceaccount:{sa['metadata']['namespace']}:{sa['metadata']['name']}"
    assert sa["metadata"]["namespace"] == keys.DEFAULT_NAMESPACE
    pods = _named("ValidatingAdmissionPolicy", "gpushare-pods")
    node = _named("ValidatingAdmissionPolicy", "gpushare-agent-node")
    assert _variable(pods, "isAgent") == f"request.userInfo.username == '{user}'"
    assert node["spec"]["matchConditions"] == [
        {"name": "is-the-agent", "expression": f"request.userInfo.username == '{user}'"}
    ]
    config = yaml.safe_load((MANIFESTS / "30-config.yaml").read_text())["data"]["config.yaml"]
    assert yaml.safe_load(_variable(pods, "realResources")) == yaml.safe_load(config)["realResources"]
    for policy in (pods, node):
        assert policy["spec"]["failurePolicy"] == "Fail"
        binding = _named("ValidatingAdmissionPolicyBinding", policy["metadata"]["name"])
        assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}


def _helm_template(*sets: str, only: str | None = "templates/50-admission.yaml") -> subprocess.CompletedProcess[str]:
    try:
        helm = helm_binary()
    except ClusterUnavailable as exc:
        pytest.fail(f"{exc}; the chart's switches cannot be checked without it")
    args = [str(helm), "template", "gpushare", str(CHART), *(("--show-only", only) if only else ())]
    for s in sets:
        args += ["--set", s]
    return subprocess.run(args, capture_output=True, text=True, check=False, timeout=120)


def test_the_admission_switches() -> None:
    off = _helm_template("admission.enabled=false")
    assert off.returncode != 0 and "could not find template" in off.stderr, off.stderr
    warn = _helm_template("admission.validationActions={Warn,Audit}", "config.realResources={amd.com/gpu}")
    assert warn.returncode == 0, warn.stderr
    docs = [d for d in yaml.safe_load_all(warn.stdout) if d]
    for name in ("gpushare-pods", "gpushare-agent-node"):
        assert _named("ValidatingAdmissionPolicyBinding", name, docs)["spec"]["validationActions"] == ["Warn", "Audit"]
    pods = _named("ValidatingAdmissionPolicy", "gpushare-pods", docs)
    assert yaml.safe_load(_variable(pods, "realResources")) == ["amd.com/gpu"]
    bad = _helm_template("admission.validationActions={Refuse}")
    assert bad.returncode != 0 and "/admission/validationActions/0" in bad.stderr, bad.stderr  # values.schema.json


ENV_CAP = "admission.maxPodEnvBytes"


def _env_cap_rule(policy: dict[str, Any]) -> dict[str, Any] | None:
    found = [v for v in policy["spec"]["validations"] if ENV_CAP in v.get("messageExpression", "")]
    assert len(found) <= 1, found
    return found[0] if found else None


def test_the_env_cap_is_the_values_default_and_follows_the_value() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    pods = _named("ValidatingAdmissionPolicy", "gpushare-pods")
    rule = _env_cap_rule(pods)
    assert rule is not None
    assert rule["expression"].endswith(f"variables.envBytes <= {values['admission']['maxPodEnvBytes']}"), rule
    # The same count for every kind of container: a sum that left one out would let it through.
    count = _variable(pods, "envBytes")
    assert count.startswith("(variables.containers + object.spec.?ephemeralContainers.orValue([])).map(c, "), count
    assert "initContainers" in _variable(pods, "containers")

    lowered = _helm_template(f"{ENV_CAP}=1000")
    assert lowered.returncode == 0, lowered.stderr
    rule = _env_cap_rule(_named("ValidatingAdmissionPolicy", "gpushare-pods", list(yaml.safe_load_all(lowered.stdout))))
    assert rule is not None and rule["expression"].endswith("variables.envBytes <= 1000"), rule
    assert "over the 1000 this cluster allows" in rule["messageExpression"], rule

    off = _helm_template(f"{ENV_CAP}=0")
    assert off.returncode == 0, off.stderr
    pods = _named("ValidatingAdmissionPolicy", "gpushare-pods", list(yaml.safe_load_all(off.stdout)))
    assert _env_cap_rule(pods) is None
    assert "envBytes" not in {v["name"] for v in pods["spec"]["variables"]}


@pytest.mark.parametrize("value", ["-1", "1.5", '"262144"', "true", "null", "16777217", "1e300"])
def test_a_bad_env_cap_fails_the_render_naming_the_value(value: str) -> None:
    try:
        helm = helm_binary()
    except ClusterUnavailable as exc:
        pytest.fail(f"{exc}; the chart's values cannot be checked without it")
    # JSON, so that each arrives as the type it spells, not as what --set makes of it.
    args = [str(helm), "template", "gpushare", str(CHART), "--show-only", "templates/50-admission.yaml"]
    proc = subprocess.run(
        [*args, "--set-json", f"{ENV_CAP}={value}"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert proc.returncode != 0, proc.stdout
    # values.schema.json refuses it naming the value's path; the template's own check stays for
    # `helm template --skip-schema-validation`.
    named = ("/admission/maxPodEnvBytes", f"{ENV_CAP} must be a whole number of bytes, 0 or more and at most 16777216")
    assert any(n in proc.stderr for n in named), proc.stderr


def _cel_value(expr: str) -> Any:
    """A literal the chart writes into a policy: JSON, or a CEL map with single-quoted keys."""
    return json.loads(expr.replace("'", '"'))


@pytest.mark.parametrize(
    "sets",
    [
        pytest.param((), id="defaults"),
        pytest.param(
            (
                "config.shadowImage=registry.example/hold:1",
                "priorityClasses.shadow.name=hold-gpus",
                "priorityClasses.shadow.preemption=true",
                "config.realResources={amd.com/gpu,nvidia.com/gpu}",
                "config.shareSpecs={3,7}",
                "config.devShareSpecs={6}",
            ),
            id="every value changed",
        ),
    ],
)
def test_the_shadow_shape_is_what_build_shadow_manifest_makes(sets: tuple[str, ...]) -> None:
    """Offline, the half of the agreement a unit test can check: the shadow build_shadow_manifest
    makes from the config this chart renders uses only what gpushare-agent-node allows, with the
    same values. The live half (the API server admits that very manifest from the agent, defaults
    and all) is tests/integration/admission/test_shadow_shape.py."""
    proc = _helm_template(*sets, only=None)
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "gpushare-config"]
    cfg = load_config(text=cm["data"]["config.yaml"])
    policy = _named("ValidatingAdmissionPolicy", "gpushare-agent-node", docs)

    assert _cel_value(_variable(policy, "shadowImage")) == cfg.shadow_image
    assert _cel_value(_variable(policy, "shadowPriorityClass")) == cfg.shadow_priority_class
    assert _cel_value(_variable(policy, "realResources")) == list(cfg.real_resources)
    specs = {keys.KIND_SHARE: list(cfg.share_specs), keys.KIND_SHARE_DEV: list(cfg.dev_share_specs)}
    assert _cel_value(_variable(policy, "shareSpecs")) == specs
    assert _strings(_variable(policy, "shadowLabels")) == SHADOW_LABELS
    assert _strings(_variable(policy, "shadowRecords")) == AGENT_ANNOTATIONS - {keys.ANNOTATION_SHADOW_OWNER}
    spec_fields = _strings(_variable(policy, "shadowSpecFields"))
    container_fields = _strings(_variable(policy, "shadowContainerFields"))
    container_rules = _variable(policy, "containerFaults")
    (security,) = re.findall(r"== (\{[^}]*\})", container_rules)

    for kind, served in specs.items():
        for resource in cfg.real_resources:
            key = ShareKey(Pool(resource, (("zone", "a"),)), kind, served[0])
            shadow = build_shadow_manifest(key, shadow_name(key, 0), cfg)
            spec = shadow["spec"]
            assert set(spec) <= spec_fields, set(spec) - spec_fields
            assert spec["priorityClassName"] == cfg.shadow_priority_class
            assert spec["preemptionPolicy"] == _cel_value(_variable(policy, "shadowPreemption"))
            assert spec["automountServiceAccountToken"] is False and "serviceAccountName" not in spec
            assert [t["key"] for t in spec["tolerations"]] == [resource]
            (main,) = spec["containers"]
            assert set(main) <= container_fields, set(main) - container_fields
            assert (
                main["name"] == keys.SHADOW_CONTAINER and f"variables.main.name == '{main['name']}'" in container_rules
            )
            assert main["image"] == cfg.shadow_image
            assert main["securityContext"] == _cel_value(re.sub(r"\s+", " ", security))
            assert main["resources"] == {"requests": {resource: "1"}, "limits": {resource: "1"}}
            labels = shadow["metadata"]["labels"]
            assert set(labels) == SHADOW_LABELS and labels[keys.LABEL_ROLE] == keys.ROLE_SHADOW
            assert int(labels[keys.LABEL_SHARE_SPEC]) in specs[labels[keys.LABEL_SHARE_KIND]]
            assert not shadow["metadata"].get("annotations")
