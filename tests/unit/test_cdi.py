"""The node's CDI specs read as plain data: names, edits, and the files that are refused and why."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gpushare.cdi import (
    CdiSpecError,
    Hook,
    Mount,
    dirs_signature,
    parse_annotation_value,
    parse_spec,
    read_spec_dirs,
)

SPEC = {
    "cdiVersion": "0.5.0",
    "kind": "nvidia.com/gpu",
    "containerEdits": {
        "env": ["NVIDIA_VISIBLE_DEVICES=void"],
        "deviceNodes": [{"path": "/dev/nvidiactl", "hostPath": "/drv/dev/nvidiactl"}],
        "mounts": [{"hostPath": "/drv/lib/libcuda.so.1", "containerPath": "/lib/libcuda.so.1", "options": ["ro"]}],
        "hooks": [{"hookName": "createContainer", "path": "/bin/nvidia-cdi-hook", "args": ["nvidia-cdi-hook", "x"]}],
    },
    "devices": [
        {"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0", "major": 195, "minor": 0}]}},
        {"name": "GPU-a", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0", "major": 195, "minor": 0}]}},
        {"name": "1", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia1", "major": 195, "minor": 1}]}},
    ],
}


def test_a_device_gets_the_spec_wide_edits_and_its_own() -> None:
    devices = parse_spec(SPEC, "nvidia.yaml")
    assert sorted(devices) == ["nvidia.com/gpu=0", "nvidia.com/gpu=1", "nvidia.com/gpu=GPU-a"]
    edits = devices["nvidia.com/gpu=1"]
    assert [n.path for n in edits.device_nodes] == ["/dev/nvidiactl", "/dev/nvidia1"]
    assert edits.device_nodes[0].host_path == "/drv/dev/nvidiactl"
    assert edits.device_nodes[1].host_path == "/dev/nvidia1"  # hostPath defaults to path
    assert edits.mounts == (Mount("/lib/libcuda.so.1", "/drv/lib/libcuda.so.1", "", ("ro",)),)
    assert edits.hooks == (Hook("createContainer", "/bin/nvidia-cdi-hook", ("nvidia-cdi-hook", "x")),)
    assert edits.env_names == frozenset({"NVIDIA_VISIBLE_DEVICES"})


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"kind": "nvidia"}, "kind 'nvidia' is not 'vendor/class'"),
        ({"devices": []}, "needs at least one device"),
        ({"devices": [{"containerEdits": {}}]}, r"devices\[0\].name is missing"),
        (
            {"containerEdits": {"hooks": [{"hookName": "preStart", "path": "/x"}]}},
            "'preStart' is not an OCI hook stage",
        ),
        ({"containerEdits": {"env": ["NOEQUALS"]}}, "env has an entry without '='"),
        ({"containerEdits": {"mounts": [{"hostPath": "/a"}]}}, r"mounts\[0\].containerPath is missing"),
        ({"containerEdits": {"deviceNodes": [{"path": "/dev/x", "major": "195"}]}}, "major is not an integer"),
    ],
)
def test_a_bad_spec_is_refused_naming_the_problem(change: dict[str, object], needle: str) -> None:
    with pytest.raises(CdiSpecError, match=needle):
        parse_spec({**SPEC, **change}, "bad.yaml")


def test_the_registry_reads_yaml_and_json_skips_bad_files_and_later_dirs_win(tmp_path: Path) -> None:
    etc, run = tmp_path / "etc", tmp_path / "run"
    etc.mkdir()
    run.mkdir()
    (etc / "nvidia.yaml").write_text(yaml.safe_dump(SPEC))
    (etc / "broken.json").write_text("{not json")
    (etc / "notes.txt").write_text("not a spec")
    newer = {**SPEC, "devices": [{"name": "0", "containerEdits": {"env": ["FROM=run"]}}]}
    (run / "nvidia.json").write_text(json.dumps(newer))
    registry = read_spec_dirs([str(etc), str(run), str(tmp_path / "absent")])
    assert sorted(registry.devices) == ["nvidia.com/gpu=0", "nvidia.com/gpu=1", "nvidia.com/gpu=GPU-a"]
    assert "FROM=run" in registry.devices["nvidia.com/gpu=0"].env
    [skipped] = registry.skipped
    assert skipped.startswith(str(etc / "broken.json"))
    assert registry.edits_of(["nvidia.com/gpu=1", "nvidia.com/gpu=0"]) is not None
    assert registry.edits_of(["nvidia.com/gpu=1", "nvidia.com/gpu=7"]) is None


def test_the_signature_changes_when_a_spec_is_written(tmp_path: Path) -> None:
    before = dirs_signature([str(tmp_path)])
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(SPEC))
    after = dirs_signature([str(tmp_path)])
    assert before == () and len(after) == 1
    (tmp_path / "a.yaml").write_text(yaml.safe_dump({**SPEC, "kind": "vendor.com/x"}))
    assert dirs_signature([str(tmp_path)]) != after


def test_annotation_values_list_names() -> None:
    assert parse_annotation_value("nvidia.com/gpu=0, nvidia.com/gpu=1,") == ("nvidia.com/gpu=0", "nvidia.com/gpu=1")
