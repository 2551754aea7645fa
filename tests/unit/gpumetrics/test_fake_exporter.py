"""gpumetrics.fake_exporter: the CLI's spelling of a fake GPU, and the dcgm-exporter text it writes."""

from __future__ import annotations

import pytest

from gpumetrics.fake_exporter import FakeGpu, parse_fake_gpu, render_dcgm


def test_fake_gpu_spec_parsing_and_bad_input() -> None:
    assert parse_fake_gpu("fakegpu0=0") == FakeGpu("fakegpu0", 0.0)
    assert parse_fake_gpu("g=80@team/dev,spot/j/main") == FakeGpu("g", 80.0, ("team/dev", "spot/j/main"))
    assert parse_fake_gpu("g=unknown").utilization_pct is None
    with pytest.raises(ValueError, match="expected ID=UTIL"):
        parse_fake_gpu("fakegpu0")
    with pytest.raises(ValueError, match="not a number"):
        parse_fake_gpu("g=lots")
    with pytest.raises(ValueError, match=r"within 0\.\.100"):
        parse_fake_gpu("g=101")
    with pytest.raises(ValueError, match="not ns/pod"):
        parse_fake_gpu("g=1@justpod")
    assert 'UUID="g"' in render_dcgm([FakeGpu("g", 1.0)])
