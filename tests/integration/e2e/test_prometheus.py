"""A real Prometheus (Debian's, `make prometheus`) with the rules the chart installed, scraping the agent's
pod under the chart's prometheus.jobLabel (a PodMonitor-style "<namespace>/<name>") and a fake
dcgm-exporter page the test writes: the recording rules give each sharer its share of the
shadow's GPU, an owner and a spot borrower the value of the GPU they hold or borrow, joined on
the exporter's own `UUID` label; every rule evaluates and the alerts on the agents' job see a dead
target and a missing one; and `promtool check metrics` accepts the agent's live /metrics."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping

import yaml

from gpumetrics.fake_exporter import FakeGpu, render_dcgm
from gpushare import keys
from localcluster.agent import FAKE_RESOURCE
from localcluster.host import free_port
from localcluster.pods import pod_manifest, sharer
from localcluster.prometheus import AGENT_JOB, EXPORTER_JOB, PrometheusServer, Sample, binary
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


def _active(prometheus: PrometheusServer, alert: str) -> list[dict[str, str]]:
    """The labels of each active (pending or firing) instance of ``alert``."""
    return [a["labels"] for a in prometheus.alerts() if a["labels"]["alertname"] == alert]


def test_every_rule_evaluates_and_the_agents_alerts_follow_the_job(e2e: Env, prometheus: PrometheusServer) -> None:
    """The rules the chart installed with a PodMonitor-style job (AGENT_JOB): every rule evaluates
    without error, every recording rule yields series for the e2e's vendor, and the two alerts on the
    agents' job see a target that is down and a scrape config that has none."""
    text = e2e.chart_file("60-prometheus-rules.yaml", "gpushare-prometheus-rules", "gpushare.rules.yaml")
    rules = [rule for group in yaml.safe_load(text)["groups"] for rule in group["rules"]]
    assert 'job="gpushare-agent"' not in text
    on_job = {r["alert"] for r in rules if "alert" in r and f'job="{AGENT_JOB}"' in r["expr"]}
    assert on_job == {"GpushareAgentDown", "GpushareAgentsAbsent"}

    # Two sharers on a shadow; the exporter names their processes' memory (per-process records).
    names = ["rules-0", "rules-1"]
    e2e.start_pods([sharer(n) for n in names])
    e2e.wait("2 users recorded", lambda: sum(len(s["users"]) for s in e2e.agent.status()["shadows"]) == 2, 30)
    (shadow,) = e2e.agent.status()["shadows"]
    (gpu,) = shadow["gpu"]
    index = FAKE_GPU_IDS.index(gpu)
    per_pod = "".join(
        f'DCGM_FI_DEV_FB_USED{{gpu="{index}",UUID="{gpu}",device="nvidia{index}",namespace="default",pod="{n}"}} 512\n'
        for n in names
    )
    e2e.exporter.text = _dcgm({gpu: 60.0}, {gpu: 2048}) + per_pod

    records = sorted({r["record"] for r in rules if "record" in r})
    assert records

    def recorded() -> bool:
        return all(prometheus.query(f'{name}{{namespace="default"}}') for name in records)

    prometheus.wait("every recording rule has series", recorded, 90)
    for sample in prometheus.query('gpushare:gpu_user_device_utilization:percent{namespace="default"}'):
        assert sample.labels["job"] == AGENT_JOB and sample.value == 60.0
    assert _by_pod(prometheus.query('gpushare:gpu_user_process_memory_used:bytes{namespace="default"}')) == {
        f"default/{n}": 512.0 * MIB for n in names
    }

    def all_evaluated() -> bool:
        return all(r["health"] == "ok" for r in prometheus.rules())

    prometheus.wait("every rule evaluated", all_evaluated, 30)
    loaded = prometheus.rules()
    assert len(loaded) == len(rules) and all(not r.get("lastError") for r in loaded)
    assert _active(prometheus, "GpushareAgentDown") == _active(prometheus, "GpushareAgentsAbsent") == []

    serving = dict(prometheus.targets)
    exporter = {EXPORTER_JOB: serving[EXPORTER_JOB]}
    dead = f"127.0.0.1:{free_port()}"

    def down_seen() -> bool:
        return [(a["job"], a["instance"]) for a in _active(prometheus, "GpushareAgentDown")] == [(AGENT_JOB, dead)]

    def absent_seen() -> bool:
        wanted = {"alertname": "GpushareAgentsAbsent", "job": AGENT_JOB, "severity": "warning"}
        return _active(prometheus, "GpushareAgentsAbsent") == [wanted]

    try:
        # The agent's target answers nothing: up is 0 under the job, which GpushareAgentDown sees
        # (pending for its 5 minutes).
        prometheus.reconfigure({AGENT_JOB: [dead], **exporter})
        prometheus.wait("GpushareAgentDown active for the dead target", down_seen, 60)
        # The job has no target at all (a monitor that selects nothing): up is absent, which only
        # GpushareAgentsAbsent can see (pending for its 10 minutes; promtool's test has it fire).
        prometheus.reconfigure({AGENT_JOB: [], **exporter})
        prometheus.wait("GpushareAgentsAbsent active", absent_seen, 60)
        assert _active(prometheus, "GpushareAgentDown") == []  # no target, so no up == 0
    finally:
        prometheus.reconfigure(serving)
    prometheus.wait("both targets up", lambda: set(prometheus.targets_up().values()) == {"up"}, 60)
    prometheus.wait("GpushareAgentsAbsent resolved", lambda: not _active(prometheus, "GpushareAgentsAbsent"), 30)
