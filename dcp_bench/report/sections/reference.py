"""Report sections of the reference's readings: each claim's paper-mode table on the reference's
three mixes, its "what it takes" table, and what the memory model decided per side."""

from __future__ import annotations

from typing import Any

import pandas as pd

from dcp_bench.report.claims import ClaimResult
from dcp_bench.report.data import ReportData
from dcp_bench.report.document import Document
from dcp_bench.report.memory import memory_decisions_section


def reference_section(doc: Document, data: ReportData) -> None:
    """The claims' paper-mode table on the reference's mixes and "what it takes" table, for the
    claims this campaign holds runs of."""
    ids = {cl["id"] for cl in data.claims_in_campaign}
    reference_tables_section(
        doc, [r for r in data.claim_results if r.id in ids and r.result.pairs > 0]
    )
    memory_decisions_section(
        doc, [r for r in data.claim_results if r.id in ids and r.result.pairs > 0]
    )


def reference_tables_section(doc: Any, claim_results: list[ClaimResult]) -> None:
    """The paper-mode table and the "what it takes" table of every claim that has them, as
    report sections of ``doc`` (a `dcp_bench.report.document.Document`)."""
    for r in claim_results:
        if r.paper_mode_table:
            doc.h2(f"Paper mode: every faithful method on the reference's three mixes ({r.id})")
            doc.p(
                "Paper mode is the reference runtime: one epoch over the mix's fixed dataset, "
                "dealt by each method's reference sampler, every iteration its own optimizer "
                "step; throughput = the epoch's (patch) tokens / the epoch's time. Speedup: "
                "median of paired per-seed ratios over the baseline, 95% bootstrap CI; the CI "
                f"covers {r.ci_covers or 'the seeds'}."
            )
            doc.table(
                pd.DataFrame(r.paper_mode_table),
                f"{r.id}: paper-mode throughput and speedup",
                [
                    "cluster",
                    "workload",
                    "method",
                    "tokens_per_s",
                    "speedup",
                    "ci_low",
                    "ci_high",
                    "pairs",
                    "imbalance",
                    "trained_fraction",
                ],
            )
        if r.what_it_takes:
            doc.h2(f"What it takes to get {r.claimed:g}x ({r.id})")
            doc.p(
                "The claim's verdict under each reading of the reference's code that matters; one "
                "choice changes at a time from the headline's readings (marked "
                "`headline_reading`). docs/reference_semantics.md gives each reading with the "
                "reference's file and line."
            )
            doc.table(
                pd.DataFrame(r.what_it_takes),
                f"{r.id}: verdict by reading",
                [
                    "question",
                    "reading",
                    "headline_reading",
                    "speedup",
                    "ci_low",
                    "ci_high",
                    "pairs",
                    "verdict",
                    "note",
                ],
            )
