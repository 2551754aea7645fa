"""Our Prometheus text parser: what it accepts, and that a bad line is skipped and counted."""

from __future__ import annotations

import math
import time

import pytest

from gpumetrics.promtext import MAX_BAD_EXAMPLES, Sample, parse_text


def test_plain_labelled_and_timestamped_samples() -> None:
    text = (
        "# HELP up whether up\n"
        "# TYPE up gauge\n"
        "up 1\n"
        "\n"
        'temp{gpu="0",UUID="GPU-a"}   35.686000\n'
        'npu{id="1"} 96 1730000000123\n'
        "big 3.4342961152e+10\n"
    )
    parsed = parse_text(text)
    assert parsed.bad_lines == 0
    assert parsed.samples == (
        Sample("up", {}, 1.0, None),
        Sample("temp", {"gpu": "0", "UUID": "GPU-a"}, 35.686, None),
        Sample("npu", {"id": "1"}, 96.0, 1730000000123),
        Sample("big", {}, 34342961152.0, None),
    )


def test_label_escapes_trailing_comma_spaces_and_braces_in_values() -> None:
    text = 'm{ a = "x\\"y" , b="back\\\\slash",c="line\\nbreak",d="}{",} 2\n'
    (sample,) = parse_text(text).samples
    assert sample.labels == {"a": 'x"y', "b": "back\\slash", "c": "line\nbreak", "d": "}{"}
    assert sample.value == 2.0


def test_special_values_parse_and_stay_special() -> None:
    parsed = parse_text("a NaN\nb +Inf\nc -Inf\nd -1\n")
    values = [s.value for s in parsed.samples]
    assert math.isnan(values[0]) and values[1:] == [math.inf, -math.inf, -1.0]
    assert parsed.bad_lines == 0


def test_crlf_and_surrounding_whitespace() -> None:
    parsed = parse_text('  a{x="1"} 5\r\n\tb 6 \r\n')
    assert [(s.name, s.value) for s in parsed.samples] == [("a", 5.0), ("b", 6.0)]


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ('DCGM_FI_DEV_X{gpu="0"} ERROR - FAILED TO CONVERT TO STRING', "extra fields"),
        ('DCGM_FI_DEV_X{gpu="0"} ERROR', "non-numeric value"),
        ('DCGM_FI_DEV_GPU_UTIL{gpu="0"} ', "no value"),  # a blank DCGM value
        ("justaname", "no value"),
        ("a 1_000", "non-numeric value"),
        ("a 1 12.5", "timestamp is not an integer"),
        ("a 1 2 3", "extra fields"),
        ('a{gpu="0" 1', "unterminated label set"),
        ("a{gpu=0} 1", "malformed label set"),
        ('a{gpu="0",gpu="1"} 1', "repeated label name"),
        ('a{0bad="x"} 1', "malformed label set"),
        ('{gpu="0"} 1', "invalid metric name"),
        ("9lives 1", "invalid metric name"),
        ('a{x="unterminated} 1', "malformed label set"),
    ],
)
def test_a_bad_line_is_skipped_counted_and_quoted(line: str, why: str) -> None:
    parsed = parse_text(f"good 1\n{line}\nalso_good 2\n")
    assert [s.name for s in parsed.samples] == ["good", "also_good"]
    assert parsed.bad_lines == 1
    (example,) = parsed.bad_line_examples
    assert example.startswith("line 2: ")
    assert why in example


def test_bad_line_count_is_exact_and_examples_are_capped() -> None:
    text = "\n".join(["bad value"] * 50 + ["ok 1"])
    parsed = parse_text(text)
    assert parsed.bad_lines == 50
    assert len(parsed.bad_line_examples) == MAX_BAD_EXAMPLES
    assert len(parsed.samples) == 1


def test_a_huge_bad_line_is_quoted_short() -> None:
    parsed = parse_text("x " + "9" * 10_000 + "z\n")
    assert parsed.bad_lines == 1
    assert len(parsed.bad_line_examples[0]) < 250


def test_samples_with_the_same_label_text_share_one_mapping() -> None:
    labels = '{gpu="0",UUID="GPU-a"}'
    a, b = parse_text(f"a{labels} 1\nb{labels} 2\n").samples
    assert a.labels is b.labels


@pytest.mark.parametrize(
    "line",
    [
        'm{a="b"' + " " * 200_000 + "x} 1",  # a bad line ending in a long whitespace run
        "m{" + " " * 200_000 + "} 1",  # a valid, empty, very wide label set
        'm{a="b",' + " " * 200_000 + "} 1",
        "m{" + 'a="b",' * 30_000 + "x} 1",
    ],
)
def test_pathological_lines_cost_linear_time(line: str) -> None:
    # Quadratic backtracking would take minutes here; a hostile exporter must not stall the agent.
    started = time.perf_counter()
    parse_text(line)
    assert time.perf_counter() - started < 2.0
