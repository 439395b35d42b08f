"""Fits that turn measured grid points into functions of size.

Per-layer time is ``a + b * tokens_per_rank + c * pairs_per_rank + d * samples`` (pairs: the
attention's query-key pairs, `attention_pairs`; samples: how many samples the rank's micro-batch
holds), the a + bT + cT^2 law written so that packed micro-batches (many short samples: few
pairs) and single long samples share one fit, plus what every sample costs on its own (the
runtime's attention loops over the samples of a packed micro-batch: one kernel launch and its
bookkeeping per sample, which dominates micro-batches of many tiny samples). Activation bytes
are ``b * T + c * P + d * samples`` (no intercept: an empty micro-batch saves nothing).
Collectives are ``latency + bytes / bandwidth``. Coefficients are non-negative (a negative cost per
token would extrapolate to negative times) and the fit minimises *relative* error, so small and
large grid points count alike.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class LinearFit:
    """y = coef . features, with non-negative coefficients."""

    coef: tuple[float, ...]
    max_rel_err: float  # in-sample, over the points it was fitted on
    median_rel_err: float
    n_points: int

    def predict(self, features: np.ndarray) -> np.ndarray:
        x = np.atleast_2d(np.asarray(features, dtype=float))
        return x @ np.asarray(self.coef, dtype=float)

    def to_dict(self) -> dict[str, Any]:
        return {
            "coef": list(self.coef),
            "max_rel_err": self.max_rel_err,
            "median_rel_err": self.median_rel_err,
            "n_points": self.n_points,
        }


def fit_nonnegative(x: np.ndarray, y: np.ndarray) -> LinearFit:
    """Least squares in relative error with coefficients >= 0.

    Exact non-negative least squares by enumeration: the optimum has some active set of
    coefficients at zero, and with at most a handful of features every subset can be tried.
    """
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if x.ndim != 2 or len(x) != len(y) or len(y) == 0:
        raise ValueError(f"bad fit input: features {x.shape}, targets {y.shape}")
    k = x.shape[1]
    w = 1.0 / np.maximum(np.abs(y), 1e-30)
    best: tuple[float, np.ndarray] | None = None
    for r in range(1, k + 1):
        for subset in itertools.combinations(range(k), r):
            cols = list(subset)
            sol, *_ = np.linalg.lstsq(x[:, cols] * w[:, None], y * w, rcond=None)
            if np.any(sol < 0):
                continue
            coef = np.zeros(k)
            coef[cols] = sol
            loss = float(np.sum(((x @ coef - y) * w) ** 2))
            if best is None or loss < best[0] - 1e-15:
                best = (loss, coef)
    if best is None:  # every target is ~0: predict zero
        coef = np.zeros(k)
    else:
        coef = best[1]
    rel = np.abs(x @ coef - y) * w
    return LinearFit(
        coef=tuple(float(c) for c in coef),
        max_rel_err=float(rel.max()),
        median_rel_err=float(np.median(rel)),
        n_points=len(y),
    )


def layer_features(
    tokens_per_rank: np.ndarray, pairs_per_rank: np.ndarray, samples: np.ndarray | float = 0.0
) -> np.ndarray:
    """Design matrix [1, T, pairs, samples] of the per-layer time law."""
    t = np.asarray(tokens_per_rank, dtype=float)
    p = np.asarray(pairs_per_rank, dtype=float)
    n = np.broadcast_to(np.asarray(samples, dtype=float), t.shape)
    return np.stack([np.ones_like(t), t, p, n], axis=-1)


def memory_features(
    tokens_per_rank: np.ndarray, pairs_per_rank: np.ndarray, samples: np.ndarray | float = 0.0
) -> np.ndarray:
    """Design matrix [T, pairs, samples] of the activation-bytes law."""
    return layer_features(tokens_per_rank, pairs_per_rank, samples)[..., 1:]


def collective_features(nbytes: np.ndarray) -> np.ndarray:
    """Design matrix [1, bytes] of the latency-bandwidth law."""
    b = np.asarray(nbytes, dtype=float)
    return np.stack([np.ones_like(b), b], axis=-1)
