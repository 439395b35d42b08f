"""Statistics over repeats, checked against values computed by hand."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from dcp_bench.report.stats import (
    cell_stats,
    coefficient_of_variation,
    max_relative_difference,
    median,
    olympic_mean,
    paired_speedup,
    percentile,
    relative_error,
    relative_half_width,
)


def test_median_and_olympic_mean_by_hand() -> None:
    # sorted: 1.0 1.1 1.2 1.3 2.0 -> median 1.2; olympic drops 1.0 and 2.0 -> (1.1+1.2+1.3)/3 = 1.2
    vals = [1.3, 1.0, 2.0, 1.2, 1.1]
    assert median(vals) == pytest.approx(1.2)
    assert olympic_mean(vals) == pytest.approx(1.2)
    # even count: median of 1,2,3,10 = 2.5; olympic = (2+3)/2 = 2.5
    assert median([10, 1, 3, 2]) == pytest.approx(2.5)
    assert olympic_mean([10, 1, 3, 2]) == pytest.approx(2.5)
    # fewer than 3 values: nothing dropped
    assert olympic_mean([1.0, 3.0]) == pytest.approx(2.0)


def test_cv_by_hand() -> None:
    # values 2, 4, 4, 4, 5, 5, 7, 9: mean 5, sample variance 32/7
    vals = [2, 4, 4, 4, 5, 5, 7, 9]
    assert coefficient_of_variation(vals) == pytest.approx(math.sqrt(32 / 7) / 5)
    assert math.isnan(coefficient_of_variation([3.0]))


def test_percentiles_by_hand() -> None:
    vals = list(range(1, 22))  # 1..21: p5 at rank 0.05*20 = 1 -> 2; p95 at rank 19 -> 20
    assert percentile(vals, 5) == pytest.approx(2.0)
    assert percentile(vals, 95) == pytest.approx(20.0)
    assert percentile([1.0, 2.0, math.inf], 95) == math.inf


def test_failures_count_as_infinitely_slow() -> None:
    s = cell_stats([1.0, 1.1, None, 1.2, 0.9])
    assert s.failures == 1 and s.repeats == 5
    # sorted 0.9 1.0 1.1 1.2 inf: median 1.1; olympic drops 0.9 and inf -> 1.1
    assert s.median == pytest.approx(1.1)
    assert s.olympic_mean == pytest.approx(1.1)
    assert any("failed" in f for f in s.flags)
    majority_failed = cell_stats([None, None, None, 1.0, 1.0])
    assert majority_failed.median == math.inf


def test_cv_flag() -> None:
    steady = cell_stats([1.00, 1.01, 0.99, 1.00, 1.02])
    noisy = cell_stats([1.0, 1.2, 0.8, 1.1, 0.9])
    assert not any("CV" in f for f in steady.flags)
    assert any("CV" in f for f in noisy.flags)


def test_pooled_percentiles_use_steps() -> None:
    s = cell_stats([1.0] * 5, pooled_steps=list(range(1, 22)))
    assert s.p5 == pytest.approx(2.0) and s.p95 == pytest.approx(20.0)


def test_speedup_point_is_the_median_of_paired_ratios() -> None:
    base = {0: 2.0, 1: 2.2, 2: 1.8, 3: 2.1, 4: 1.9}
    meth = {0: 1.0, 1: 1.0, 2: 1.2, 3: 0.7, 4: 0.95}  # ratios 2.0, 2.2, 1.5, 3.0, 2.0
    sp = paired_speedup(base, meth)
    assert sp.value == pytest.approx(
        2.0
    )  # the median of the ratios (the ratio of medians is 1.9 / 0.95 = 2.0 too)
    assert sp.ci_low <= 2.0 <= sp.ci_high and sp.pairs == 5
    meth[2] = 0.6  # ratios 2.0, 2.2, 3.0, 3.0, 2.0: median 2.2, ratio of medians 1.9 / 0.95 = 2.0
    assert paired_speedup(base, meth).value == pytest.approx(2.2)
    thr = paired_speedup(
        {s: 1 / v for s, v in base.items()},
        {s: 1 / v for s, v in meth.items()},
        metric="throughput",
    )
    assert thr.value == pytest.approx(2.2)


def test_paired_bootstrap_matches_exhaustive_enumeration() -> None:
    """With 3 pairs there are 27 equally likely resamples: the bootstrap distribution must match
    the exact one (checked on its support and on the median ratio's exact 2.5/97.5 quantiles)."""
    base = {0: 3.0, 1: 5.0, 2: 4.0}
    meth = {0: 1.0, 1: 4.0, 2: 2.0}
    ratios = {s: base[s] / meth[s] for s in base}  # 3.0, 1.25, 2.0
    exact = [
        float(np.median([ratios[i] for i in idx])) for idx in itertools.product(range(3), repeat=3)
    ]
    exact_arr = np.sort(np.array(exact))
    sp = paired_speedup(base, meth, n_boot=20000, seed=1)
    assert sp.value == pytest.approx(2.0)
    # Every bootstrap value is one of the exact support points, so the interval ends are too.
    assert np.isclose(exact_arr, sp.ci_low).any() and np.isclose(exact_arr, sp.ci_high).any()
    assert sp.ci_low == pytest.approx(np.quantile(exact_arr, 0.025, method="lower"))
    assert sp.ci_high == pytest.approx(np.quantile(exact_arr, 0.975, method="higher"))


def test_relative_half_width() -> None:
    assert relative_half_width(2.0, 1.9, 2.1) == pytest.approx(0.05)
    assert math.isnan(relative_half_width(math.nan, 1.0, 2.0))


def test_pairing_matters() -> None:
    """Seeds shift both methods together (hard batches are hard for everyone): pairing removes
    that shared variance, so the paired CI is narrow although each side alone varies a lot."""
    rng = np.random.default_rng(0)
    difficulty = rng.uniform(1.0, 3.0, size=20)
    base = {i: 2.0 * d for i, d in enumerate(difficulty)}
    meth = {i: 1.0 * d for i, d in enumerate(difficulty)}
    sp = paired_speedup(base, meth)
    assert sp.value == pytest.approx(2.0)
    assert sp.ci_low == pytest.approx(2.0) and sp.ci_high == pytest.approx(2.0)
    # unpaired seeds (no overlap) give no estimate rather than a wrong one
    assert paired_speedup({0: 1.0}, {1: 1.0}).pairs == 0


def test_failed_method_has_zero_speedup() -> None:
    base = {s: 1.0 for s in range(5)}
    meth = {s: None for s in range(5)}
    assert paired_speedup(base, meth).value == 0.0
    assert paired_speedup(meth, base).value == math.inf


def test_error_helpers() -> None:
    assert relative_error(1.1, 1.0) == pytest.approx(0.1)
    assert max_relative_difference([1.0, 2.0, 4.0], [1.0, 2.2, 4.0]) == pytest.approx(0.1)
