"""How far the cost model's predictions are from what real runs measured.

Every measured step record carries the runtime's peak memory per rank (``peak_mem_per_rank_gib``:
the CUDA allocator's peak, or on CPU the process's peak resident set, see
`dcp_bench.runtime.step_meter`) and the cost model's prediction of the same plan
(``extra.predicted_peak_mem_per_rank_gib``). `memory_prediction_error` compares them rank by rank
over the measured steps of real runs: error = measured / predicted - 1 (negative: the model
over-predicts, which is the safe side for planning under a memory cap). The report's summary
carries it as ``memory_prediction_error`` next to the simulator's step-time error.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from dcp_bench.records import read_steps, read_summary


def step_memory_pairs(
    run_dir: str | Path, include_warmup: bool = False
) -> list[tuple[float, float]]:
    """(measured, predicted) GiB per rank and step of one real run's records."""
    pairs: list[tuple[float, float]] = []
    for s in read_steps(Path(run_dir)):
        if s.warmup and not include_warmup:
            continue
        pred = s.extra.get("predicted_peak_mem_per_rank_gib")
        meas = s.peak_mem_per_rank_gib
        if not pred or not meas or len(pred) != len(meas):
            continue
        pairs += [(float(m), float(p)) for m, p in zip(meas, pred) if p and p > 0]
    return pairs


def summarize_memory_pairs(pairs: list[tuple[float, float]]) -> dict[str, Any]:
    """Median and max |error|, the signed extremes, and the share of ranks measured at or under
    the prediction."""
    if not pairs:
        return {
            "n": 0,
            "median_abs_error": None,
            "max_abs_error": None,
            "max_error": None,
            "min_error": None,
            "share_measured_le_predicted": None,
        }
    err = np.array([m / p - 1.0 for m, p in pairs])
    return {
        "n": int(err.size),
        "median_abs_error": float(np.median(np.abs(err))),
        "max_abs_error": float(np.abs(err).max()),
        "max_error": float(err.max()),
        "min_error": float(err.min()),
        "share_measured_le_predicted": float(np.mean(err <= 0.0)),
    }


def memory_prediction_error(root: str | os.PathLike[str], campaign: str) -> dict[str, Any]:
    """Over every real (torch) run of ``root/campaign``: the summary of all (measured,
    predicted) per-rank pairs and one row per run."""
    base = Path(root) / campaign
    runs: list[dict[str, Any]] = []
    all_pairs: list[tuple[float, float]] = []
    for run_dir in sorted(p for p in base.iterdir() if p.is_dir()) if base.exists() else []:
        try:
            summ = read_summary(run_dir)
            if summ is None or summ.executor != "torch":
                continue
            pairs = step_memory_pairs(run_dir)
        except ValueError:  # a damaged record: the report names it elsewhere; no pairs from it
            continue
        if not pairs:
            continue
        all_pairs += pairs
        runs.append(
            {
                "run_id": summ.run_id,
                "method": summ.method,
                "workload": summ.workload,
                "model": summ.model,
                "hardware": summ.hardware,
                "memory_measure": summ.executor_info.get("memory_measure"),
                "measured_gib": max(m for m, _ in pairs),
                "predicted_gib": max(p for _, p in pairs),
                **summarize_memory_pairs(pairs),
            }
        )
    return {
        **summarize_memory_pairs(all_pairs),
        "runs": runs,
        "definition": "per rank and measured step: measured peak / predicted peak - 1",
    }
