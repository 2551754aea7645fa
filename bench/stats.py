"""The statistics every benchmark prints, in one place so they all mean the same thing.

- Percentiles are **nearest-rank**: the p-th percentile of n samples is the smallest sample with
  at least p % of the samples at or below it, i.e. the ``ceil(p/100 * n)``-th smallest. No
  interpolation: the figure printed is always a time that was really measured.
- A tail percentile is printed only when at least two samples lie above its rank, so a single
  outlier never *is* the percentile: p99 needs n >= 200 (nearest rank 198 of 200, not the max).
  With fewer samples the figure is refused ("n/a (n<200)") instead of quietly printing the max.
- Medians are the usual median (the mean of the two middle samples when n is even).
- Confidence intervals are percentile bootstraps with a fixed seed (the same data always prints
  the same interval): resample with replacement, take the statistic of each resample, and report
  the nearest-rank 2.5th and 97.5th percentiles of those. Below 10 samples the resampled medians
  take only a handful of values and the interval means little, so it is printed as n/a.
- A latency added by something is measured as the median of *paired* differences: each pair is
  one sample with it and one without, taken back to back, so drift of a shared machine hits both
  halves alike. When the interval spans 0 the printout says the difference is not
  distinguishable from 0 rather than giving its sign a meaning it does not have.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction

BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 20250101
CONFIDENCE = 0.95
# Samples that must lie above a tail percentile's rank before it is printed.
SAMPLES_ABOVE_TAIL = 2
MIN_INTERVAL_SAMPLES = 10


def _exact(q: float) -> Fraction:
    # Fraction(str(q)) keeps 99.9 as 999/10: ceil(0.07 * 100) computed in floats is 8, not 7.
    return Fraction(str(q))


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank ``q``-th percentile (0 <= q <= 100) of a non-empty sample."""
    if not values:
        raise ValueError("percentile of no samples")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} outside 0..100")
    ordered = sorted(values)
    rank = math.ceil(_exact(q) * len(ordered) / 100)
    return ordered[max(rank, 1) - 1]


def min_samples(q: float) -> int:
    """The fewest samples for which the ``q``-th percentile is printed: 200 for p99, 1 up to p50."""
    if not 0 <= q < 100:
        raise ValueError(f"percentile {q} outside 0..100 (the largest sample is the max, not a percentile)")
    if q <= 50:
        return 1
    return math.ceil(SAMPLES_ABOVE_TAIL * 100 / (100 - _exact(q)))


def tail_percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile, or None when there are too few samples for it to mean anything."""
    if len(values) < min_samples(q):
        return None
    return percentile(values, q)


def format_percentile(values: Sequence[float], q: float, spec: str = ".2f", unit: str = "") -> str:
    """The percentile formatted with ``spec`` and ``unit``, or ``n/a (n<200)`` (for p99) when refused."""
    value = tail_percentile(values, q)
    if value is None:
        return f"n/a (n<{min_samples(q)})"
    return f"{value:{spec}}{unit}"


def median(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("median of no samples")
    return float(statistics.median(values))


def _interval(estimates: list[float], confidence: float) -> tuple[float, float]:
    tail = (1 - confidence) / 2 * 100
    return percentile(estimates, tail), percentile(estimates, 100 - tail)


def bootstrap_ci(
    values: Sequence[float],
    statistic: Callable[[Sequence[float]], float] = median,
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = BOOTSTRAP_SEED,
) -> tuple[float, float]:
    """Percentile-bootstrap confidence interval of ``statistic`` over ``values`` (fixed seed)."""
    if not values:
        raise ValueError("confidence interval of no samples")
    rnd = random.Random(seed)
    n = len(values)
    return _interval([statistic(rnd.choices(values, k=n)) for _ in range(resamples)], confidence)


def bootstrap_difference_ci(
    a: Sequence[float],
    b: Sequence[float],
    statistic: Callable[[Sequence[float]], float] = median,
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = BOOTSTRAP_SEED,
) -> tuple[float, float]:
    """Bootstrap interval of ``statistic(a) - statistic(b)`` for two independent samples."""
    if not a or not b:
        raise ValueError("confidence interval of no samples")
    rnd = random.Random(seed)
    estimates = [statistic(rnd.choices(a, k=len(a))) - statistic(rnd.choices(b, k=len(b))) for _ in range(resamples)]
    return _interval(estimates, confidence)


def paired_differences(treated: Sequence[float], baseline: Sequence[float]) -> list[float]:
    """``treated[i] - baseline[i]`` for each pair; both lists hold one entry per pair, in pair order."""
    if len(treated) != len(baseline):
        raise ValueError(f"{len(treated)} treated samples for {len(baseline)} baseline samples")
    return [t - b for t, b in zip(treated, baseline, strict=True)]


@dataclass(frozen=True)
class Estimate:
    """A median with its bootstrap confidence interval."""

    n: int
    median: float
    low: float
    high: float
    confidence: float = CONFIDENCE

    @property
    def has_interval(self) -> bool:
        """Enough samples for the interval to be printed and judged by."""
        return self.n >= MIN_INTERVAL_SAMPLES

    @property
    def spans_zero(self) -> bool:
        return self.low <= 0 <= self.high

    def interval(self, spec: str = "+.2f") -> str:
        """``[-0.10, +1.02]``, or ``n/a (n<10)``."""
        if not self.has_interval:
            return f"n/a (n<{MIN_INTERVAL_SAMPLES})"
        return f"[{self.low:{spec}}, {self.high:{spec}}]"

    def describe(self, unit: str = "ms", spec: str = "+.2f", what: str = "pairs") -> str:
        """``n=200 pairs, median +0.47 ms, 95 % CI [-0.10, +1.02] ms: not distinguishable from 0``."""
        text = f"n={self.n} {what}, median {self.median:{spec}} {unit}, {self.confidence * 100:.0f} % CI "
        if not self.has_interval:
            return text + self.interval(spec)
        text += f"{self.interval(spec)} {unit}"
        if self.spans_zero:
            text += ": not distinguishable from 0"
        return text


def estimate_median(values: Sequence[float], *, seed: int = BOOTSTRAP_SEED) -> Estimate:
    """Median of ``values`` with its 95 % bootstrap interval (paired differences, or plain samples)."""
    low, high = bootstrap_ci(values, median, seed=seed)
    return Estimate(len(values), median(values), low, high)


def estimate_median_difference(a: Sequence[float], b: Sequence[float], *, seed: int = BOOTSTRAP_SEED) -> Estimate:
    """``median(a) - median(b)`` for two independent samples, with its 95 % bootstrap interval."""
    low, high = bootstrap_difference_ci(a, b, median, seed=seed)
    return Estimate(min(len(a), len(b)), median(a) - median(b), low, high)
