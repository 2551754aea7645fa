"""How each mode asks for a trace task's GPU, and which scheduler configuration each profile is."""

from __future__ import annotations

import pytest

from bench.replay.modes import (
    CLASS_EXACT,
    CLASS_WHOLE,
    Mode,
    claim_manifest,
    pod_manifest,
    share_spec,
)
from bench.replay.scheduler import scheduler_settings
from bench.replay.trace import TracePod
from localcluster.component_config import scheduler_config_doc
from localcluster.layout import Layout

SPECS = (2, 3, 4, 5)
VENDOR = "example.com/gpu"


@pytest.mark.parametrize(
    ("milli", "n"),
    [(1, 5), (200, 5), (201, 4), (230, 4), (250, 4), (320, 3), (333, 3), (334, 2), (470, 2), (500, 2), (501, None),
     (810, None)],
)  # fmt: skip
def test_a_task_takes_the_finest_offered_share_that_holds_it(milli: int, n: int | None) -> None:
    assert share_spec(milli, SPECS) == n


def _limits_and_claims(mode: Mode, task: TracePod) -> tuple[dict[str, str], list[str]]:
    pod = pod_manifest(mode, 7, task, specs=SPECS, vendor_resource=VENDOR, node_selector={"sim": "true"}, image="i")
    container = pod["spec"]["containers"][0]
    templates = [c["resourceClaimName"] for c in pod["spec"].get("resourceClaims", [])]
    claim = claim_manifest(mode, 7, task, SPECS)
    assert templates == ([claim["metadata"]["name"]] if claim else [])
    assert pod["metadata"]["name"] == "task-00007"
    assert pod["spec"]["nodeSelector"] == {"sim": "true"}
    assert container["resources"]["requests"] == {"cpu": f"{task.cpu_milli}m", "memory": f"{task.memory_mib}Mi"}
    return container["resources"].get("limits", {}), templates


SHARER = TracePod("s", 6000, 12288, 1, 470)
BIG_SHARER = TracePod("b", 8000, 16384, 1, 810)
EIGHT = TracePod("e", 64000, 262144, 8, 1000)
CPU = TracePod("c", 4000, 8192, 0, 0)


@pytest.mark.parametrize(
    ("mode", "task", "limits", "templates"),
    [
        (Mode.EXCLUSIVE, SHARER, {VENDOR: "1"}, []),
        (Mode.EXCLUSIVE, EIGHT, {VENDOR: "8"}, []),
        (Mode.SHARE, SHARER, {"gpushare/share-gpu-2": "1"}, []),
        (Mode.SHARE, BIG_SHARER, {VENDOR: "1"}, []),
        (Mode.DRA_SHARE, SHARER, {"gpushare/share-gpu-2": "1"}, []),
        (Mode.DRA_SHARE, BIG_SHARER, {}, ["task-00007-gpu"]),
        (Mode.DRA_SHARE, EIGHT, {}, ["task-00007-gpu"]),
        (Mode.DRA_EXACT, SHARER, {}, ["task-00007-gpu"]),
        (Mode.DRA_EXACT, BIG_SHARER, {}, ["task-00007-gpu"]),
        (Mode.DRA_EXACT, CPU, {}, []),
    ],
)
def test_each_mode_asks_for_the_gpu_its_way(
    mode: Mode, task: TracePod, limits: dict[str, str], templates: list[str]
) -> None:
    assert _limits_and_claims(mode, task) == (limits, templates)


def test_a_claim_asks_for_the_tasks_own_size_or_its_whole_gpus() -> None:
    def request(mode: Mode, task: TracePod) -> dict[str, object] | None:
        claim = claim_manifest(mode, 3, task, SPECS)
        return None if claim is None else claim["spec"]["devices"]["requests"][0]["exactly"]

    assert request(Mode.DRA_EXACT, BIG_SHARER) == {
        "deviceClassName": CLASS_EXACT,
        "capacity": {"requests": {"milli": "810"}},
    }
    assert request(Mode.DRA_EXACT, EIGHT) == {
        "deviceClassName": CLASS_WHOLE,
        "allocationMode": "ExactCount",
        "count": 8,
    }
    assert request(Mode.DRA_SHARE, BIG_SHARER) == {"deviceClassName": CLASS_WHOLE}
    assert request(Mode.DRA_SHARE, SHARER) is None  # the scheduler makes the claim of an extended resource
    assert request(Mode.DRA_EXACT, CPU) is None
    assert request(Mode.SHARE, EIGHT) is None


def test_the_packing_profiles_score_every_node_and_default_is_kubes_own(tmp_path: object) -> None:
    binpack = scheduler_settings("binpack", vendor_resource=VENDOR, share_specs=SPECS)
    assert binpack["percentageOfNodesToScore"] == 100
    (fit,) = binpack["profiles"][0]["pluginConfig"]
    strategy = fit["args"]["scoringStrategy"]
    assert (fit["name"], strategy["type"]) == ("NodeResourcesFit", "MostAllocated")
    assert {r["name"] for r in strategy["resources"]} == {
        "cpu",
        "memory",
        VENDOR,
        *(f"gpushare/share-gpu-{n}" for n in SPECS),
    }
    gpu_only = scheduler_settings("gpu-binpack", vendor_resource=VENDOR, share_specs=SPECS)
    (fit,) = gpu_only["profiles"][0]["pluginConfig"]
    assert gpu_only["percentageOfNodesToScore"] == 100
    assert [r["name"] for r in fit["args"]["scoringStrategy"]["resources"]] == [
        VENDOR,
        *(f"gpushare/share-gpu-{n}" for n in SPECS),
    ]
    default = scheduler_settings("default", vendor_resource=VENDOR, share_specs=SPECS)
    assert set(default) == {"clientConnection"}
    with pytest.raises(ValueError, match="unknown scheduler profile 'tight'"):
        scheduler_settings("tight", vendor_resource=VENDOR, share_specs=SPECS)
    from pathlib import Path  # noqa: PLC0415

    doc = scheduler_config_doc(Layout(Path("/r")), binpack)
    assert doc["kind"] == "KubeSchedulerConfiguration"
    assert doc["leaderElection"] == {"leaderElect": False}
    assert doc["clientConnection"]["kubeconfig"].endswith("scheduler.kubeconfig")
    assert doc["clientConnection"]["qps"] == 500


def test_gpu_binpack_is_refused_for_the_dra_modes_before_any_cluster_starts(capsys: pytest.CaptureFixture[str]) -> None:
    from bench.trace_replay import family_scheduler, main  # noqa: PLC0415

    assert family_scheduler("gpu-binpack", dra=False)["percentageOfNodesToScore"] == 100
    with pytest.raises(ValueError, match="DRA nodes do not carry"):
        family_scheduler("gpu-binpack", dra=True)
    with pytest.raises(SystemExit) as exit_info:
        main(["--modes", "exclusive,dra-exact", "--profile", "gpu-binpack", "--results", "/nonexistent/runs.jsonl"])
    assert exit_info.value.code == 2
    assert "gpu-binpack profile scores GPU extended resources" in capsys.readouterr().err
