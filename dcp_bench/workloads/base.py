"""What every size source shares: the limits, the sample-id layout, `check_length`, the abstract
`SizeSource`, the data-file readers and the statistics of a length distribution.

``DATA_DIR`` is ``workloads/data/`` of the repository's top-level ``workloads/`` folder (the data
and its provenance, `dcp_bench.paths.WORKLOADS_DIR`), not this package.
"""

from __future__ import annotations

import json
import math
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

import numpy as np

from dcp_bench.errors import WorkloadError
from dcp_bench.files import sha256_file
from dcp_bench.paths import WORKLOADS_DIR

DATA_DIR = WORKLOADS_DIR / "data"
ID_SHIFT = 40  # sample id = (bin or bucket) << ID_SHIFT | draw
ID_DRAW_MASK = (1 << ID_SHIFT) - 1
SYNTH_SHIFT = 32  # synthetic sample id = length << SYNTH_SHIFT | draw
DRAW_CHUNK = 1024  # draws per chunk; fixed so batches are prefixes across world sizes
MAX_DRAWS_PER_STEP = 1 << 22  # guard: a step that keeps nothing after this many draws fails

# Typical global-batch budgets (tokens per GPU per step); see docs/workloads.md for the reasoning.
VIDEO_TOKENS_PER_GPU = 256 * 1024
TEXT_TOKENS_PER_GPU = 128 * 1024
STATS_SAMPLE = 1_000_000  # draws used for the statistics of continuous or histogram sources
STATS_SEED = 12345
KIB = 1024

# The longest sample (and per-GPU token budget) a workload accepts: 2^30 tokens, 1,024 x the
# longest context of any configured model (1,048,576 tokens) and ~600 x the longest document of
# the shipped corpora. Between a model's max_seq_len and this, max_len_policy truncates or drops
# (counted); above it a value is an input error (no cluster holds it; often a unit mistake), and
# synthetic sample ids (length << SYNTH_SHIFT) stay within int64.
MAX_SAMPLE_TOKENS = 1 << 30


def check_length(value: Any, where: str) -> int:
    """``value`` as a length in tokens, 1 <= length <= `MAX_SAMPLE_TOKENS`; a `WorkloadError`
    naming ``where``, the value and the limit otherwise."""
    if isinstance(value, bool):
        raise WorkloadError(f"{where}: {value!r} is not an integer length")
    try:
        as_float = float(value)
    except (TypeError, ValueError, OverflowError):
        raise WorkloadError(f"{where}: {value!r} is not an integer length") from None
    if isinstance(value, (int, np.integer)):
        length = int(value)
    elif math.isfinite(as_float) and as_float.is_integer():
        length = int(as_float)
    else:
        raise WorkloadError(f"{where}: {value!r} is not an integer length")
    if length < 1:
        raise WorkloadError(f"{where}: length {length} is not positive (expected >= 1 token)")
    if length > MAX_SAMPLE_TOKENS:
        raise WorkloadError(
            f"{where}: length {length} is over the maximum of {MAX_SAMPLE_TOKENS:,} tokens "
            "(2^30, far above any model's max_seq_len)"
        )
    return length


class SizeSource(ABC):
    """Where sample sizes come from. ``draw`` picks ids; ``shapes`` maps ids to (frames,
    spatial)."""

    # How quantiles of the finite support are read: "inverse_cdf" (a value of the support, as for
    # a distribution over buckets) or "linear" (numpy.percentile, as for a list of documents).
    quantile_method = "inverse_cdf"

    @abstractmethod
    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` i.i.d. sample ids (int64)."""

    @abstractmethod
    def shapes(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Unscaled (frames, spatial) of each id; tokens = frames * spatial."""

    def support(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """A finite support (frames, spatial, probability) for exact statistics, or None."""
        return None

    def population(self) -> int | None:
        """Number of documents behind the source, when it has one."""
        return None


def pick_by_cdf(rng: np.random.Generator, cdf: np.ndarray, n: int) -> np.ndarray:
    # Inverse-CDF on Generator.random: stable across numpy versions, unlike choice()'s internals.
    idx = np.searchsorted(cdf, rng.random(n), side="right")
    return np.minimum(idx, len(cdf) - 1).astype(np.int64)


def data_file_provenance(path: Path, shown: str) -> dict[str, str]:
    """The file a workload reads, as records name it: the path as given (never made absolute,
    so records and reports hold no local folders) and the SHA-256 of its bytes."""
    return {"data_file": shown, "data_sha256": sha256_file(path)}


def read_data_json(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise WorkloadError(
            f"workload data file {str(path)!r} is missing (derive it: see workloads/README.md)"
        )
    data = json.loads(path.read_text())
    assert isinstance(data, dict)
    return data


def weighted_quantile(
    values: np.ndarray, probs: np.ndarray, q: float, method: str = "inverse_cdf"
) -> float:
    """The q-quantile (0..1) of a discrete distribution: ``inverse_cdf`` gives the smallest value
    whose CDF >= q; ``linear`` (equal weights only) interpolates like `numpy.percentile`."""
    if method == "linear":
        return float(np.percentile(values, q * 100))
    order = np.argsort(values, kind="stable")
    v, cdf = values[order], np.cumsum(probs[order])
    i = int(np.searchsorted(cdf, q - 1e-12, side="left"))
    return float(v[min(i, len(v) - 1)])


def distribution_stats(
    lengths: np.ndarray, probs: np.ndarray, quantiles: str = "linear"
) -> dict[str, Any]:
    """mean, quantiles, max and the token / attention (L^2) shares above 8K, 32K and 128K."""
    lengths = np.asarray(lengths, dtype=np.float64)
    probs = np.asarray(probs, dtype=np.float64) / np.sum(probs)
    out: dict[str, Any] = {"mean": float(np.dot(lengths, probs))}
    for q in (10, 25, 50, 75, 90, 99):
        out[f"p{q}"] = weighted_quantile(lengths, probs, q / 100, quantiles)
    out["max"] = int(lengths[probs > 0].max())
    tok = lengths * probs
    attn = lengths**2 * probs
    for k in (8, 32, 128):
        longer = lengths > k * KIB
        out[f"token_share_gt_{k}k"] = float(tok[longer].sum() / tok.sum())
        out[f"attn_share_gt_{k}k"] = float(attn[longer].sum() / attn.sum())
    return out
