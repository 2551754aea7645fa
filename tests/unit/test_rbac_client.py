"""The agent's RBAC against its code, statically: every request ``KubeClient`` sends from the
places the agent calls it, reduced to (verb, group, resource, scope) and compared both ways with
manifests/20-rbac.yaml. The live counterpart, from the apiserver's audit log, is
tests/integration/e2e/test_rbac_exact.py.

The requests are KubeClient's own: it runs against a recorder in place of the HTTP client, so
the paths and methods are exactly what it sends. Where each call reaches (which namespace) is
the table below, one row per call site; a scan of the code fails when a KubeClient method is
called that no row accounts for.
"""

from __future__ import annotations

import ast
import inspect
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from controller.core import endpoint_rules
from controller.core.pod_facts import PodRef
from controller.io.access_reviews import ReviewClient
from controller.io.kube_client import KubeClient
from gpushare import keys
from tests.harness.rbac import Use, compare, manifest_grants, scope_of

REPO = Path(__file__).resolve().parents[2]
TENANT = PodRef("team-a", "sharer-0", "uid-1")
SHADOW = PodRef(keys.DEFAULT_NAMESPACE, "shadow-share-4-abc-0", "uid-2")
SHADOW_MANIFEST = {"metadata": {"namespace": keys.DEFAULT_NAMESPACE, "name": SHADOW.name}}
LEASE = {"holderIdentity": "node-a", "leaseDurationSeconds": 15}

# One row per call site: (KubeClient method, a call as that site makes it, the code that makes it).
CALL_SITES: list[tuple[str, Callable[[KubeClient], object], str]] = [
    ("list_pods", lambda c: c.list_pods(field_selector="spec.nodeName=n"), "io/pod_cache: this node's pods"),
    ("list_pods", lambda c: c.list_pods(field_selector="spec.nodeName="), "io/pod_cache, cluster_pass: pending pods"),
    ("list_pods", lambda c: c.list_pods(namespace=keys.DEFAULT_NAMESPACE), "io/pod_cache, cluster_pass: shadows"),
    (
        "list_pods",
        lambda c: c.list_pods(namespace="gpu-operator", label_selector="app=a", field_selector="spec.nodeName=n"),
        "io/exporter_pods: the node's exporter pod, for a k8s://pods/ metrics source",
    ),
    ("watch_pods", lambda c: list(c.watch_pods("1", field_selector="spec.nodeName=n")), "io/pod_cache"),
    ("watch_pods", lambda c: list(c.watch_pods("1", namespace=keys.DEFAULT_NAMESPACE)), "io/pod_cache: shadows"),
    ("create_pod", lambda c: c.create_pod(SHADOW_MANIFEST), "applier: the leader creates a shadow"),
    ("delete_pod", lambda c: c.delete_pod(SHADOW), "applier: the leader deletes an idle shadow"),
    ("delete_pod", lambda c: c.delete_pod(TENANT), "applier: evict a sharer or a borrower"),
    ("patch_pod_annotations", lambda c: c.patch_pod_annotations(SHADOW, {"k": "v"}), "applier: a shadow's users"),
    ("patch_pod_annotations", lambda c: c.patch_pod_annotations(TENANT, {"k": "v"}), "applier: a sharer's owner"),
    ("record_event", lambda c: c.record_event(TENANT, "R", "m"), "applier: an Event on a tenant's pod"),
    ("record_node_event", lambda c: c.record_node_event("node-a", "R", "m"), "applier: spot's Event on the Node"),
    ("get_lease", lambda c: c.get_lease(keys.DEFAULT_NAMESPACE, keys.LEASE_NAME), "io/lease"),
    ("write_lease", lambda c: c.write_lease(keys.DEFAULT_NAMESPACE, keys.LEASE_NAME, LEASE, None), "io/lease"),
    ("write_lease", lambda c: c.write_lease(keys.DEFAULT_NAMESPACE, keys.LEASE_NAME, LEASE, "7"), "io/lease"),
    ("list_nodes", lambda c: c.list_nodes(), "commands/doctor, status: run in the agent's pod"),
    ("list_node", lambda c: c.list_node("node-a"), "io/node_watch: this node's Node"),
    ("watch_node", lambda c: list(c.watch_node("node-a", "1")), "io/node_watch"),
    (
        "patch_node_status",
        lambda c: c.patch_node_status("node-a", {"allocatable": {"gpushare/share-gpu-4": "1"}}),
        "io/node_watch: publish a share count that is leaving, and again when kubelet writes it back",
    ),
]
NAMESPACE_SITES: list[tuple[str, Callable[[KubeClient], object], str]] = [
    ("list_namespaces", lambda c: c.list_namespaces(label_selector="l=true"), "io/namespace_cache"),
    ("watch_namespaces", lambda c: list(c.watch_namespaces("1", label_selector="l=true")), "io/namespace_cache"),
]
# The endpoint's client (controller/io/access_reviews.py): the two reviews of a bearer token sent to
# /metrics from off the node, with config.metrics.access: rbac, the chart's default.
REVIEW_SITES: list[tuple[str, Callable[[ReviewClient], object], str]] = [
    ("token_review", lambda c: c.token_review(endpoint_rules.token_review_body("t")), "the endpoint: who sent it"),
    (
        "access_review",
        lambda c: c.access_review(endpoint_rules.access_review_body(endpoint_rules.Identity("u"), "/metrics")),
        "the endpoint: may they get /metrics",
    ),
]
# Public methods the agent's ServiceAccount never calls: each with the reason.
NOT_CALLED_BY_THE_AGENT = {
    "close": "no request",
    "from_kubeconfig": "no request (loading credentials)",
    "list_events": "only `kubectl gpushare why` reads Events, with the user's own kubeconfig",
    # The chart's hooks, each with an account of its own (tests/unit/test_chart_hooks.py checks those).
    "evict_pod": "the uninstall hook (`gpushare uninstall prepare --evict`)",
    "get_namespace_annotations": "the uninstall hook (the operator's gpushare.k8s.io/uninstall=evict)",
    "list_resource_claims": "the uninstall hook",
    "delete_lease": "the uninstall hook (`gpushare uninstall finish`)",
    "delete_admission_policy": "the uninstall hook (`gpushare uninstall finish`)",
    "list_daemonsets": "`helm test` (`gpushare install-check`)",
    "list_resource_slices": "`helm test` (`gpushare install-check`)",
}
# Modules that run with the user's kubeconfig (a kubectl plugin), never the agent's token.
USER_CREDENTIALS = {"cli/kubectl/plugin.py"}


