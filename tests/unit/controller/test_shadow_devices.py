"""What a running shadow's container really has, and what that means for its share slots."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from controller.core.mapping import MappingCache
from controller.io.shadow_devices import ShadowDevices, device_nodes
from controller.report import describe_node
from controller.share.solver import unhealthy_shadows
from gpushare.config import Config
from tests.unit.controller.podmaker import NODE, row, shadow, snap

CFG = Config(node_name=NODE)


def test_the_character_devices_of_a_process_root_are_read_under_dev(tmp_path: Path) -> None:
    # A fake /proc whose process 42 has this machine's root: its /dev has /dev/null, a character device.
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "root").symlink_to("/")
    found = device_nodes(42, proc_root=str(tmp_path))
    assert "/dev/null" in found and all(p.startswith("/dev/") for p in found)
    seen = ShadowDevices(proc_root=str(tmp_path))
    seen.note("gpushare-system/s", "c-42", 42)
    seen.note("gpushare-system/gone", "c-7", 7)  # exited before it was read: nothing is known of it
    assert set(seen.observed()) == {"gpushare-system/s"}
    # Only a reading of the container kubelet reports as the shadow's main now counts: a shadow of
    # the same name created again, or its main restarted, is not the one that was read.
    assert set(seen.observed({"gpushare-system/s": "c-42"})) == {"gpushare-system/s"}
    assert seen.observed({"gpushare-system/s": "c-43"}) == {}
    seen.keep_only(set())
    assert seen.observed() == {}
    assert os.path.exists("/dev/null")


def test_before_kubelet_reports_a_container_only_a_reading_of_that_very_pod_counts(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "root").symlink_to("/")
    seen = ShadowDevices(proc_root=str(tmp_path))
    seen.note("gpushare-system/s", "c-42", 42, "uid-1")
    assert set(seen.started({"gpushare-system/s": "uid-1"})) == {"gpushare-system/s"}
    # A shadow of the same name made again (another uid), or a pod whose uid is not known, is not it.
    assert seen.started({"gpushare-system/s": "uid-2"}) == {}
    assert seen.started({"gpushare-system/s": ""}) == {}
    assert seen.started({"gpushare-system/other": "uid-1"}) == {}
    seen.keep_only(set())
    assert seen.started({"gpushare-system/s": "uid-1"}) == {}


def test_a_shadow_counts_as_created_only_for_the_pod_uid_the_nri_plugin_saw() -> None:
    seen = ShadowDevices()
    seen.note_created("gpushare-system/s", "uid-1")
    assert seen.created({"gpushare-system/s": "uid-1", "gpushare-system/t": "uid-9"}) == {"gpushare-system/s"}
    assert seen.created({"gpushare-system/s": "uid-2"}) == frozenset()  # made again under the same name
    assert seen.created({"gpushare-system/s": ""}) == frozenset()
    assert seen.observed() == {}  # created is not started: no device reading yet
    seen.keep_only(set())
    assert seen.created({"gpushare-system/s": "uid-1"}) == frozenset()


def test_a_shadow_whose_container_has_no_gpu_node_cannot_serve_a_sharer() -> None:
    pods = [shadow("s4", 4), shadow("t4", 4), shadow("u4", 4)]
    rows = [
        row("gpushare-system/s4", "main", "nvidia.com/gpu", "GPU-3"),
        row("gpushare-system/t4", "main", "nvidia.com/gpu", "GPU-5"),
        row("gpushare-system/u4", "main", "nvidia.com/gpu", "GPU-6"),
    ]
    s = snap(pods)
    mapping = MappingCache.rebuild(rows, s.pods, CFG.real_resources)
    nodes = {
        "gpushare-system/s4": ("/dev/null", "/dev/nvidiactl"),  # the variable reached plain runc: no GPU node
        "gpushare-system/t4": ("/dev/nvidia5", "/dev/nvidiactl"),
    }  # u4 has not been seen running: nothing is said of it
    sick = unhealthy_shadows(s.shadows, mapping, {}, nodes)
    assert list(sick) == ["gpushare-system/s4"]
    assert "has no NVIDIA GPU device node" in sick["gpushare-system/s4"]
    assert "GPU-3" in sick["gpushare-system/s4"]
    # The report says the same for `gpushare status` and kubectl gpushare.
    shadows, _ = describe_node(dataclasses.replace(s, shadow_device_nodes=nodes), mapping, {}, CFG.real_resources)
    assert {x.pod: bool(x.unhealthy) for x in shadows} == {
        "gpushare-system/s4": True,
        "gpushare-system/t4": False,
        "gpushare-system/u4": False,
    }
