"""Report section "Headline comparisons": every claim and comparison of the claims file, with
flags."""

from __future__ import annotations

import math

import pandas as pd

from dcp_bench.report.data import ReportData, fmt_x
from dcp_bench.report.document import Document
from dcp_bench.report.tables import (
    comparison_flags,
    comparison_outcome,
)


def all_simulated(cells: pd.DataFrame, hashes: list[str | None]) -> bool:
    sel = cells[cells["config_hash"].isin([h for h in hashes if h])] if not cells.empty else cells
    return not sel.empty and bool((sel["executor"] == "sim").all())


def simulated_word(reason: str) -> str:
    """A reason line of a simulated result: it says "simulated", not "measured"."""
    return "simulated " + reason[len("measured ") :] if reason.startswith("measured ") else reason


def flag_text(speedup: float, lo: float, hi: float, pairs: int) -> list[str]:
    flags = comparison_flags(speedup, lo, hi, pairs)
    return [f"**flag**: {'; '.join(flags)}"] if flags else []


def headline_section(doc: Document, data: ReportData) -> None:
    ids = {cl["id"] for cl in data.claims_in_campaign}
    if not ids:
        return
    head_rows = [
        {
            "comparison": r.id,
            "workload": r.result.workload,
            "method": r.result.method,
            "baseline": r.result.baseline,
            "speedup": r.result.speedup,
            "ci_low": r.result.ci_low,
            "ci_high": r.result.ci_high,
            "pairs": r.result.pairs,
            "metric": r.result.metric,
            "note": r.verdict,
            "baseline_cell": r.result.baseline_cell,
            "method_cell": r.result.method_cell,
        }
        for r in data.claim_results
    ]
    comparisons = data.comparisons
    head = (
        pd.concat([pd.DataFrame(head_rows), comparisons], ignore_index=True)
        if head_rows or not comparisons.empty
        else pd.DataFrame()
    )
    if head.empty:
        return
    head = head[head["comparison"].isin(ids)]
    missing = head[head["pairs"] == 0]
    head = head[head["pairs"] > 0]
    if head.empty:
        return
    doc.h2("Headline comparisons")
    by_cell = data.cells.set_index("config_hash")
    outcomes, flags = [], []
    for _, r in head.iterrows():
        v, lo, hi, n = float(r["speedup"]), float(r["ci_low"]), float(r["ci_high"]), int(r["pairs"])
        if r["method_cell"] in by_cell.index and r["baseline_cell"] in by_cell.index:
            outcomes.append(
                comparison_outcome(
                    v, lo, hi, by_cell.loc[r["method_cell"]], by_cell.loc[r["baseline_cell"]]
                )
            )
        else:
            outcomes.append("")
        flags.append(
            "; ".join(comparison_flags(v, lo, hi, n)) if "failed" not in outcomes[-1] else ""
        )
    failed = ["failed" in o for o in outcomes]
    shown = head.assign(
        outcome=outcomes,
        flags=flags,
        speedup=["-" if f else fmt_x(float(v)) for v, f in zip(head["speedup"], failed)],
        ci95=[
            "-"
            if f or not (math.isfinite(float(lo)) and math.isfinite(float(hi)))
            else f"[{float(lo):.2f}, {float(hi):.2f}]"
            for lo, hi, f in zip(head["ci_low"], head["ci_high"], failed)
        ],
    )
    doc.table(
        shown,
        "Speedup of method over baseline: median of paired per-seed ratios, 95% paired-bootstrap "
        "CI",
        [
            "comparison",
            "workload",
            "method",
            "baseline",
            "speedup",
            "ci95",
            "pairs",
            "metric",
            "outcome",
            "note",
            "flags",
        ],
    )
    if not missing.empty:
        by_id = missing.groupby("comparison", sort=False).size()
        doc.p(
            f"Not in this campaign (no runs, so no number): {len(missing)} pair(s) of "
            + ", ".join(f"`{k}` ({v})" for k, v in by_id.items())
            + "; `tables/comparisons.csv` lists them."
        )
    doc.p(
        "`metric=throughput`: tokens per second (used whenever a side runs in paper mode, which "
        "trains a different number of samples per step); `metric=step_time`: ratio of median step "
        "times (fair mode: every method trains the same samples with one optimizer step per "
        "global batch)."
    )