def _sites() -> list[tuple[str, Callable[[KubeClient], object], str]]:
    """The rows whose method KubeClient has (spot's namespace reads have had more than one shape)."""
    return CALL_SITES + [row for row in NAMESPACE_SITES if hasattr(KubeClient, row[0])]


class _Response:
    status = 200

    def __init__(self, body: bytes) -> None:
        self._body = body
        self.response = self

    def read(self) -> bytes:
        return self._body

    def getheader(self, _name: str) -> None:
        return None

    def stream(self, *_a: Any, **_kw: Any) -> Iterator[bytes]:
        return iter(())

    def close(self) -> None: ...

    def release_conn(self) -> None: ...


class _Configuration:
    host = "https://api.test"


class _Recorder:
    """Stands in for ``kubernetes.client.ApiClient``: records (method, path, query) and answers 200."""

    configuration = _Configuration()

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict[str, list[str]]]] = []

    def param_serialize(self, *, method: str, resource_path: str, query_params: list[tuple[str, Any]], **_: Any) -> Any:
        return (method, resource_path, {k: [str(v)] for k, v in query_params})

    def call_api(self, method: str, path: str, query: dict[str, list[str]], **_: Any) -> _Response:
        self.requests.append((method, path, query))
        # Enough of every object for each method to go on to its next request (a node's count to lower).
        count = {"gpushare/share-gpu-4": "4"}
        body = json.dumps(
            {
                "items": [],
                "metadata": {"resourceVersion": "1", "name": "x"},
                "spec": {},
                "status": {"capacity": count, "allocatable": count},
            }
        ).encode()
        return _Response(body)

    def close(self) -> None: ...


def use_of(method: str, path: str, query: dict[str, list[str]]) -> Use:
    """The (verb, group, resource, scope) an API request needs, as the apiserver's RBAC sees it."""
    parts = urlsplit(path).path.strip("/").split("/")
    if parts[0] == "api":
        group, rest = "", parts[2:]
    else:
        group, rest = parts[1], parts[3:]
    namespace = ""
    if rest[0] == "namespaces" and len(rest) >= 3:
        namespace, rest = rest[1], rest[2:]
    resource, named = rest[0], len(rest) > 1
    if len(rest) > 2:
        resource += "/" + rest[2]
    verbs = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete" if named else "deletecollection"}
    if method == "GET":
        verb = "get" if named else ("watch" if query.get("watch") == ["true"] else "list")
    else:
        verb = verbs[method]
    return Use(verb, group, resource, scope_of(group, resource, namespace))


