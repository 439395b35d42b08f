"""Histogram size sources: a published length list kept as a histogram
(``workloads/data/<name>_histogram.json``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from dcp_bench.errors import WorkloadError
from dcp_bench.workloads.base import (
    DATA_DIR,
    ID_DRAW_MASK,
    ID_SHIFT,
    SizeSource,
    data_file_provenance,
    pick_by_cdf,
    read_data_json,
)


class HistogramSource(SizeSource):
    """A histogram with integer bins [lo, hi): a bin is picked by count, then a length uniformly
    within it (bins are under 1.1% wide, so uniform and log-uniform agree to well below the 2%
    quantile target). id = bin << 40 | draw; the length is lo + draw mod (hi - lo)."""

    def __init__(self, lo: np.ndarray, hi: np.ndarray, counts: np.ndarray):
        self.lo = np.asarray(lo, dtype=np.int64)
        self.hi = np.asarray(hi, dtype=np.int64)
        self.counts = np.asarray(counts, dtype=np.int64)
        if not (len(self.lo) == len(self.hi) == len(self.counts)) or len(self.lo) == 0:
            raise WorkloadError("histogram needs equal-length, non-empty bin_lo, bin_hi and counts")
        if np.any(self.hi <= self.lo) or np.any(self.lo < 1) or np.any(self.counts < 0):
            raise WorkloadError("histogram bins must satisfy 1 <= lo < hi and counts >= 0")
        self._cdf = np.cumsum(self.counts) / self.counts.sum()

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        b = pick_by_cdf(rng, self._cdf, n)
        return (b << ID_SHIFT) | rng.integers(0, 1 << ID_SHIFT, n, dtype=np.int64)

    def shapes(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ids = np.asarray(ids, dtype=np.int64)
        b = ids >> ID_SHIFT
        lengths = self.lo[b] + (ids & ID_DRAW_MASK) % (self.hi[b] - self.lo[b])
        return np.ones_like(lengths), lengths

    def population(self) -> int:
        return int(self.counts.sum())


def histogram_source(name: str) -> tuple[SizeSource, dict[str, Any]]:
    data = read_data_json(DATA_DIR / f"{name}_histogram.json")
    src = HistogramSource(
        np.array(data["bin_lo"]), np.array(data["bin_hi"]), np.array(data["counts"])
    )
    prov = dict(data["provenance"])
    prov["histogram"] = (
        f"workloads/data/{name}_histogram.json ({data['bins_per_octave']} bins per octave)"
    )
    prov.update(
        data_file_provenance(
            DATA_DIR / f"{name}_histogram.json", f"workloads/data/{name}_histogram.json"
        )
    )
    prov["reference"] = data["reference"]
    return src, prov
