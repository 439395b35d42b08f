"""Variance-aware statistics over repeated runs.

A *cell* is one configuration without its seed (workload, cluster, model, method, settings); its
repeats differ only in the seed. Each repeat contributes one value (its median step time over the
non-warm-up steps, or its throughput); the cell is summarised over repeats (median, olympic mean,
coefficient of variation) and over the pooled steps (5th/95th percentiles).

Failures are never dropped: a failed repeat counts as infinitely slow (step time ``inf``,
throughput 0), so a method that fails in more than half its repeats has an infinite median.

Speedups are *paired*: repeats are paired by seed (same seed = same data for every method: the
same global batches in step mode, the same dataset and dealing seed in epoch mode), each seed
gives one ratio (method over baseline), and the speedup is the median of those per-seed ratios.
Its 95% confidence interval is a bootstrap over seeds (each draw resamples the seeds with
replacement and takes the median of their ratios; the percentile interval of the draws). The
interval covers what varies between seeds and nothing else: the data sampled (step mode) or the
order the samplers deal a fixed dataset (epoch mode), plus, when a run sets
``run.noise.jitter_sigma`` or stragglers, the simulator's seeded noise. `relative_half_width`
says whether a headline has converged (half-width over the value).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

CV_FLAG = 0.05  # a cell whose repeats vary by more than this (coefficient of variation) is flagged


def _finite(values: Sequence[float] | np.ndarray) -> np.ndarray:
    arr = np.asarray(values, dtype=float)
    return arr[np.isfinite(arr)]


def median(values: Sequence[float] | np.ndarray) -> float:
    """Median; ``inf`` entries (failures) count as the slowest values."""
    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        return math.nan
    return float(np.median(arr))


def olympic_mean(values: Sequence[float] | np.ndarray) -> float:
    """Mean after dropping the single fastest and the single slowest value (MLPerf-style).

    With fewer than three values nothing is dropped. A failure (``inf``) left after dropping the
    slowest makes the result ``inf``.
    """
    arr = np.sort(np.asarray(values, dtype=float))
    if arr.size == 0:
        return math.nan
    if arr.size >= 3:
        arr = arr[1:-1]
    return float(np.mean(arr))


def coefficient_of_variation(values: Sequence[float] | np.ndarray) -> float:
    """Sample standard deviation (ddof=1) over mean, of the finite values; nan for < 2 values."""
    arr = _finite(values)
    if arr.size < 2 or arr.mean() == 0:
        return math.nan
    return float(np.std(arr, ddof=1) / np.mean(arr))


def percentile(values: Sequence[float] | np.ndarray, q: float) -> float:
    """Linear-interpolated percentile (numpy's default), ``inf`` entries included."""
    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        return math.nan
    if np.isinf(arr).any():
        # np.percentile interpolates inf - inf = nan; order statistics keep inf meaningful.
        return float(np.percentile(arr, q, method="higher"))
    return float(np.percentile(arr, q))


@dataclass(frozen=True)
class CellStats:
    """Summary of one cell's repeats (values in seconds for step times)."""

    repeats: int
    failures: int
    median: float
    olympic_mean: float
    cv: float
    p5: float
    p95: float
    min: float
    max: float

    @property
    def flags(self) -> list[str]:
        out = []
        if self.failures:
            out.append(f"{self.failures} failed")
        if not math.isnan(self.cv) and self.cv > CV_FLAG:
            out.append(f"CV {self.cv:.1%} > {CV_FLAG:.0%}")
        if self.repeats < 5:
            out.append(f"only {self.repeats} repeats")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "flags": "; ".join(self.flags)}


def cell_stats(
    run_values: Sequence[float | None], pooled_steps: Sequence[float] | None = None
) -> CellStats:
    """Summarise a cell: one value per repeat (``None`` or ``inf`` = failed repeat); percentiles
    over ``pooled_steps`` (all non-warm-up step times of the cell) when given, else over the
    repeat values."""
    vals = np.array([math.inf if v is None else float(v) for v in run_values], dtype=float)
    failures = int(np.sum(~np.isfinite(vals)))
    pool = np.asarray(
        pooled_steps if pooled_steps is not None and len(pooled_steps) else vals, float
    )
    if failures and pooled_steps is not None:
        pool = np.concatenate([pool, np.full(failures, math.inf)])
    return CellStats(
        repeats=int(vals.size),
        failures=failures,
        median=median(vals),
        olympic_mean=olympic_mean(vals),
        cv=coefficient_of_variation(vals),
        p5=percentile(pool, 5),
        p95=percentile(pool, 95),
        min=float(vals.min()) if vals.size else math.nan,
        max=float(vals.max()) if vals.size else math.nan,
    )


