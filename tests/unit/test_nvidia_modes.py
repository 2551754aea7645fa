"""The doctor's verdict per NVIDIA mode (the NVIDIA tier checks each against a measurement)."""

from __future__ import annotations

import pytest

from cli.doctor.diagnosis import Check, ContainerdFact, NvidiaPluginFact, Status, check_nvidia
from cli.doctor.nvidia_modes import (
    CDI_STRATEGIES,
    RUNTIME_MODES,
    STRATEGIES,
    nvidia_verdict,
    runtime_mode_of,
    strategy_of_answer,
)


@pytest.mark.parametrize("major", [1, 2])
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("runtime", RUNTIME_MODES)
def test_only_plain_runc_without_cdi_or_the_variable_under_the_hardened_mode_gives_no_gpu(
    runtime: str, strategy: str, major: int
) -> None:
    verdict = nvidia_verdict(strategy, runtime, major)
    broken = (runtime == "native-cdi" and strategy not in CDI_STRATEGIES) or (
        runtime == "runtime-cdi-hardened" and strategy == "envvar"
    )
    assert verdict.exclusive is not broken
    assert verdict.works is not broken
    assert bool(verdict.fix) is broken  # a fix is named exactly where it does not work
    assert ("rw where the exclusive pod's are rwm" in verdict.note) is (strategy in CDI_STRATEGIES and major == 1)


def test_the_legacy_mode_is_unmeasured_not_claimed() -> None:
    verdict = nvidia_verdict("envvar", "runtime-legacy", 2)
    assert verdict.same is None and "not measured" in verdict.note


@pytest.mark.parametrize(("strategy", "runtime"), [("mig", "native-cdi"), ("envvar", "kata")])
def test_unknown_modes_are_named(strategy: str, runtime: str) -> None:
    with pytest.raises(ValueError, match="unknown"):
        nvidia_verdict(strategy, runtime, 2)


DIRS = ("/var/run/nvidia-container-devices",)


@pytest.mark.parametrize(
    ("answer", "strategy"),
    [
        (({"NVIDIA_VISIBLE_DEVICES": "GPU-1"}, [], [], []), "envvar"),
        (({"NVIDIA_VISIBLE_DEVICES": DIRS[0]}, [f"{DIRS[0]}/GPU-1"], [], []), "volume-mounts"),
        (({}, [], ["cdi.k8s.io/nvidia-device-plugin_x"], []), "cdi-annotations"),
        (({}, [], [], ["k8s.device-plugin.nvidia.com/gpu=GPU-1"]), "cdi-cri"),
        (({"FAKE_VISIBLE_DEVICES": "0"}, [], [], []), None),
    ],
)
def test_the_strategy_is_read_from_the_answer(answer: tuple, strategy: str | None) -> None:  # type: ignore[type-arg]
    assert strategy_of_answer(*answer, DIRS) == strategy


@pytest.mark.parametrize(
    ("binary", "mode", "runtime"),
    [
        ("/usr/bin/runc", None, "native-cdi"),
        ("/usr/local/nvidia/toolkit/nvidia-container-runtime", "cdi", "runtime-cdi"),
        ("/usr/bin/nvidia-container-runtime", "jit-cdi", "runtime-jit-cdi"),
        ("/usr/bin/nvidia-container-runtime", None, "runtime-legacy"),  # auto: unmeasured here
        ("/usr/bin/nvidia-container-runtime.cdi", "legacy", "runtime-cdi"),  # the name fixes the mode
        ("/usr/bin/nvidia-container-runtime.legacy", "cdi", "runtime-legacy"),
    ],
)
def test_the_runtime_mode_is_read_from_the_handler(binary: str, mode: str | None, runtime: str) -> None:
    assert runtime_mode_of(binary, mode) == runtime


def _check(strategy: str, binary: str, mode: str | None, version: str) -> Check:
    containerd = ContainerdFact(version=version, runtime_binary=binary, nvidia_runtime_mode=mode)
    return check_nvidia(NvidiaPluginFact("/var/lib/kubelet/device-plugins/nvidia-gpu.sock", strategy), containerd)


def test_the_doctor_fails_a_mode_where_no_one_gets_a_gpu_and_names_the_fix() -> None:
    check = _check("envvar", "", None, "2.4.2")
    assert check.status is Status.FAIL
    assert "strategy envvar, native-cdi, containerd 2.4.2" in check.summary
    assert "--device-list-strategy to cdi-cri" in check.hint


def test_the_doctor_passes_a_measured_mode_and_says_the_1_7_difference() -> None:
    assert _check("cdi-cri", "", None, "2.4.2").status is Status.OK
    old = _check("cdi-cri", "", None, "1.7.24")
    assert old.status is Status.OK and "rw where the exclusive pod's are rwm" in old.summary
    runtime = _check("volume-mounts", "/usr/local/nvidia/toolkit/nvidia-container-runtime", "cdi", "2.4.2")
    assert runtime.status is Status.OK and "runtime-cdi" in runtime.summary


def test_the_doctor_warns_on_what_is_not_measured() -> None:
    assert _check("envvar", "/usr/bin/nvidia-container-runtime", None, "2.4.2").status is Status.WARN
    unknown = check_nvidia(NvidiaPluginFact("/x.sock", None), ContainerdFact(version="2.4.2"))
    assert unknown.status is Status.WARN and "no known strategy" in unknown.summary


def test_the_doctor_warns_where_the_vendor_shares_its_gpus_itself() -> None:
    containerd = ContainerdFact(version="2.4.2")
    check = check_nvidia(NvidiaPluginFact("/x.sock", "cdi-cri", replicas=True), containerd)
    assert check.status is Status.WARN and "spot lends no replica" in check.summary
    assert "sharing off" in check.hint


def test_the_hardened_mode_gives_the_envvar_strategy_no_gpu_and_reads_device_lists() -> None:
    assert runtime_mode_of("/usr/bin/nvidia-container-runtime", "cdi", False) == "runtime-cdi-hardened"
    assert runtime_mode_of("/usr/bin/nvidia-container-runtime", "cdi", True) == "runtime-cdi"
    envvar = nvidia_verdict("envvar", "runtime-cdi-hardened", 2)
    assert not envvar.works and "volume-mounts" in envvar.fix
    assert nvidia_verdict("volume-mounts", "runtime-cdi-hardened", 2).works
