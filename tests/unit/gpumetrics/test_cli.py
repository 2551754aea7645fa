"""`gpushare metrics parse/scrape/vendors` through the real CLI app (typer's runner, no subprocess)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.unit.gpumetrics.expected import EXPECTED, fixtures_dir, invoke_cli


def test_parse_prints_the_json_model_for_every_fixture() -> None:
    files = [str(fixtures_dir() / name) for name in sorted(EXPECTED)]
    result = invoke_cli(["metrics", "parse", *files, "-o", "json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert len(doc) == sum(len(devices) for _, devices in EXPECTED.values())
    by_id = {d["device_id"]: d for d in doc}
    assert by_id["GPU-0a1b2c3d-0000-1111-2222-333344445555"] == {
        "vendor": "nvidia",
        "index": 0,
        "device_id": "GPU-0a1b2c3d-0000-1111-2222-333344445555",
        "uuid": "GPU-0a1b2c3d-0000-1111-2222-333344445555",
        "utilization_pct": 87.0,
        "memory_used_bytes": 76336332800,
        "memory_total_bytes": 85518712832,
        "power_w": 612.457,
        "pods": [{"namespace": "team-ml", "pod": "llm-train-0", "container": "trainer"}],
    }
    # Unknowns are null, not 0.
    part1 = by_id["c3ff74a1-0000-0000-80aa-000000000002:part1"]
    assert part1["utilization_pct"] is None and part1["power_w"] is None
    assert by_id["kunlunxin:0"]["uuid"] is None


def test_parse_table() -> None:
    result = invoke_cli(["metrics", "parse", str(fixtures_dir() / "amd-prefixed-partitioned.prom"), "-o", "table"])
    assert result.exit_code == 0, result.output
    header, first, second = result.stdout.strip().splitlines()
    assert header.split() == ["VENDOR", "IDX", "DEVICE_ID", "UTIL%", "MEM_USED", "MEM_TOTAL", "POWER_W", "PODS"]
    assert first.split() == [
        "amd",
        "0",
        "c3ff74a1-0000-0000-80aa-000000000001:part0",
        "0",
        "64MiB",
        "24.0GiB",
        "168",
        "-",
    ]
    assert second.split()[3] == "-" and second.split()[6] == "-"


def test_parse_reports_bad_lines_on_stderr_and_still_succeeds(tmp_path: Path) -> None:
    scrape = tmp_path / "dcgm.prom"
    scrape.write_text(
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-1"} 3\nDCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-1"} ERROR - FAILED\n'
    )
    result = invoke_cli(["metrics", "parse", str(scrape)])
    assert result.exit_code == 0
    assert "1 bad line(s) skipped" in result.stderr and "line 2" in result.stderr
    assert json.loads(result.stdout)[0]["utilization_pct"] == 3.0


def test_vendor_override_and_prefix(tmp_path: Path) -> None:
    scrape = tmp_path / "mlu.prom"
    scrape.write_text('cam_utilization{mlu="0",uuid="MLU-0"} 12\n')
    auto = invoke_cli(["metrics", "parse", str(scrape)])
    assert auto.exit_code == 1 and "no known GPU exporter" in auto.stderr
    assert json.loads(auto.stdout) == []
    forced = invoke_cli(["metrics", "parse", str(scrape), "--vendor", "cambricon", "--prefix", "cam"])
    assert forced.exit_code == 0, forced.output
    assert json.loads(forced.stdout)[0]["utilization_pct"] == 12.0


def test_unknown_vendor_missing_file_and_biren_exit_1_with_a_message(tmp_path: Path) -> None:
    nvidia = str(fixtures_dir() / "nvidia.prom")
    unknown = invoke_cli(["metrics", "parse", nvidia, "--vendor", "acme"])
    assert unknown.exit_code == 1 and "unknown GPU vendor 'acme'" in unknown.stderr
    missing = invoke_cli(["metrics", "parse", str(tmp_path / "nope.prom")])
    assert missing.exit_code == 1 and "no such file" in missing.stderr
    biren = invoke_cli(["metrics", "parse", nvidia, "--vendor", "biren"])
    assert biren.exit_code == 1 and "no known Prometheus exporter" in biren.stderr


def test_parse_reads_stdin() -> None:
    result = invoke_cli(["metrics", "parse", "-"], input='ix_gpu_utilization{gpu="0",uuid="G"} 9\n')
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)[0]["vendor"] == "iluvatar"


def test_scrape_refuses_a_bad_timeout() -> None:
    result = invoke_cli(["metrics", "scrape", "http://127.0.0.1:1/metrics", "--timeout", "soon"])
    assert result.exit_code == 1 and "--timeout" in result.stderr


def test_vendors_lists_every_adapter_and_biren_has_no_exporter() -> None:
    result = invoke_cli(["metrics", "vendors"])
    assert result.exit_code == 0
    lines = {line.split()[0]: line for line in result.stdout.splitlines()}
    assert set(lines) == {
        "nvidia",
        "amd",
        "hygon",
        "ascend",
        "enflame",
        "cambricon",
        "iluvatar",
        "metax",
        "mthreads",
        "kunlunxin",
        "biren",
    }
    assert "no known exporter" in lines["biren"]
