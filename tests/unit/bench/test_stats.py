"""The benchmarks' shared statistics: nearest-rank percentiles, refusing thin tails, bootstrap intervals."""

from __future__ import annotations

import pytest

from bench.stats import (
    Estimate,
    bootstrap_ci,
    bootstrap_difference_ci,
    estimate_median,
    estimate_median_difference,
    format_percentile,
    median,
    min_samples,
    paired_differences,
    percentile,
    tail_percentile,
)


@pytest.mark.parametrize(
    ("n", "q", "expected"),
    [
        (200, 99, 198.0),  # the 198th of 1..200: two samples above it, not the max
        (200, 50, 100.0),
        (100, 99, 99.0),
        (50, 99, 50.0),  # nearest rank of 50 samples is the max: why p99 needs more samples
        (10, 90, 9.0),
        (10, 0, 1.0),
        (10, 100, 10.0),
        (1, 99, 1.0),
        (100, 7, 7.0),  # 7/100 * 100 in floats is 7.000000000000001; the rank must stay 7
        (1000, 99.9, 999.0),
    ],
)
def test_percentile_is_nearest_rank(n: int, q: float, expected: float) -> None:
    values = [float(v) for v in range(n, 0, -1)]  # unsorted on purpose
    assert percentile(values, q) == expected


def test_percentile_is_always_a_measured_value() -> None:
    values = [1.0, 2.0, 10.0, 11.0]
    for q in range(101):
        assert percentile(values, q) in values


@pytest.mark.parametrize("q", [-1, 100.5])
def test_percentile_rejects_out_of_range(q: float) -> None:
    with pytest.raises(ValueError, match="outside"):
        percentile([1.0], q)


def test_percentile_of_nothing_raises() -> None:
    with pytest.raises(ValueError, match="no samples"):
        percentile([], 50)


@pytest.mark.parametrize(("q", "n"), [(99, 200), (95, 40), (90, 20), (99.9, 2000), (50, 1), (0, 1)])
def test_min_samples_leaves_two_above_the_rank(q: float, n: int) -> None:
    assert min_samples(q) == n


def test_min_samples_has_no_answer_for_the_max() -> None:
    with pytest.raises(ValueError, match="max"):
        min_samples(100)


def test_p99_is_refused_below_200_samples() -> None:
    assert tail_percentile([float(v) for v in range(199)], 99) is None
    assert format_percentile([float(v) for v in range(199)], 99) == "n/a (n<200)"
    assert tail_percentile([float(v) for v in range(1, 201)], 99) == 198.0
    assert format_percentile([float(v) for v in range(1, 201)], 99, ".1f") == "198.0"
    assert format_percentile([float(v) for v in range(1, 201)], 99, ".1f", " ms") == "198.0 ms"
    assert format_percentile([1.0], 99, ".1f", " ms") == "n/a (n<200)"


def test_median_is_the_usual_median() -> None:
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([4.0, 1.0, 2.0, 3.0]) == 2.5
    with pytest.raises(ValueError):
        median([])


def test_paired_differences_keep_pair_order() -> None:
    assert paired_differences([5.0, 7.0], [4.0, 9.0]) == [1.0, -2.0]
    with pytest.raises(ValueError, match="baseline"):
        paired_differences([1.0], [1.0, 2.0])


def test_bootstrap_is_reproducible_and_brackets_the_median() -> None:
    values = [float(v % 17) for v in range(300)]
    low, high = bootstrap_ci(values)
    assert (low, high) == bootstrap_ci(values)  # fixed seed
    assert low <= median(values) <= high
    assert bootstrap_ci(values, seed=1) != (0.0, 0.0)


def test_bootstrap_of_a_constant_is_that_constant() -> None:
    assert bootstrap_ci([2.5] * 40) == (2.5, 2.5)


def test_bootstrap_uses_the_given_statistic() -> None:
    values = [float(v) for v in range(100)]
    low, high = bootstrap_ci(values, max, resamples=200)
    assert high == 99.0
    assert low > 90.0


def test_noise_around_zero_is_not_distinguishable() -> None:
    diffs = [(-1.0) ** i * (i % 5) for i in range(200)]  # symmetric noise, median 0
    est = estimate_median(diffs)
    assert est.spans_zero
    assert est.describe().endswith("not distinguishable from 0")
    assert est.describe().startswith("n=200 pairs, median ")


def test_a_clear_shift_is_distinguishable() -> None:
    diffs = [1.0 + (i % 7) / 10 for i in range(200)]
    est = estimate_median(diffs)
    assert not est.spans_zero
    assert est.low > 0
    assert "distinguishable" not in est.describe()


def test_describe_formats_sign_and_interval() -> None:
    text = Estimate(n=12, median=0.5, low=-0.25, high=1.0).describe()
    assert text == "n=12 pairs, median +0.50 ms, 95 % CI [-0.25, +1.00] ms: not distinguishable from 0"
    assert Estimate(10, 1.0, 0.9, 1.1).describe(unit="s", spec=".1f", what="runs") == (
        "n=10 runs, median 1.0 s, 95 % CI [0.9, 1.1] s"
    )


def test_too_few_samples_print_no_interval() -> None:
    est = estimate_median([1.0, 2.0, 3.0])
    assert not est.has_interval
    assert est.interval() == "n/a (n<10)"
    assert est.describe(unit="s") == "n=3 pairs, median +2.00 s, 95 % CI n/a (n<10)"
    assert estimate_median([float(v) for v in range(10)]).has_interval


def test_difference_of_medians_of_two_samples() -> None:
    slow = [10.0 + (i % 5) for i in range(200)]
    fast = [2.0 + (i % 5) for i in range(150)]
    est = estimate_median_difference(slow, fast)
    assert est.median == 8.0
    assert est.n == 150
    assert est.low <= 8.0 <= est.high
    assert not est.spans_zero
    assert estimate_median_difference(fast, fast).spans_zero
    assert bootstrap_difference_ci(slow, fast) == bootstrap_difference_ci(slow, fast)
