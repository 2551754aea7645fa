"""The doctor's verdict per NVIDIA mode (the NVIDIA tier checks each against a measurement)."""

from __future__ import annotations

import pytest

from cli.doctor.nvidia_modes import CDI_STRATEGIES, RUNTIME_MODES, STRATEGIES, nvidia_verdict


@pytest.mark.parametrize("major", [1, 2])
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("runtime", RUNTIME_MODES)
def test_only_plain_runc_without_cdi_gives_no_gpu(runtime: str, strategy: str, major: int) -> None:
    verdict = nvidia_verdict(strategy, runtime, major)
    broken = runtime == "native-cdi" and strategy not in CDI_STRATEGIES
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