def _ratio(num: float, den: float) -> float:
    """num / den with IEEE semantics (x/0 = inf, inf/inf = nan) instead of exceptions."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(np.float64(num) / np.float64(den))


@dataclass(frozen=True)
class Speedup:
    """Speedup of a method over a baseline: median of per-seed ratios, paired bootstrap CI."""

    value: float
    ci_low: float
    ci_high: float
    pairs: int
    metric: str  # "step_time" (baseline / method) or "throughput" (method / baseline)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def contains(self, x: float) -> bool:
        return self.ci_low <= x <= self.ci_high


def paired_speedup(
    baseline: Mapping[int, float | None],
    method: Mapping[int, float | None],
    metric: str = "step_time",
    n_boot: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> Speedup:
    """Speedup of ``method`` over ``baseline``, each a map seed -> per-repeat value: the median of
    the per-seed ratios over the seeds present on both sides, with a bootstrap interval.

    ``metric="step_time"``: values are times, the ratio is baseline / method, a failed repeat is
    ``inf``. ``metric="throughput"``: values are tokens (or samples) per second, the ratio is
    method / baseline, a failed repeat is 0. A seed where both sides failed has no ratio and is
    left out. The bootstrap resamples those seeds with replacement (a pair stays together) and
    returns the percentile interval of the resampled medians.
    """
    if metric not in ("step_time", "throughput"):
        raise ValueError(f"metric must be 'step_time' or 'throughput', got {metric!r}")
    fail = math.inf if metric == "step_time" else 0.0
    seeds = sorted(set(baseline) & set(method))
    b = np.array([fail if baseline[s] is None else float(baseline[s]) for s in seeds])  # type: ignore[arg-type]
    m = np.array([fail if method[s] is None else float(method[s]) for s in seeds])  # type: ignore[arg-type]
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = b / m if metric == "step_time" else m / b
    ratios = ratios[~np.isnan(ratios)]
    if ratios.size == 0:
        return Speedup(math.nan, math.nan, math.nan, 0, metric)
    point = float(np.median(ratios))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, ratios.size, size=(n_boot, ratios.size))
    draws = np.median(ratios[idx], axis=1)
    draws = draws[~np.isnan(draws)]
    if draws.size == 0:
        return Speedup(point, math.nan, math.nan, int(ratios.size), metric)
    alpha = (1.0 - confidence) / 2.0
    lo = float(np.quantile(draws, alpha, method="lower"))
    hi = float(np.quantile(draws, 1.0 - alpha, method="higher"))
    return Speedup(point, lo, hi, int(ratios.size), metric)


def relative_half_width(value: float, ci_low: float, ci_high: float) -> float:
    """Half the confidence interval's width over the value (0.05 = +-5%); nan when undefined."""
    if not all(math.isfinite(x) for x in (value, ci_low, ci_high)) or value == 0:
        return math.nan
    return (ci_high - ci_low) / 2.0 / abs(value)


def relative_error(predicted: float, measured: float) -> float:
    """(predicted - measured) / measured."""
    if measured == 0 or not math.isfinite(measured) or not math.isfinite(predicted):
        return math.nan
    return (predicted - measured) / measured


def max_relative_difference(reference: Sequence[float], other: Sequence[float]) -> float:
    """max_i |other_i - reference_i| / max(|reference_i|, tiny): loss parity between two methods
    over the same steps."""
    a = np.asarray(reference, dtype=float)
    b = np.asarray(other, dtype=float)
    n = min(a.size, b.size)
    if n == 0:
        return math.nan
    a, b = a[:n], b[:n]
    return float(np.max(np.abs(b - a) / np.maximum(np.abs(a), 1e-12)))
