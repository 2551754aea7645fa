"""/metrics names tenants' pods: from off the node, only a token the RBAC allows reads it (docs/security.md).

The agent installed by the chart, with its defaults (``config.metrics.access: rbac``), and a
sharer whose name its /metrics then carries. Clients come from an address off the node
(tests/harness/off_node.py): with no token, with a token nobody authenticates, with a token of a
ServiceAccount the RBAC does not allow, and with one bound to the ClusterRole the chart ships for
scrapers, ``gpushare-metrics-reader``. Only the last reads /metrics; none of the refusals names a
pod; /status stays the node's; /healthz answers anyone.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from localcluster.pods import sharer
from tests.harness.off_node import get, off_node_addresses
from tests.integration.e2e.conftest import Env

NAMESPACE = "metrics-access"
POD = "metrics-access-sharer"
READER_BINDING = "metrics-access-reader"
READER_ROLE = "gpushare-metrics-reader"


def _token(e: Env, account: str) -> str:
    e.cluster.kubectl("create", "serviceaccount", "-n", NAMESPACE, account)
    return e.cluster.kubectl("create", "token", "-n", NAMESPACE, account, "--duration", "10m").stdout.strip()


def _names_no_pod(body: bytes) -> None:
    assert POD.encode() not in body and b"gpushare_" not in body, body[:500]


@pytest.fixture
def tenant(e2e: Env) -> Iterator[None]:
    e2e.cluster.kubectl("create", "namespace", NAMESPACE)
    try:
        e2e.start_pods([sharer(POD, namespace=NAMESPACE)])
        # From the node itself /metrics names the sharer: what a client off the node must not read.
        e2e.wait(
            "the sharer named in /metrics",
            lambda: f'pod="{POD}"'.encode() in e2e.agent.get("/metrics")[1],
            30,
        )
        yield
    finally:
        e2e.cluster.kubectl("delete", "clusterrolebinding", READER_BINDING, "--ignore-not-found")
        e2e.cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=true", "--timeout=90s", check=False)


@pytest.mark.usefixtures("tenant")
def test_metrics_off_the_node_need_a_token_bound_to_the_reader_role(e2e: Env) -> None:
    port = e2e.agent.port
    with off_node_addresses(1) as (source,):
        code, headers, body = get(port, "/metrics", source=source)
        assert code == 401, (code, body[:500])
        assert headers.get("WWW-Authenticate") == 'Bearer realm="gpushare"'
        assert READER_ROLE.encode() in body  # the refusal says what to bind
        _names_no_pod(body)

        code, _, body = get(port, "/metrics", source=source, token="not-a-token-anyone-issued")
        assert code == 401, (code, body[:500])
        _names_no_pod(body)

        nobody = _token(e2e, "nobody")
        code, _, body = get(port, "/metrics", source=source, token=nobody)
        assert code == 403, (code, body[:500])
        assert f"system:serviceaccount:{NAMESPACE}:nobody".encode() in body
        _names_no_pod(body)

        reader = _token(e2e, "prometheus")
        e2e.cluster.kubectl(
            "create", "clusterrolebinding", READER_BINDING,
            "--clusterrole", READER_ROLE, "--serviceaccount", f"{NAMESPACE}:prometheus",
        )  # fmt: skip
        code, _, body = get(port, "/metrics", source=source, token=reader)
        assert code == 200, (code, body[:500])
        assert f'pod="{POD}"'.encode() in body

        # Reading /metrics is not being the node: /status names pods and devices, loopback only.
        code, _, body = get(port, "/status", source=source, token=reader)
        assert code == 403 and POD.encode() not in body, (code, body[:500])
        # kubelet's probes carry no token; /healthz names nothing.
        code, _, body = get(port, "/healthz", source=source)
        assert code == 200 and body.startswith(b"ok: last pass"), (code, body)

    # The node's own clients (gpushare status, a node-local scraper) need no token, as before.
    assert e2e.agent.get("/metrics")[0] == 200
