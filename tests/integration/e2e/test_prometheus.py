"""A real Prometheus (Debian's, `make prometheus`) with the shipped rules, scraping the agent's pod and a
fake dcgm-exporter page the test writes: the recording rules give each sharer its share of the
shadow's GPU, an owner and a spot borrower the value of the GPU they hold or borrow, joined on
the exporter's own `UUID` label; and `promtool check metrics` accepts the agent's live /metrics."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping

from gpumetrics.fake_exporter import FakeGpu, render_dcgm
from gpushare import keys
from localcluster.agent import FAKE_RESOURCE
from localcluster.pods import pod_manifest, sharer
from localcluster.prometheus import PrometheusServer, Sample, binary
from tests.integration.e2e.conftest import FAKE_GPU_IDS, Env

MIB = 1048576


def _dcgm(util: Mapping[str, float], fb_used_mib: Mapping[str, int], users: Mapping[str, tuple[str, ...]] = {}) -> str:
    """dcgm-exporter's page: utilization (the fake exporter's lines, ``users`` the pods whose processes
    use each GPU) plus framebuffer memory used, in MiB."""
    text = render_dcgm([FakeGpu(g, util.get(g, 0.0), users.get(g, ())) for g in FAKE_GPU_IDS])
    lines = ["# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).", "# TYPE DCGM_FI_DEV_FB_USED gauge"]
    for index, gpu in enumerate(FAKE_GPU_IDS):
        labels = f'gpu="{index}",UUID="{gpu}",device="nvidia{index}"'
        lines.append(f"DCGM_FI_DEV_FB_USED{{{labels}}} {fb_used_mib.get(gpu, 0)}")
    return text + "\n".join(lines) + "\n"


def _by_pod(samples: list[Sample]) -> dict[str, float]:
    return {f"{s.labels['namespace']}/{s.labels['pod']}": s.value for s in samples}


def test_rules_give_each_sharer_its_share_and_an_owner_its_gpu(e2e: Env, prometheus: PrometheusServer) -> None:
    names = [f"prom-{i}" for i in range(4)]
    owner = pod_manifest("prom-owner", resources={FAKE_RESOURCE: "1"})
    e2e.start_pods([*(sharer(n) for n in names), owner])
    e2e.wait("4 users recorded", lambda: sum(len(s["users"]) for s in e2e.agent.status()["shadows"]) == 4, 30)
    (shadow,) = e2e.agent.status()["shadows"]
    (shadow_gpu,) = shadow["gpu"]
    (owner_gpu,) = [g for g in FAKE_GPU_IDS if g != shadow_gpu]
    e2e.exporter.text = _dcgm({shadow_gpu: 80.0, owner_gpu: 55.0}, {shadow_gpu: 4096, owner_gpu: 1000})

    sharers = {f"default/{n}" for n in names}

    def settled() -> bool:
        util = _by_pod(prometheus.query('gpushare:pod_gpu_utilization:percent{namespace="default"}'))
        return set(util) == sharers | {"default/prom-owner"} and util["default/prom-owner"] == 55.0

    prometheus.wait("per-pod utilization recorded", settled, 90)

    util = prometheus.query('gpushare:pod_gpu_utilization:percent{namespace="default"}')
    assert {s.labels["pod"]: (s.labels["role"], s.labels["device_id"], s.value) for s in util} == {
        **{n: ("sharer", shadow_gpu, 20.0) for n in names},
        "prom-owner": ("owner", owner_gpu, 55.0),
    }
    memory = _by_pod(prometheus.query('gpushare:pod_gpu_memory_used:bytes{namespace="default"}'))
    assert memory == {**{p: 1024.0 * MIB for p in sharers}, "default/prom-owner": 1000.0 * MIB}

    # The agent's own rows carry dcgm-exporter's labels for the GPU: UUID, and gpu from its scrape.
    users = prometheus.query('gpushare_gpu_user{role="sharer"}')
    assert {(s.labels["UUID"], s.labels["gpu"], s.labels["source"]) for s in users} == {
        (shadow_gpu, str(FAKE_GPU_IDS.index(shadow_gpu)), shadow["pod"])
    }
    (sharers_series,) = prometheus.query("gpushare_shadow_sharers")
    assert sharers_series.value == 4.0 and sharers_series.labels["shadow"] == shadow["pod"]


def test_promtool_accepts_the_agents_live_metrics(e2e: Env) -> None:
    code, body = e2e.agent.get("/metrics")
    assert code == 200
    res = subprocess.run(
        [str(binary("promtool")), "check", "metrics"], input=body, capture_output=True, timeout=60, check=False
    )
    assert res.returncode == 0 and not res.stdout.strip(), (res.stdout + res.stderr).decode()


def test_rules_give_a_borrower_the_lent_gpus_value(e2e: Env, prometheus: PrometheusServer) -> None:
    e2e.exporter.text = _dcgm({}, {})  # every GPU idle: the lendable owner's GPU is lent after the idle window
    owner = pod_manifest("prom-lender", resources={FAKE_RESOURCE: "1"}, labels={keys.LABEL_LENDABLE: "true"})
    e2e.start_pods([owner])
    e2e.wait("the owner's GPU lent", lambda: e2e.allocatable().get(keys.RESOURCE_SPOT_GPU) == "1", 60)
    e2e.start_pods([pod_manifest("prom-borrower", resources={keys.RESOURCE_SPOT_GPU: "1"})])
    (lent,) = [g["real_id"] for g in e2e.agent.status()["spot"] if g["borrowers"]]
    # The borrower's processes use the GPU (the exporter attributes by process): the owner is not back.
    e2e.exporter.text = _dcgm({lent: 30.0}, {lent: 1000}, {lent: ("default/prom-borrower",)})

    def borrower_recorded() -> bool:
        util = _by_pod(prometheus.query(f'gpushare:pod_gpu_utilization:percent{{device_id="{lent}"}}'))
        return util == {"default/prom-borrower": 30.0, "default/prom-lender": 30.0}

    prometheus.wait("the borrower's utilization recorded", borrower_recorded, 90)
    (row,) = prometheus.query('gpushare:pod_gpu_utilization:percent{role="borrower"}')
    assert row.labels["pod"] == "prom-borrower" and row.labels["device_id"] == lent
    (user,) = prometheus.query('gpushare_gpu_user{role="borrower"}')
    assert user.labels["source"] == "default/prom-lender/app" and user.labels["UUID"] == lent
    assert user.labels["resource"] == keys.RESOURCE_SPOT_GPU
    memory = _by_pod(prometheus.query(f'gpushare:pod_gpu_memory_used:bytes{{device_id="{lent}"}}'))
    assert memory == {"default/prom-borrower": 1000.0 * MIB, "default/prom-lender": 1000.0 * MIB}
