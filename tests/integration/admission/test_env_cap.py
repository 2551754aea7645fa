"""admission.maxPodEnvBytes in the real API server: the bytes of env names and literal values,
command and args over every container of a pod, init and ephemeral ones too.

containerd hands all of it, for every pod of the node, to an NRI plugin when the plugin connects;
past the size containerd can send, gpushare's plugin cannot connect at all
(tests/integration/containerd/test_nri_large_sync.py). The tier installs the chart's default cap;
the count each test expects is computed here, independently of the policy, and the pods are made
one byte over it and exactly at it.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Iterator
from typing import Any, Final

import pytest
import yaml

from localcluster.paths import REPO
from tests.integration.admission.conftest import OTHER_NODE, TENANT_NS, TEST_LABEL, Admission, Identity

# The tier installs the chart's default.
CAP: Final[int] = int(yaml.safe_load((REPO / "manifests/chart/values.yaml").read_text())["admission"]["maxPodEnvBytes"])
DENIED = "ValidatingAdmissionPolicy 'gpushare-pods' with binding 'gpushare-pods' denied request: gpushare: pod "
STRATEGIC = "application/strategic-merge-patch+json"
# How long the API server may take to act on a policy just written: admit by it, type-check it.
SETTLE_S = 60.0


def refusal(pod: str, carried: int) -> str:
    return (
        f"{DENIED}{pod} carries {carried} bytes of environment, command and arguments in its containers, over "
        f"the {CAP} this cluster allows (admission.maxPodEnvBytes); containerd hands the environment of "
        "every container to its NRI plugins when they connect, and a node whose total is too large cuts gpushare "
        "off: put large values in a mounted ConfigMap or Secret file"
    )


def carried(spec: dict[str, Any]) -> int:
    """The count the cap is about, in UTF-8 bytes: what containerd stores, not characters."""
    total = 0
    for c in (*spec["containers"], *spec.get("initContainers", ()), *spec.get("ephemeralContainers", ())):
        total += sum(len(e["name"].encode()) + len(e.get("value", "").encode()) for e in c.get("env", ()))
        total += sum(len(s.encode()) for s in (*c.get("command", ()), *c.get("args", ())))
    return total


def base(name: str, node: str = "") -> dict[str, Any]:
    """A pod with something to count in each place: an app and an init container, env, command and
    args, and an env var from a Secret, whose name counts and whose value the API never shows."""
    app = {
        "name": "app",
        "image": "busybox",
        "command": ["sh", "-c"],
        "args": ["sleep 3600"],
        "env": [{"name": "MODE", "value": "serve"}],
    }
    init = {
        "name": "setup",
        "image": "busybox",
        "command": ["true"],
        "args": ["--quiet"],
        "env": [
            {"name": "STEP", "value": "1"},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "absent", "key": "token", "optional": True}}},
        ],
    }
    spec: dict[str, Any] = {"containers": [app], "initContainers": [init], **({"nodeName": node} if node else {})}
    meta = {"name": name, "namespace": TENANT_NS, "labels": {TEST_LABEL: "1"}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def _env(n: int, char: str = "x") -> dict[str, str]:
    name = "FILL"
    left = n - len(name)
    wide = len(char.encode())
    return {"name": name, "value": char * (left // wide) + "x" * (left % wide)}


# Where the bytes that reach the count go: a refusal in each place shows that place is counted.
PLACES: dict[str, Callable[[dict[str, Any], int], None]] = {
    "an app container's env": lambda s, n: s["containers"][0]["env"].append(_env(n)),
    "an init container's env": lambda s, n: s["initContainers"][0]["env"].append(_env(n)),
    "an app container's command": lambda s, n: s["containers"][0]["command"].append("x" * n),
    "an init container's args": lambda s, n: s["initContainers"][0]["args"].append("x" * n),
    # Two bytes a character: a count of characters would see half of them and admit the pod.
    "multi-byte characters": lambda s, n: s["containers"][0]["env"].append(_env(n, "é")),
}


def filled(name: str, place: str, total: int, node: str = "") -> dict[str, Any]:
    manifest = base(name, node)
    PLACES[place](manifest["spec"], total - carried(manifest["spec"]))
    assert carried(manifest["spec"]) == total
    return manifest


@pytest.mark.parametrize("place", list(PLACES))
def test_one_byte_over_the_cap_is_refused_with_the_count(admission: Admission, place: str) -> None:
    error = admission.create(admission.tenant, filled("env-over", place, CAP + 1))
    assert f'"env-over" is invalid: : {refusal(f"{TENANT_NS}/env-over", CAP + 1)}' in error, error


@pytest.mark.parametrize("place", list(PLACES))
def test_a_pod_at_the_cap_is_admitted(admission: Admission, place: str) -> None:
    assert admission.create(admission.tenant, filled("env-at", place, CAP)) == ""


@pytest.fixture(scope="module")
def debugger(admission: Admission) -> Iterator[Identity]:
    """Somebody who may add ephemeral containers, as ``kubectl debug`` does, and nothing else."""
    rule = {"apiGroups": [""], "resources": ["pods/ephemeralcontainers"], "verbs": ["patch", "update"]}
    yield admission.grant("debugger", [rule])
    admission.revoke("debugger")


def test_an_ephemeral_container_may_not_take_a_pod_over_the_cap(admission: Admission, debugger: Identity) -> None:
    """The only way to add a container to a pod after its creation: the count is the pod's with it."""
    a = admission
    room = 100
    manifest = filled("env-debug", "an app container's env", CAP - room, node=OTHER_NODE)
    assert a.create(a.tenant, manifest, dry_run=False) == ""
    path = f"/api/v1/namespaces/{TENANT_NS}/pods/env-debug/ephemeralcontainers"

    def debug(n: int) -> dict[str, Any]:
        command = ["sh", "-c"]
        args = ["x" * (n - sum(map(len, command)))]
        return {
            "spec": {"ephemeralContainers": [{"name": "debug", "image": "busybox", "command": command, "args": args}]}
        }

    over = a.call(debugger, "PATCH", path, debug(room + 1), content_type=STRATEGIC)
    assert refusal(f"{TENANT_NS}/env-debug (through pods/ephemeralcontainers)", CAP + 1) in over, over
    assert a.call(debugger, "PATCH", path, debug(room), content_type=STRATEGIC) == ""


