"""The node's GPU-part rule follows its CDI spec files as they are written, replaced and broken."""

from __future__ import annotations

from pathlib import Path

import yaml

from nri_plugin.gpu_parts import NodeGpuParts


def _spec(kind: str, mount: str) -> str:
    return yaml.safe_dump(
        {
            "cdiVersion": "0.5.0",
            "kind": kind,
            "containerEdits": {"mounts": [{"hostPath": f"/drv{mount}", "containerPath": mount}]},
            "devices": [{"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}}],
        }
    )


def test_the_rule_is_read_again_when_a_spec_changes_and_a_broken_one_hides_no_other(tmp_path: Path) -> None:
    parts = NodeGpuParts(["NVIDIA_VISIBLE_DEVICES"], [], [str(tmp_path)])
    assert parts.registry.devices == {}
    (tmp_path / "nvidia.yaml").write_text(_spec("nvidia.com/gpu", "/usr/lib/libcuda.so.1"))
    first = parts.rule()
    assert list(first.cdi.devices) == ["nvidia.com/gpu=0"]
    assert parts.rule() is first  # nothing changed: not read again
    (tmp_path / "nvidia.yaml").write_text(_spec("nvidia.com/gpu", "/usr/lib/libnvidia-ml.so.1"))
    (tmp_path / "broken.json").write_text("{")
    second = parts.rule()
    [mount] = second.cdi.devices["nvidia.com/gpu=0"].mounts
    assert mount.destination == "/usr/lib/libnvidia-ml.so.1"
    assert [s.split(":")[0] for s in second.cdi.skipped] == [str(tmp_path / "broken.json")]
