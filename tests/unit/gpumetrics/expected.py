"""The exporter pages in ``tests/fixtures/metrics/`` and what each must normalise to, exactly.

The pages are hand-made, not captures: each follows one exporter's documented names, labels
and units, and each file's header says which exporter and setup it imitates.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import Result
from typer.testing import CliRunner

from gpumetrics import Workload

REPO_ROOT = Path(__file__).resolve().parents[3]
FIXTURES = REPO_ROOT / "tests" / "fixtures" / "metrics"
MIB = 1024 * 1024


def fixtures_dir() -> Path:
    if not (FIXTURES / "nvidia.prom").is_file():
        pytest.fail(
            f"metrics fixtures not found at {FIXTURES}: they are part of the repository (tests/fixtures/metrics)"
        )
    return FIXTURES


def fixture_text(name: str) -> str:
    return (fixtures_dir() / name).read_text()


def invoke_cli(args: Sequence[str], input: str | None = None) -> Result:
    """Run the real ``gpushare`` app; restore root logging, which its callback reconfigures."""
    from cli.main import app  # noqa: PLC0415 (only the CLI tests need the whole app)

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        return CliRunner().invoke(app, list(args), input=input)
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


@dataclass(frozen=True)
class Expect:
    device_id: str
    index: int | None
    utilization_pct: float | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    power_watts: float | None
    workloads: tuple[Workload, ...] = ()
    sub_device: str | None = None


NV0 = "GPU-0a1b2c3d-0000-1111-2222-333344445555"
NV1 = "GPU-9f8e7d6c-aaaa-bbbb-cccc-ddddeeeeffff"
MIG = "GPU-77aa88bb-1234-5678-9abc-def012345678"

# file -> (vendor, devices in output order)
EXPECTED: dict[str, tuple[str, tuple[Expect, ...]]] = {
    "nvidia.prom": (
        "nvidia",
        (
            Expect(
                NV0, 0, 87.0, 76_336_332_800, 85_518_712_832, 612.457, (Workload("team-ml", "llm-train-0", "trainer"),)
            ),
            Expect(NV1, 1, 0.0, 1_048_576, 85_520_809_984, 71.032),
        ),
    ),
    "nvidia-mig.prom": (
        "nvidia",
        (
            Expect(
                f"{MIG}:mig1",
                0,
                31.5,
                21_474_836_480,
                42_245_029_888,
                142.88,
                (Workload("inference", "embed-api-5d9c7", "serve"),),
                "mig1",
            ),
            Expect(f"{MIG}:mig2", 0, 0.0, 13_631_488, 42_245_029_888, 142.88, (), "mig2"),
        ),
    ),
    "amd.prom": (
        "amd",
        (
            Expect(
                "a1ff74a1-0000-1000-8011-223344556677",
                0,
                64.0,
                158_913_789_952,
                206_141_652_992,
                598.0,
                (Workload("research", "bert-finetune-7f6d9", "pytorch"),),
            ),
            Expect("b2ff74a1-0000-1000-8022-334455667788", 1, 0.0, 293_601_280, 206_141_652_992, 141.0),
        ),
    ),
    "amd-prefixed-partitioned.prom": (
        "amd",
        (
            Expect(
                "c3ff74a1-0000-0000-80aa-000000000001:part0", 0, 0.0, 67_108_864, 25_769_803_776, 168.0, (), "part0"
            ),
            Expect(
                "c3ff74a1-0000-0000-80aa-000000000002:part1", 1, None, 60_817_408, 25_769_803_776, None, (), "part1"
            ),
        ),
    ),
    "hygon.prom": (
        "hygon",
        (
            Expect(
                "PAK1520120050301",
                0,
                73.0,
                51_539_607_552,
                68_702_699_520,
                286.51,
                (Workload("ai-lab", "qwen-infer-6b8c9", "vllm"),),
            ),
            Expect("PAK1520120050477", 1, 0.0, 0, 68_702_699_520, 61.2),
            # The vDCU on DCU 1 is its own record; its total comes from the vdcu_memory_cap label.
            Expect(
                "PAK1520120050477:vdcu4",
                1,
                0.0,
                2_147_483_648,
                17_179_869_184,
                None,
                (Workload("ai-lab", "notebook-0", "jupyter"),),
                "vdcu4",
            ),
        ),
    ),
    "ascend.prom": (
        "ascend",
        (
            Expect(
                "E1A2B3C4-11223344-55667788-99AABBCC-00112233",
                0,
                96.0,
                61_573_431_296,
                68_719_476_736,
                318.6,
                (Workload("nlp", "glm-train-worker-0", "ascend"),),
            ),
            Expect("E1A2B3C4-22334455-66778899-AABBCCDD-11223344", 1, 0.0, 3_554_672_640, 68_719_476_736, 92.4),
        ),
    ),
    "ascend-310p.prom": (
        "ascend",
        (
            Expect("F0F1F2F3-AAAA0001-BBBB0001-CCCC0001-DDDD0001", 0, 0.0, 1_470_103_552, 22_572_695_552, 14.5),
            Expect("F0F1F2F3-AAAA0002-BBBB0002-CCCC0002-DDDD0002", 1, None, 1_465_909_248, 22_572_695_552, 14.1),
        ),
    ),
    "enflame.prom": (
        "enflame",
        (
            Expect(
                "GCU-T6P0A2400310",
                0,
                57.0,
                32_212_254_720,
                51_539_607_552,
                212.0,
                (Workload("vision", "ocr-batch-0", "worker"),),
            ),
            Expect("GCU-T6P0A2400378", 1, 0.0, 419_430_400, 51_539_607_552, 66.0),
        ),
    ),
    "cambricon.prom": (
        "cambricon",
        (
            Expect(
                "MLU-30a1b2c3-d4e5-f6a7-b8c9-0d1e2f3a4b5c",
                0,
                91.0,
                30_064_771_072,
                51_539_607_552,
                205.0,
                (Workload("speech", "asr-server-77f9c", "infer"),),
            ),
            Expect("MLU-41b2c3d4-e5f6-a7b8-c9d0-1e2f3a4b5c6d", 1, 0.0, 524_288_000, 51_539_607_552, 38.0),
        ),
    ),
    "iluvatar.prom": (
        "iluvatar",
        (
            Expect(
                "GPU-5e6f7a8b-1c2d-5e3f-9a0b-1c2d3e4f5a6b",
                0,
                78.0,
                25_764_560_896,
                34_359_738_368,
                187.0,
                (Workload("cv", "yolo-train-2", "main"),),
            ),
            Expect("GPU-6f7a8b9c-2d3e-5f4a-8b1c-2d3e4f5a6b7c", 1, 0.0, 121_634_816, 34_359_738_368, 21.0),
        ),
    ),
    "metax.prom": (
        "metax",
        (
            Expect(
                "GPU-c5a1e0f2-7b3d-4e21-9f00-6a5b4c3d2e10",
                0,
                66.0,
                42_949_672_960,
                68_719_476_736,
                287.0,
                (Workload("rec", "ranker-online-0", "ranker"),),
            ),
            Expect("GPU-c5a1e0f2-7b3d-4e21-9f00-6a5b4c3d2e11", 1, 0.0, 536_870_912, 68_719_476_736, 68.5),
        ),
    ),
    "mthreads.prom": (
        "mthreads",
        (
            Expect("4e7b2c11-90aa-4d3e-8c55-0f1e2d3c4b5a", 0, 35.0, 24_696_061_952, 51_539_607_552, 241.0),
            Expect("4e7b2c11-90aa-4d3e-8c55-0f1e2d3c4b5b", 1, 0.0, 0, 51_539_607_552, 58.0),
        ),
    ),
    "kunlunxin.prom": (
        "kunlunxin",
        (
            # No uuid and no node label: "<vendor>:<index>".
            Expect("kunlunxin:0", 0, 52.0, 64_424_509_440, 103_079_215_104, 231.0),
            Expect("kunlunxin:1", 1, 0.0, 104_857_600, 103_079_215_104, 86.0),
        ),
    ),
}
