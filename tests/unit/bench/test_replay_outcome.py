"""A replay's figures and checks, from API objects built here: each check must catch what it names."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.replay.modes import ANNOTATION_GPUS, ANNOTATION_MILLI, LABEL_SEQ, NAMESPACE, Mode
from bench.replay.outcome import RunOutcome, allocation_curve, placements, summarize
from bench.replay.report import estimate, mean_curve, plot, read_runs, rows, table
from gpushare import keys

VENDOR = "example.com/gpu"
NODES = {"sim-0000": 2, "sim-0001": 2}  # 4 GPUs: 4000 milli


def task(seq: int, milli: int, *, gpus: int = 1, node: str = "", limits: dict[str, str] | None = None,
         **extra: Any) -> dict[str, Any]:  # fmt: skip
    pod: dict[str, Any] = {
        "metadata": {
            "name": f"task-{seq:05d}",
            "namespace": NAMESPACE,
            "uid": f"uid-{seq}",
            "labels": {LABEL_SEQ: str(seq)},
            "annotations": {ANNOTATION_MILLI: str(milli), ANNOTATION_GPUS: str(gpus)},
        },
        "spec": {"containers": [{"name": "main", "resources": {"limits": limits or {}}}]},
        "status": {"phase": "Running" if node else "Pending"},
    }
    if node:
        pod["spec"]["nodeName"] = node
    for k, v in extra.items():
        pod[k] = v
    return pod


def test_the_curve_follows_arrival_and_counts_only_placed_tasks() -> None:
    pods = [task(0, 1000, node="sim-0000"), task(1, 500), task(2, 1000, gpus=2, node="sim-0001"), task(3, 500)]
    tasks = placements(reversed(pods))
    assert [t.seq for t in tasks] == [0, 1, 2, 3]
    curve = dict(allocation_curve(tasks, 4000))
    # 1000 of 4000 arrived and placed: 25 %; then 500 more arrive, unplaced; then 2000, placed.
    assert curve[25] == 25.0
    assert curve[37] == 25.0
    assert curve[87] == 75.0
    assert max(curve) == 100  # 4000 of 4000 arrived
    assert curve[100] == 75.0


def _exclusive(pods: list[dict[str, Any]]) -> RunOutcome:
    return summarize(Mode.EXCLUSIVE, seed=1, profile="binpack", nodes=NODES, pods=pods, vendor_resource=VENDOR,
                     seconds=60.0)  # fmt: skip


def test_a_node_giving_more_gpus_than_it_has_is_a_problem() -> None:
    fine = [task(i, 1000, node="sim-0000", limits={VENDOR: "1"}) for i in range(2)]
    assert _exclusive(fine).problems == ()
    assert _exclusive(fine).gpus_in_use == 2
    over = [*fine, task(2, 1000, node="sim-0000", limits={VENDOR: "1"})]
    assert _exclusive(over).problems == ("sim-0000 gives 3 GPUs (whole pods and shadows) and has 2",)


def test_a_pod_refused_at_admission_is_a_problem() -> None:
    refused = task(0, 1000, node="sim-0000", limits={VENDOR: "1"})
    refused["status"] = {"phase": "Failed", "reason": "UnexpectedAdmissionError", "message": "no GPU"}
    outcome = _exclusive([refused])
    assert outcome.problems == ("replay/task-00000 was refused by sim-0000: no GPU",)
    assert outcome.unplaced_gpu_tasks == 1


def _shadow(name: str, node: str, n: int) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "gpushare-system", "labels": {keys.LABEL_SHARE_SPEC: str(n)}},
        "spec": {"nodeName": node},
        "status": {"phase": "Running"},
    }


def _sharer(seq: int, node: str, shadow: str, n: int) -> dict[str, Any]:
    pod = task(seq, 1000 // n, node=node, limits={f"gpushare/share-gpu-{n}": "1"})
    record = {f"gpushare-system/{shadow}": [0]}
    pod["metadata"]["annotations"][keys.ANNOTATION_SHADOW_OWNER] = json.dumps(record)
    return pod


def _shared(pods: list[dict[str, Any]], shadows: list[dict[str, Any]], refused: set[str] | None = None) -> RunOutcome:
    return summarize(Mode.SHARE, seed=1, profile="binpack", nodes=NODES, pods=pods, shadows=shadows,
                     refused=refused or set(), vendor_resource=VENDOR, seconds=1.0)  # fmt: skip


def test_sharers_on_their_shadows_pass_and_each_way_of_going_wrong_is_named() -> None:
    shadows = [_shadow("s2", "sim-0000", 2), _shadow("idle", "sim-0001", 3)]
    good = [_sharer(0, "sim-0000", "s2", 2), _sharer(1, "sim-0000", "s2", 2)]
    outcome = _shared(good, shadows)
    assert outcome.problems == ()
    assert (outcome.gpus_in_use, outcome.idle_shadows) == (1, 1)

    assert _shared([*good, _sharer(2, "sim-0000", "s2", 2)], shadows).problems == (
        "shadow gpushare-system/s2 has 3 sharers, over its 2",
    )
    assert _shared([_sharer(0, "sim-0001", "s2", 2)], shadows).problems == (
        "sharer replay/task-00000 is on sim-0001, its shadow gpushare-system/s2 elsewhere",
    )
    assert _shared([_sharer(0, "sim-0000", "gone", 2)], shadows).problems == (
        "sharer replay/task-00000 is recorded on gpushare-system/gone, which does not exist",
    )
    wrong_n = _sharer(0, "sim-0001", "idle", 2)
    assert _shared([wrong_n], shadows).problems == (
        "sharer replay/task-00000 asks 1/2 of a GPU, its shadow gpushare-system/idle is cut in 3",
    )
    unrecorded = task(0, 500, node="sim-0000", limits={"gpushare/share-gpu-2": "1"})
    assert _shared([unrecorded], shadows).problems == ("sharer replay/task-00000 is recorded on 0 shadows, not 1",)
    assert _shared(good, shadows, {"replay/task-00001"}).problems == (
        "replay/task-00001 was bound where its node had no slot left",
    )


def _claim(name: str, pod_uid: str, results: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": NAMESPACE},
        "status": {
            "allocation": {"devices": {"results": results}},
            "reservedFor": [{"resource": "pods", "uid": pod_uid}],
        },
    }


def _result(node: str, device: str, milli: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"driver": keys.DRA_DRIVER, "pool": node, "device": device, "request": "gpu"}
    if milli is not None:
        out["consumedCapacity"] = {"milli": str(milli)}
    return out


def _claimed(seq: int, milli: int, node: str, claim: str) -> dict[str, Any]:
    status = {"phase": "Running", "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": claim}]}
    return task(seq, milli, node=node, status=status)


def _dra(pods: list[dict[str, Any]], claims: list[dict[str, Any]]) -> RunOutcome:
    return summarize(Mode.DRA_EXACT, seed=1, profile="binpack", nodes=NODES, pods=pods, claims=claims,
                     vendor_resource=VENDOR, seconds=1.0)  # fmt: skip


def test_exact_claims_pack_up_to_a_gpu_and_no_further() -> None:
    pods = [_claimed(0, 810, "sim-0000", "c0"), _claimed(1, 190, "sim-0000", "c1")]
    claims = [
        _claim("c0", "uid-0", [_result("sim-0000", "gpu-0-exact", 810)]),
        _claim("c1", "uid-1", [_result("sim-0000", "gpu-0-exact", 190)]),
    ]
    outcome = _dra(pods, claims)
    assert outcome.problems == ()
    assert outcome.gpus_in_use == 1
    claims[1] = _claim("c1", "uid-1", [_result("sim-0000", "gpu-0-exact", 200)])
    assert _dra(pods, claims).problems == ("gpu-0 of sim-0000 holds 1010 milli: replay/c0, replay/c1",)


def test_a_gpu_holding_slots_and_exact_claims_or_a_device_twice_or_a_claim_elsewhere_is_named() -> None:
    pods = [_claimed(0, 500, "sim-0000", "c0"), _claimed(1, 250, "sim-0000", "c1")]
    mixed = [
        _claim("c0", "uid-0", [_result("sim-0000", "gpu-0-share2-1")]),
        _claim("c1", "uid-1", [_result("sim-0000", "gpu-0-exact", 250)]),
    ]
    assert _dra(pods, mixed).problems == ("gpu-0 of sim-0000 holds exact and slots at once",)
    twice = [
        _claim("c0", "uid-0", [_result("sim-0000", "gpu-1-share4-1")]),
        _claim("c1", "uid-1", [_result("sim-0000", "gpu-1-share4-1")]),
    ]
    assert _dra(pods, twice).problems == ("device gpu-1-share4-1 of sim-0000 is held by replay/c0 and replay/c1",)
    elsewhere = [
        _claim("c0", "uid-0", [_result("sim-0001", "gpu-0")]),
        _claim("c1", "other", [_result("sim-0000", "gpu-1-exact", 250)]),
    ]
    assert _dra(pods, elsewhere).problems == (
        "replay/task-00000 runs on sim-0000, its claim replay/c0 holds GPUs of ['sim-0001']",
        "replay/task-00001's claim replay/c1 is not reserved for it",
    )
    assert _dra([_claimed(0, 500, "sim-0000", "missing")], []).problems == (
        "replay/task-00000 runs on sim-0000 without a claim for its GPU",
    )


def _run(mode: str, seed: int, at130: float, *, profile: str = "binpack") -> RunOutcome:
    curve = tuple((a, min(a, at130)) for a in range(131))
    return RunOutcome(mode, seed, profile, 1213, 6212, 10000, 9000, 130.0, curve, 10, 0, 6000, 0, 300.0)


def test_the_report_pairs_each_mode_with_exclusive_by_seed_and_gives_a_t_interval(tmp_path: Path) -> None:
    assert estimate([1.0, 2.0, 3.0]).low == pytest.approx(2.0 - 4.303 / 3**0.5)
    results = tmp_path / "runs.jsonl"
    runs = [_run("exclusive", s, 80.0 + s) for s in (1, 2, 3)] + [_run("share-gpu", s, 90.0 + 2 * s) for s in (1, 2, 3)]
    # A rerun of a seed replaces the earlier line.
    runs.append(_run("share-gpu", 3, 96.0))
    results.write_text("\n".join(json.dumps(r.as_json()) for r in runs) + "\n")
    found = {r.mode: r for r in rows(read_runs(results))}
    assert found["share-gpu"].seeds == (1, 2, 3)
    assert found["share-gpu"].ratio[130].mean == pytest.approx((92 + 94 + 96) / 3)
    # Saved: (10 + s) points of 6212 GPUs for s = 1, 2, 3.
    assert found["share-gpu"].saved is not None
    assert found["share-gpu"].saved.mean == pytest.approx(12 * 6212 / 100)
    assert found["exclusive"].saved is None
    text = table(list(found.values()))
    assert "| share-gpu | binpack | 1213 | 1,2,3 |" in text and "| FGD | 95.23 | 95.39 |" in text
    assert mean_curve(read_runs(results))[50] == (50, 50.0)
    picture = tmp_path / "plot.png"
    plot(read_runs(results), picture, profile="binpack", nodes=1213)
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="no runs with scheduler profile 'default'"):
        plot(read_runs(results), picture, profile="default", nodes=1213)
    results.write_text("{}\n")
    with pytest.raises(ValueError, match="line 1: not a replay run"):
        read_runs(results)
