"""Admission tier: the chart's ValidatingAdmissionPolicies (docs/security.md) in the real API server.

One install per tier, as an operator does it: the agent image imported into the node's containerd
and ``helm install`` of manifests/chart, which brings the policies along with the agent's
DaemonSet. The requests are then made as the people the policies are about:

- a tenant: a ServiceAccount with the stock ``edit`` role in its own namespace, and nothing else;
- the agent: the very token kubelet mounted into the DaemonSet's pod, read from the pod's volume
  on the node (the kubelet root dir is shared with the host, docs/cluster.md), so the node name
  in it is the one Kubernetes bound, not one the test chose;
- the agent's ServiceAccount with a token that is not bound to a pod, which names no node;
- where a rule is about a pod subresource, a ServiceAccount granted just that, as an operator or a
  compromised controller would hold it, and the agent's token with the same grant added for the
  test (its ClusterRole has none).

"Another node" is a second Node object made by API: pods bound to it never start, which is all
the per-node rule needs. The session's one-node cluster is shared with the other tiers, so
everything made here goes again at the end, the release included.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.core.pod_facts import PodRef
from controller.core.share_key import Pool, ShareKey
from controller.errors import KubeError
from controller.io.kube_client import KubeClient
from controller.share.solver import build_shadow_manifest, shadow_name
from gpushare import keys
from gpushare.config import Config, load_config
from localcluster.agent import FAKE_RESOURCE, AgentSettings
from localcluster.cluster import Cluster
from localcluster.errors import ClusterUnavailable
from localcluster.helm import pods
from localcluster.host import free_port
from tests.harness.cluster_fixture import cluster  # noqa: F401
from tests.harness.worlds.agent_pod import NAMESPACE, SELECTOR, AgentPod

TENANT_NS = "gs-adm-tenant"
TENANT_SA = "tenant"
AGENT_SA = "gpushare-agent"
OTHER_NODE = "gs-adm-other"
OTHER_NODE_SHARE = "gpushare/share-gpu-4"
# Every test pod carries it, so the teardown finds them all; shadows, which may carry no label
# of their own, are found by theirs.
TEST_LABEL = "gpushare-admission-test"
SHADOW_SELECTOR = f"{keys.LABEL_ROLE}={keys.ROLE_SHADOW}"
# A pool whose node selector no node matches: the scheduler leaves its shadows alone.
NOWHERE = Pool(FAKE_RESOURCE, (("gpushare-admission-test/pool", "nowhere"),))
FAR_SHADOW_ORDINAL = 2


@dataclass(frozen=True)
class Identity:
    """Somebody who sends requests: a name for messages, and a kubeconfig holding their token."""

    name: str
    kubeconfig: Path


@dataclass
class Admission:
    cluster: Cluster
    agent_pod: dict[str, Any]
    tenant: Identity
    agent: Identity
    agent_unbound: Identity
    side: Path
    # The release: a test that installs the chart with other values puts the tier's back after it.
    release: AgentPod

    def kubectl(self, who: Identity | None, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        """kubectl as ``who`` (None: the cluster's admin); never raises, the caller reads the result."""
        kubeconfig = self.cluster.kubeconfig if who is None else who.kubeconfig
        argv = [str(self.cluster.binaries.kubectl), f"--kubeconfig={kubeconfig}", *args]
        return subprocess.run(argv, capture_output=True, text=True, input=input, timeout=60, check=False)

    def create(self, who: Identity | None, manifest: dict[str, Any], *, dry_run: bool = True) -> str:
        """Create the pod as ``who``; "" when admitted, else kubectl's error text.

        A server-side dry run goes through admission exactly as a create does, and leaves nothing
        for the agent or the scheduler to act on.
        """
        args = ["create", "-f", "-", *(["--dry-run=server"] if dry_run else [])]
        return _error(self.kubectl(who, *args, input=json.dumps(manifest)))

    def run(self, who: Identity | None, *args: str) -> str:
        """Any other kubectl command as ``who``; "" on success, else its error text."""
        return _error(self.kubectl(who, *args))

    def by_agent(self, who: Identity, call: Callable[[KubeClient], bool]) -> str:
        """One call of the agent's own API client (controller.io.kube_client) as ``who``: "" when
        it took effect, else why not. The agent is never granted ``get`` on pods, so kubectl, which
        reads an object before it patches it, cannot stand in for it."""
        with KubeClient.from_kubeconfig(str(who.kubeconfig)) as client:
            try:
                return "" if call(client) else "the call had no effect: the pod is gone or was replaced"
            except KubeError as exc:
                return str(exc)

    def create_by_agent(self, who: Identity, manifest: dict[str, Any], *, dry_run: bool = True) -> str:
        """``create`` through the agent's client (a server-side dry run unless ``dry_run`` is False)."""

        def post(client: KubeClient) -> bool:
            path = f"/api/v1/namespaces/{manifest['metadata']['namespace']}/pods"
            client._call("POST", path, query={"dryRun": "All" if dry_run else None}, body=manifest)
            return True

        return self.by_agent(who, post)

    def call(
        self,
        who: Identity | None,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        query: dict[str, str] | None = None,
        dry_run: bool = True,
    ) -> str:
        """One request to the API as ``who`` (None: the admin): "" when it was admitted, else why not.

        A server-side dry run goes through admission and leaves nothing behind; for the requests
        that take options in their body (an Eviction's), the caller puts dryRun there too.
        """
        kubeconfig = self.cluster.kubeconfig if who is None else who.kubeconfig

        def send(client: KubeClient) -> bool:
            params = {**(query or {}), "dryRun": "All" if dry_run else None}
            client._call(method, path, query=params, body=body, content_type=content_type)
            return True

        with KubeClient.from_kubeconfig(str(kubeconfig)) as client:
            try:
                return "" if send(client) else "no effect"
            except KubeError as exc:
                return str(exc)

    def config(self) -> Config:
        """The agent's config as the chart wrote it into the ConfigMap the agent reads."""
        res = self.kubectl(None, "get", "configmap", "gpushare-config", "-n", NAMESPACE, "-o", "json")
        assert res.returncode == 0, res.stderr
        return load_config(text=json.loads(res.stdout)["data"]["config.yaml"])

    def shadow(
        self, *, spec: int = 4, kind: str = keys.KIND_SHARE, pool: Pool = NOWHERE, ordinal: int = 0
    ) -> dict[str, Any]:
        """The shadow the Lease holder would create for this key: build_shadow_manifest's own output."""
        key = ShareKey(pool, kind, spec)
        return build_shadow_manifest(key, shadow_name(key, ordinal), self.config())

    def shadow_on(self, node: str, *, ordinal: int) -> str:
        """A shadow made as the Lease holder makes one (by the agent, unbound), then bound to
        ``node`` as the scheduler would bind it (by the admin here: no node matches its pool).
        Returns its name."""
        manifest = self.shadow(ordinal=ordinal)
        name = str(manifest["metadata"]["name"])
        made = self.create_by_agent(self.agent, manifest, dry_run=False)
        assert made == "", made
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "target": {"kind": "Node", "name": node},
        }
        bound = self.call(None, "POST", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}/binding", binding, dry_run=False)
        assert bound == "", bound
        return name

    def grant(self, name: str, rules: list[dict[str, Any]], *, to_agent: bool = False) -> Identity:
        """A ClusterRole of exactly ``rules``, bound to a new ServiceAccount ``name`` of the tenant
        namespace (its identity is returned), or, ``to_agent``, to the agent's ServiceAccount on top
        of its own role (the agent's identity is returned). Waits until the authorizer sees it."""
        role = f"gs-adm-{name}"
        meta = {"name": role, "labels": {TEST_LABEL: "1"}}
        sa = {"kind": "ServiceAccount", "name": AGENT_SA if to_agent else name}
        sa["namespace"] = NAMESPACE if to_agent else TENANT_NS
        docs = [
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": meta, "rules": rules},
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": meta,
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                "subjects": [sa],
            },
        ]
        if not to_agent:
            self.cluster.kubectl("create", "serviceaccount", name, "-n", TENANT_NS)
        for doc in docs:
            self.cluster.kubectl("apply", "-f", "-", input=json.dumps(doc))
        user = f"system:serviceaccount:{sa['namespace']}:{sa['name']}"
        verb, (resource, _, sub) = rules[0]["verbs"][0], rules[0]["resources"][0].partition("/")
        ask = ["auth", "can-i", verb, resource, f"--subresource={sub}", f"--as={user}", "-A"]
        deadline = time.monotonic() + 30.0
        while self.kubectl(None, *ask).stdout.strip() != "yes":
            assert time.monotonic() < deadline, f"{user} cannot {verb} {resource}/{sub} 30 s after the grant"
            time.sleep(0.2)
        if to_agent:
            return self.agent
        token = self.cluster.kubectl("create", "token", name, "-n", TENANT_NS, "--duration=1h").stdout.strip()
        return _kubeconfig(self.cluster, self.side / f"{name}.kubeconfig", f"{TENANT_NS}:{name}", token=token)

    def revoke(self, name: str) -> None:
        self.cluster.kubectl("delete", "clusterrolebinding,clusterrole", f"gs-adm-{name}", "--ignore-not-found")

    def ref(self, name: str, namespace: str = TENANT_NS) -> PodRef:
        return PodRef(namespace, name, str(self.pod(name, namespace)["metadata"]["uid"]))

    def pod(self, name: str, namespace: str = TENANT_NS) -> dict[str, Any]:
        found = self.cluster.pod(name, namespace)
        assert found is not None, f"pod {namespace}/{name} is gone"
        return found


