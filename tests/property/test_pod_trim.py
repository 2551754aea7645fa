"""Trimming a pod for the caches changes nothing the agent reads from it (hypothesis).

The hostile tenants' pods of test_hostile_pods.py, beside the well-formed cluster: every pod
reads as the same role, quantity, key, refusal or problem whole and trimmed, and the leader's
reading of the scheduler's word is the same. Only labels and annotations that are not
gpushare's go.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.core.model import Snapshot, build_snapshot
from controller.core.pod_trim import trim_pod
from controller.share.cluster_view import blocked_elsewhere, unschedulable_pods
from gpushare import keys
from gpushare.config import Config
from tests.property.test_hostile_pods import WELL_FORMED, hostile_pod

CFG = Config(node_name="n1", real_resources=("example.com/gpu",))


def _ours(m: Any) -> dict[str, str]:
    return {k: v for k, v in dict(m).items() if k.startswith(keys.DOMAIN + "/")}


def _reading(snap: Snapshot) -> Any:
    """Everything a pass decides from, with labels and annotations down to gpushare's keys."""

    def facts(f: Any) -> Any:
        return f._replace(labels=_ours(f.labels), annotations=_ours(f.annotations))

    return (
        {k: facts(f) for k, f in snap.pods.items()},
        [(s.ref, s.key, dict(s.users)) for s in snap.shadows],
        [(s.ref, s.key, s.quantity, dict(s.owner_shadows)) for s in snap.sharers],
        [s.ref for s in snap.spot_pods],
        [(r.ref, r.why) for r in snap.refused],
        [(p.ref, p.field) for p in snap.pod_problems],
    )


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.integers(1, 4).flatmap(lambda n: st.tuples(*(hostile_pod(i) for i in range(n)))))
def test_a_trimmed_pod_reads_as_the_whole_one(hostile: tuple[Any, ...]) -> None:
    pods = [*WELL_FORMED, *hostile]
    trimmed = [trim_pod(p) for p in pods]
    assert _reading(build_snapshot(trimmed, CFG)) == _reading(build_snapshot(pods, CFG))
    assert unschedulable_pods(trimmed) == unschedulable_pods(pods)
    assert blocked_elsewhere(trimmed) == blocked_elsewhere(pods)


def test_what_goes_is_what_tenants_fill() -> None:
    big = "x" * 100_000
    pod = {
        "metadata": {"name": "p", "namespace": "t", "uid": "u", "resourceVersion": "3",
                     "labels": {"app": big, keys.LABEL_LENDABLE: "true"},
                     "annotations": {"kubectl.kubernetes.io/last-applied-configuration": big}},
        "spec": {"containers": [{"name": "c", "image": "i", "env": [{"name": "E", "value": big}],
                                 "command": [big], "resources": {"limits": {"example.com/gpu": "1"}}}],
                 "volumes": [{"name": "v", "configMap": {"name": big}}]},
        "status": {"phase": "Pending", "conditions": [{"type": "Ready", "status": "False", "message": big},
                                                      {"type": "PodScheduled", "status": "False", "message": "no"}]},
    }  # fmt: skip
    trimmed = trim_pod(pod)
    assert len(repr(trimmed)) < 1_000 < len(repr(pod))
    assert trimmed["metadata"]["labels"] == {keys.LABEL_LENDABLE: "true"}
    assert trimmed["spec"]["containers"] == [{"name": "c", "resources": {"limits": {"example.com/gpu": "1"}}}]
    assert trimmed["status"]["conditions"] == [{"type": "PodScheduled", "status": "False", "message": "no"}]
