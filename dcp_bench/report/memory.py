"""Report section: what the memory model decides in paper mode, per method of a claim.

The reference's profiler searches each bucket's batch size by powers of two under the memory cap
(`dcp_bench.reference.trial_search`), so the activation bytes the cost model charges decide how many
samples of a bucket run together, which buckets the samplers deal, and how many samples the
epoch trains. For each side of a claim this section shows the per-bucket settings as the
reference's profiler would print them (bucket, SP degree, batch size, checkpointed layers), the
epoch's accounting (dataset samples, trained, dropped by reason) and the load imbalance, beside
the model band of the verdict. Numbers are simulated (the run records say by which cost model).
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from dcp_bench.report.claims import ClaimResult


def bucket_settings_table(accounting: dict[str, Any]) -> pd.DataFrame:
    """One row per bucket of the reference profile: sp, batch size, checkpointed layers, time."""
    rows = []
    for bucket, p in sorted((accounting.get("profile") or {}).items()):
        if p is None:
            rows.append(
                {
                    "bucket": bucket,
                    "sp": None,
                    "batch_size": None,
                    "ckpt_layers": None,
                    "time_s": None,
                    "note": "does not fit at any SP degree (unprofiled)",
                }
            )
        else:
            rows.append(
                {
                    "bucket": bucket,
                    "sp": p.get("sp"),
                    "batch_size": p.get("bs"),
                    # the bucket baseline's batch before its time-damping, where it has one
                    "undamped_batch_size": p.get("undamped_bs"),
                    "ckpt_layers": p.get("ckpt_layers"),
                    "time_s": p.get("time_s"),
                    "note": "",
                }
            )
    return pd.DataFrame(rows)


def accounting_table(r: ClaimResult) -> pd.DataFrame:
    """Per side: dataset samples, trained (median over seeds), trained share, dropped by reason,
    imbalance."""
    rows = []
    for side in ("baseline", "method"):
        acc = r.accounting.get(side) or {}
        if not acc:
            continue
        dropped = acc.get("dropped_samples") or {}
        rows.append(
            {
                "side": side,
                "method": r.result.baseline if side == "baseline" else r.result.method,
                "dataset_samples": acc.get("dataset_samples"),
                "trained_samples": acc.get("trained_samples_median"),
                "trained_fraction": acc.get("trained_fraction"),
                **{f"dropped_{k}": v for k, v in sorted(dropped.items())},
                # two quantities under their own names: the simulator's idle share of
                # rank-time, and the reference's estimate from its profile (sampler.py:259-271)
                "idle_share_simulated": r.imbalance.get(side),
                "reference_imbalance": acc.get("reference_imbalance"),
            }
        )
    return pd.DataFrame(rows)


def _fmt_band(r: ClaimResult) -> str:
    if math.isnan(r.model_band_low):
        return "no model variants in this campaign"
    return (
        f"[{r.model_band_low:.2f}, {r.model_band_high:.2f}] over {len(r.model_variants)} variants"
    )


def memory_decisions_section(doc: Any, claim_results: list[ClaimResult]) -> None:
    """The section (see the module docstring) for every claim with an epoch accounting."""
    for r in claim_results:
        if not r.accounting:
            continue
        doc.h2(f"What the memory model decides ({r.id})")
        doc.p(
            "Activation memory is counted from the runtime's models (`dcp-bench memory`, "
            "results/memory/); the reference's profiler searches each bucket's batch size by "
            "powers of two under the memory cap with it, so these settings, the samples the "
            f"epoch trains and the load imbalance follow from it. Verdict basis: {r.basis}. Seed "
            f"CI [{r.result.ci_low:.2f}, {r.result.ci_high:.2f}]; model band {_fmt_band(r)}."
        )
        doc.table(
            accounting_table(r),
            f"{r.id}: the epoch's samples (trained, dropped by reason) and load imbalance "
            "(idle share of rank-seconds per iteration, median)",
        )
        for side in ("baseline", "method"):
            acc = r.accounting.get(side) or {}
            if acc.get("profile"):
                name = r.result.baseline if side == "baseline" else r.result.method
                doc.table(
                    bucket_settings_table(acc),
                    f"{r.id}, {name}: per-bucket settings of the reference "
                    "profile (SP degree, batch size, checkpointed layers, time of one micro-batch)",
                )
        if r.model_variants:
            doc.table(
                pd.DataFrame(r.model_variants),
                f"{r.id}: the headline under each model variant (same seeds)",
            )


__all__ = ["accounting_table", "bucket_settings_table", "memory_decisions_section"]