def _error(res: subprocess.CompletedProcess[str]) -> str:
    if res.returncode == 0:
        return ""
    return res.stderr.strip() or f"kubectl exited {res.returncode} without a message"


def _kubeconfig(c: Cluster, path: Path, user: str, token: str) -> Identity:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "local",
                "cluster": {"server": c.server, "certificate-authority": str(c.layout.pki / "ca.crt")},
            }
        ],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": user, "context": {"cluster": "local", "user": user}}],
        "current-context": user,
    }
    path.write_text(yaml.safe_dump(doc))
    path.chmod(0o600)
    return Identity(user, path)


def _token_file(c: Cluster, pod: dict[str, Any]) -> Path:
    """The ServiceAccount token kubelet projected into ``pod``, as the container reads it."""
    uid = str(pod["metadata"]["uid"])
    volumes = c.kubelet_root / "pods" / uid / "volumes" / "kubernetes.io~projected"
    found = sorted(volumes.glob("kube-api-access-*/token"))
    assert len(found) == 1, f"expected one projected ServiceAccount token under {volumes}, found {found}"
    return found[0]


def _tenant(c: Cluster) -> None:
    c.kubectl("create", "namespace", TENANT_NS)
    c.kubectl("create", "serviceaccount", TENANT_SA, "-n", TENANT_NS)
    c.kubectl(
        "create", "rolebinding", "tenant-edit", "-n", TENANT_NS, "--clusterrole=edit",
        f"--serviceaccount={TENANT_NS}:{TENANT_SA}",
    )  # fmt: skip