def _static_uses() -> set[Use]:
    uses: set[Use] = set()
    for _name, call, _why in _sites():
        recorder = _Recorder()
        call(KubeClient(recorder))
        assert recorder.requests, _why
        uses |= {use_of(*r) for r in recorder.requests}
    for _name, review, _why in REVIEW_SITES:
        recorder = _Recorder()
        review(ReviewClient(recorder))
        assert len(recorder.requests) == 1, _why
        uses |= {use_of(*r) for r in recorder.requests}
    return uses


def test_use_of_reads_paths_as_rbac_does() -> None:
    assert use_of("GET", "/api/v1/pods", {}) == Use("list", "", "pods", "cluster-wide")
    assert use_of("GET", "/api/v1/namespaces", {"watch": ["true"]}) == Use("watch", "", "namespaces", "cluster-wide")
    assert use_of("GET", "/api/v1/namespaces/team-a", {}) == Use("get", "", "namespaces", "cluster-wide")
    assert use_of("DELETE", "/api/v1/namespaces/team-a/pods/p", {}) == Use("delete", "", "pods", "any-namespace")
    assert use_of("PATCH", "/api/v1/namespaces/team-a/pods/p/status", {}) == Use(
        "patch", "", "pods/status", "any-namespace"
    )
    lease = "/apis/coordination.k8s.io/v1/namespaces/gpushare-system/leases/l"
    assert use_of("PUT", lease, {}) == Use("update", "coordination.k8s.io", "leases", "gpushare-system")


def test_every_request_kubeclient_sends_is_granted_and_every_grant_is_used() -> None:
    verdict = compare(manifest_grants(), _static_uses())
    assert verdict.exact, verdict.explain()


def test_every_public_kubeclient_method_is_a_call_site_or_said_unused() -> None:
    public = {n for n, _ in inspect.getmembers(KubeClient) if not n.startswith("_")}
    tabled = {row[0] for row in _sites()}
    assert public == tabled | set(NOT_CALLED_BY_THE_AGENT), (
        f"new: {sorted(public - tabled - set(NOT_CALLED_BY_THE_AGENT))}; "
        f"gone: {sorted((tabled | set(NOT_CALLED_BY_THE_AGENT)) - public)}"
    )


def test_the_review_client_adds_only_the_tabled_reviews() -> None:
    added = {n for n, _ in inspect.getmembers(ReviewClient) if not n.startswith("_")} - {
        n for n, _ in inspect.getmembers(KubeClient) if not n.startswith("_")
    }
    assert added == {row[0] for row in REVIEW_SITES} | {"for_endpoint"}


def test_the_reviews_are_cluster_wide_creates() -> None:
    uses = set()
    for _name, review, _why in REVIEW_SITES:
        recorder = _Recorder()
        review(ReviewClient(recorder))
        uses |= {use_of(*r) for r in recorder.requests}
    assert uses == {
        Use("create", "authentication.k8s.io", "tokenreviews", "cluster-wide"),
        Use("create", "authorization.k8s.io", "subjectaccessreviews", "cluster-wide"),
    }


def _called_methods(names: set[str]) -> dict[str, set[str]]:
    """KubeClient method name -> the agent's modules under controller/ that call a method of that name."""
    out: dict[str, set[str]] = {}
    for path in sorted((REPO / "controller").rglob("*.py")):
        if path.name == "kube_client.py" or str(path.relative_to(REPO)) in USER_CREDENTIALS:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in names:
                out.setdefault(node.func.attr, set()).add(str(path.relative_to(REPO)))
    return out


@pytest.mark.parametrize("method", sorted(NOT_CALLED_BY_THE_AGENT.keys() - {"close", "from_kubeconfig"}))
def test_methods_said_unused_are_not_called_by_the_agent(method: str) -> None:
    assert method not in _called_methods({method}), _called_methods({method})


def test_the_agent_calls_only_tabled_methods() -> None:
    public = {n for n, _ in inspect.getmembers(KubeClient) if not n.startswith("_")}
    called = _called_methods(public - {"close"})
    assert set(called) <= {row[0] for row in _sites()} | {"from_kubeconfig"}, called