def _until(what: str, done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + SETTLE_S
    while not done():
        assert time.monotonic() < deadline, f"{what}: not so {SETTLE_S:.0f} s after the policy was written"
        time.sleep(0.5)


def test_a_cap_of_zero_checks_nothing(admission: Admission) -> None:
    """The chart installed with ``maxPodEnvBytes: 0``, then the tier's values again."""
    a = admission
    over = filled("env-off", "an app container's env", CAP + 1)
    tier = a.release.settings
    try:
        a.release.upgrade(dataclasses.replace(tier, chart={**tier.chart, "admission": {"maxPodEnvBytes": 0}}))
        _until("the pod over the default cap admitted", lambda: a.create(a.tenant, over) == "")
    finally:
        a.release.upgrade(tier)
        _until("the pod over the cap refused again", lambda: "admission.maxPodEnvBytes" in a.create(a.tenant, over))


def test_the_count_type_checks_against_every_container_list(admission: Admission) -> None:
    """The API server's type check of the count against the Pod's schema: a field misspelled under
    ``.?`` would count nothing, silently, where the check names it. It reads a policy's validations
    only, not its variables, and a policy matching pods alone: so a copy, bound to nothing, with the
    count for each container list as its validations, and one that must warn, to show it looked."""
    a = admission
    res = a.kubectl(None, "get", "validatingadmissionpolicy", "gpushare-pods", "-o", "json")
    assert res.returncode == 0, res.stderr
    (count,) = [v["expression"] for v in json.loads(res.stdout)["spec"]["variables"] if v["name"] == "envBytes"]
    # The count of one container ``c``, applied to each list on its own: the checker types each
    # list apart and would refuse the policy's concatenation of them before it looked inside.
    whole, _, one = count.removesuffix(").sum()").partition(".map(c, ")
    assert whole == "(variables.containers + object.spec.?ephemeralContainers.orValue([]))", count
    lists = ("containers", "initContainers", "ephemeralContainers")
    checks = [{"expression": f"object.spec.?{name}.orValue([]).map(c, {one}).sum() >= 0"} for name in lists]
    checks.append({"expression": "object.spec.containers.map(c, size(c.?argz.orValue([]))).sum() >= 0"})
    rule = {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
    probe = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": "gs-adm-typecheck", "labels": {TEST_LABEL: "1"}},
        "spec": {"failurePolicy": "Fail", "matchConstraints": {"resourceRules": [rule]}, "validations": checks},
    }
    assert a.create(None, probe, dry_run=False) == ""
    try:

        def warnings() -> list[dict[str, str]] | None:
            res = a.kubectl(None, "get", "validatingadmissionpolicy", "gs-adm-typecheck", "-o", "json")
            assert res.returncode == 0, res.stderr
            got = json.loads(res.stdout)
            st = got.get("status") or {}
            if st.get("observedGeneration") != got["metadata"]["generation"]:
                return None
            found: list[dict[str, str]] = (st.get("typeChecking") or {}).get("expressionWarnings") or []
            return found

        _until("the copy type-checked", lambda: warnings() is not None)
        found = warnings() or []
        assert [w["fieldRef"] for w in found] == [f"spec.validations[{len(lists)}].expression"], found
        assert "undefined field 'argz'" in found[0]["warning"], found
    finally:
        a.kubectl(None, "delete", "validatingadmissionpolicy", "gs-adm-typecheck", "--ignore-not-found")