def _other_node(c: Cluster) -> None:
    # A share count the agent of this node would like to lower there (docs/scale.md). CPU and
    # memory too: kube-apiserver 1.37 checks a pods/resize against the node's allocatable before
    # any admission policy sees it. The taint keeps the scheduler from placing anything there.
    counts = {OTHER_NODE_SHARE: "4", "cpu": "8", "memory": "16Gi", "pods": "110"}
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": OTHER_NODE, "labels": {TEST_LABEL: "1"}},
        "spec": {"taints": [{"key": "gpushare.k8s.io/test-no-kubelet", "effect": "NoSchedule"}]},
        "status": {"capacity": counts, "allocatable": counts},
    }
    c.kubectl("create", "-f", "-", input=json.dumps(node))


def _clean(c: Cluster) -> None:
    # Pods bound to the other node have no kubelet to confirm a graceful delete: force them.
    for ns, selector in ((TENANT_NS, TEST_LABEL), (NAMESPACE, TEST_LABEL), (NAMESPACE, SHADOW_SELECTOR)):
        c.kubectl(
            "delete", "pods", "-n", ns, "-l", selector, "--grace-period=0", "--force", "--wait=true",
            "--timeout=60s", check=False,
        )  # fmt: skip
    c.kubectl("delete", "clusterrolebinding,clusterrole", "-l", TEST_LABEL, "--ignore-not-found", check=False)
    c.kubectl("delete", "node", OTHER_NODE, "--ignore-not-found", check=False)
    c.kubectl("delete", "namespace", TENANT_NS, "--ignore-not-found", "--timeout=120s", check=False)


@pytest.fixture(scope="package")
def admission(cluster: Cluster) -> Iterator[Admission]:  # noqa: F811
    side = Path(tempfile.mkdtemp(prefix="gs-adm", dir="/tmp"))
    agent = AgentPod(cluster, side, AgentSettings(), free_port())
    try:
        try:
            agent.install()
        except ClusterUnavailable as exc:
            pytest.skip(str(exc))
        _tenant(cluster)
        _other_node(cluster)
        live = [p for p in pods(cluster, NAMESPACE, SELECTOR) if not p["metadata"].get("deletionTimestamp")]
        (agent_pod,) = live
        token = _token_file(cluster, agent_pod).read_text().strip()
        tenant_token = cluster.kubectl("create", "token", TENANT_SA, "-n", TENANT_NS, "--duration=1h").stdout.strip()
        unbound = cluster.kubectl("create", "token", AGENT_SA, "-n", NAMESPACE, "--duration=1h").stdout.strip()
        yield Admission(
            cluster,
            agent_pod,
            tenant=_kubeconfig(cluster, side / "tenant.kubeconfig", f"{TENANT_NS}:{TENANT_SA}", token=tenant_token),
            agent=_kubeconfig(cluster, side / "agent.kubeconfig", "agent", token=token),
            agent_unbound=_kubeconfig(cluster, side / "agent-unbound.kubeconfig", "agent-unbound", token=unbound),
            side=side,
            release=agent,
        )
    finally:
        _clean(cluster)
        agent.close()
        shutil.rmtree(side, ignore_errors=True)


@pytest.fixture(scope="package")
def far_shadow(admission: Admission) -> str:
    """A shadow on the other node, as this node's agent would have made it there as Lease holder."""
    return admission.shadow_on(OTHER_NODE, ordinal=FAR_SHADOW_ORDINAL)
