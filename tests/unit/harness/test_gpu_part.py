"""The GPU-part instrument on hand-written OCI specs: what it keeps, what it normalises, how it diffs.

The nvidia tier's gap assertions are only as good as this: a part that dropped a mount or kept a
container ID would make two different containers look alike, or two alike look different.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.harness.gpu_part import (
    Device,
    DeviceRule,
    GpuPart,
    Hook,
    bundle_spec_path,
    diff,
    gpu_part,
    read_bundle_part,
)

ROOT = "/tmp/fake-root"
HOOK = "/opt/tk/nvidia-cdi-hook"


def spec(container_id: str = "c1", *, libs: bool = True, hooks_order: tuple[str, ...] = ("a", "b")) -> dict[str, Any]:
    mounts: list[dict[str, Any]] = [
        {"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid"]},
        {"destination": "/dev/shm", "type": "bind", "source": f"/var/lib/sandboxes/{container_id}/shm"},
        {
            "destination": "/var/run/nvidia-container-devices/GPU-1",
            "type": "bind",
            "source": "/dev/null",
            "options": ["rprivate", "rbind"],
        },
    ]
    if libs:
        mounts.append(
            {
                "destination": "/usr/lib/libcuda.so.1",
                "type": "bind",
                "source": f"{ROOT}/usr/lib/libcuda.so.1",
                "options": ["ro", "bind"],
            }
        )
    return {
        "process": {
            "env": [
                "PATH=/bin",
                "NVIDIA_VISIBLE_DEVICES=void",
                "CUDA_VERSION=12.8",
                "NVIDIA_REQUIRE_CUDA=cuda>=12.0",
                "NVIDIAX=1",
            ]
        },
        "mounts": mounts,
        "linux": {
            "devices": [{"path": "/dev/nvidia3", "type": "c", "major": 195, "minor": 3, "fileMode": 438}],
            "resources": {
                "devices": [
                    {"allow": False, "access": "rwm"},
                    {"allow": True, "type": "c", "major": 195, "minor": 3, "access": "rwm"},
                    {"allow": True, "type": "c", "major": 195, "access": "rw"},
                ]
            },
        },
        "hooks": {
            "createContainer": [
                {"path": HOOK, "args": ["nvidia-cdi-hook", name, "--bundle", f"/run/bundles/{container_id}"]}
                for name in hooks_order
            ],
            "createRuntime": [{"path": HOOK, "args": ["nvidia-cdi-hook", "limits", "--id", container_id]}],
        },
    }


def part(container_id: str = "c1", **kwargs: Any) -> GpuPart:
    placeholders = {f"/run/bundles/{container_id}": "<bundle>", container_id: "<container-id>", ROOT: "<root>"}
    return gpu_part(spec(container_id, **kwargs), driver_root=ROOT, placeholders=placeholders)


def test_the_part_keeps_devices_allow_rules_driver_and_device_list_mounts_gpu_env_and_hooks() -> None:
    got = part()
    assert got.devices == (Device("/dev/nvidia3", "c", 195, 3),)
    # The deny-all rule every container has is not the GPU's; a missing minor is the wildcard.
    assert got.device_rules == (DeviceRule("c", 195, None, "rw"), DeviceRule("c", 195, 3, "rwm"))
    assert got.mount_destinations() == ["/usr/lib/libcuda.so.1", "/var/run/nvidia-container-devices/GPU-1"]
    assert got.mounts[0].source == "<root>/usr/lib/libcuda.so.1" and got.mounts[0].options == ("bind", "ro")
    # NVIDIA_ and CUDA_ only (not NVIDIAX), each value whole, "=" and all.
    assert got.env == (
        ("CUDA_VERSION", "12.8"),
        ("NVIDIA_REQUIRE_CUDA", "cuda>=12.0"),
        ("NVIDIA_VISIBLE_DEVICES", "void"),
    )
    # Stages in runc's order, each in the spec's order; IDs and bundle paths are placeholders.
    assert got.hooks == (
        Hook("createRuntime", HOOK, ("nvidia-cdi-hook", "limits", "--id", "<container-id>")),
        Hook("createContainer", HOOK, ("nvidia-cdi-hook", "a", "--bundle", "<bundle>")),
        Hook("createContainer", HOOK, ("nvidia-cdi-hook", "b", "--bundle", "<bundle>")),
    )
    assert got.hook_commands() == ["createRuntime limits", "createContainer a", "createContainer b"]


def test_two_containers_that_differ_only_by_id_and_bundle_compare_equal() -> None:
    assert part("c1") == part("c2")
    assert diff(part("c1"), part("c2")) == []


def test_a_driver_root_sibling_is_not_under_the_root() -> None:
    # /tmp/fake-root-2 starts with the root's text but is another directory.
    s = spec()
    s["mounts"].append({"destination": "/x", "type": "bind", "source": f"{ROOT}-2/x"})
    assert "/x" not in gpu_part(s, driver_root=ROOT).mount_destinations()


def test_the_diff_names_what_is_missing_extra_changed_and_reordered() -> None:
    want = part()
    got = part(libs=False, hooks_order=("b", "a"))
    env = dict(got.env)
    env["NVIDIA_VISIBLE_DEVICES"] = "GPU-1"
    env["NVIDIA_DRIVER_CAPABILITIES"] = "all"
    got = GpuPart(got.devices, got.device_rules[1:], got.mounts, tuple(sorted(env.items())), got.hooks)
    assert diff(want, got) == [
        "- rule allow c 195:* rw",
        "- mount /usr/lib/libcuda.so.1 <- <root>/usr/lib/libcuda.so.1 (bind,ro)",
        "+ env NVIDIA_DRIVER_CAPABILITIES=all",
        "~ env NVIDIA_VISIBLE_DEVICES=GPU-1 (expected void)",
        "~ hooks createContainer: the same hooks in another order",
    ]
    assert diff(want, GpuPart(hooks=want.hooks[:1])) == [
        "- device /dev/nvidia3 (c 195:3)",
        "- rule allow c 195:* rw",
        "- rule allow c 195:3 rwm",
        "- mount /usr/lib/libcuda.so.1 <- <root>/usr/lib/libcuda.so.1 (bind,ro)",
        "- mount /var/run/nvidia-container-devices/GPU-1 <- /dev/null (rbind,rprivate)",
        "- env CUDA_VERSION=12.8",
        "- env NVIDIA_REQUIRE_CUDA=cuda>=12.0",
        "- env NVIDIA_VISIBLE_DEVICES=void",
        "- hook createContainer: /opt/tk/nvidia-cdi-hook a --bundle <bundle>",
        "- hook createContainer: /opt/tk/nvidia-cdi-hook b --bundle <bundle>",
    ]


def test_a_hook_twice_is_not_the_same_as_once() -> None:
    once = part(hooks_order=("a",))
    twice = part(hooks_order=("a", "a"))
    assert diff(once, twice) == ["+ hook createContainer: /opt/tk/nvidia-cdi-hook a --bundle <bundle>"]


def test_a_plain_container_has_an_empty_part() -> None:
    plain = {"process": {"env": ["PATH=/bin"]}, "mounts": [{"destination": "/proc", "source": "proc"}], "linux": {}}
    assert gpu_part(plain, driver_root=ROOT).is_empty()
    assert gpu_part(plain, driver_root=ROOT).lines() == ["(nothing)"]


def test_the_bundle_is_read_where_the_runc_shim_keeps_it(tmp_path: Path) -> None:
    path = bundle_spec_path(tmp_path, "c7")
    assert path == tmp_path / "io.containerd.runtime.v2.task" / "k8s.io" / "c7" / "config.json"
    path.parent.mkdir(parents=True)
    s = spec("c7")
    s["hooks"]["poststop"] = [{"path": f"{path.parent}/cleanup", "args": ["cleanup", "c7"]}]
    path.write_text(json.dumps(s))
    got = read_bundle_part(tmp_path, "c7", driver_root=ROOT, aliases={ROOT: "<root>"})
    assert got.hooks[-1] == Hook("poststop", "<bundle>/cleanup", ("cleanup", "<container-id>"))
    assert got.mounts[0].source == "<root>/usr/lib/libcuda.so.1"
