"""Synthetic size sources: labelled control distributions (fixed, uniform, lognormal lengths), no
data."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from dcp_bench.errors import WorkloadError
from dcp_bench.workloads.base import KIB, MAX_SAMPLE_TOKENS, SYNTH_SHIFT, SizeSource, check_length


class SyntheticSource(SizeSource):
    """A labelled synthetic length distribution; id = length << 32 | a 32-bit draw."""

    def __init__(
        self, sampler: Callable[[np.random.Generator, int], np.ndarray], fixed: int | None = None
    ):
        self._sampler = sampler
        self._fixed = fixed

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        lengths = np.asarray(self._sampler(rng, n), dtype=np.int64)
        return (lengths << SYNTH_SHIFT) | rng.integers(0, 1 << SYNTH_SHIFT, n, dtype=np.int64)

    def shapes(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        lengths = np.asarray(ids, dtype=np.int64) >> SYNTH_SHIFT
        return np.ones_like(lengths), lengths

    def support(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        if self._fixed is None:
            return None
        one = np.ones(1, dtype=np.int64)
        return one, one * self._fixed, np.ones(1)


def synthetic_source(kind: str, **p: Any) -> tuple[SizeSource, dict[str, Any]]:
    if kind == "fixed":
        length = check_length(p.get("length", 64 * KIB), "synthetic_fixed: workload.length")
        src = SyntheticSource(lambda rng, n: np.full(n, length, dtype=np.int64), fixed=length)
        rule = f"every sample {length} tokens"
    elif kind == "uniform":
        low = check_length(p.get("low", 1 * KIB), "synthetic_uniform: workload.low")
        high = check_length(p.get("high", 64 * KIB), "synthetic_uniform: workload.high")
        if not 1 <= low <= high:
            raise WorkloadError(
                f"synthetic_uniform: low={low}, high={high}; expected 1 <= low <= high"
            )
        src = SyntheticSource(lambda rng, n: rng.integers(low, high + 1, n, dtype=np.int64))
        rule = f"uniform integer lengths in [{low}, {high}]"
    else:
        try:
            median, sigma = float(p.get("median", 4 * KIB)), float(p.get("sigma", 1.2))
        except (TypeError, ValueError):
            raise WorkloadError(
                f"synthetic_lognormal: median={p.get('median')!r}, sigma={p.get('sigma')!r}; "
                "expected numbers"
            ) from None
        low = check_length(p.get("low", 16), "synthetic_lognormal: workload.low")
        high = check_length(p.get("high", 256 * KIB), "synthetic_lognormal: workload.high")
        if not (0 < median <= MAX_SAMPLE_TOKENS and 0 <= sigma <= 100) or not 1 <= low <= high:
            raise WorkloadError(
                f"synthetic_lognormal: median={median}, sigma={sigma}, low={low}, high={high}; "
                f"expected 0 < median <= {MAX_SAMPLE_TOKENS}, 0 <= sigma <= 100, 1 <= low <= high"
            )

        def sample(rng: np.random.Generator, n: int) -> np.ndarray:
            x = np.rint(np.exp(math.log(median) + sigma * rng.standard_normal(n)))
            return np.clip(x, low, high).astype(np.int64)

        src = SyntheticSource(sample)
        rule = f"lognormal lengths, median {median:g}, sigma {sigma:g}, clipped to [{low}, {high}]"
    return src, {"source": "synthetic (labelled control, no data)", "distribution": rule}
