"""Report section: every cell of the campaign."""

from __future__ import annotations

import pandas as pd

from dcp_bench.report.data import CELL_COLUMNS, ReportData, scrub_paths
from dcp_bench.report.document import Document


def cells_section(doc: Document, data: ReportData) -> None:
    c = data.campaign
    cells = data.cells
    doc.h2("Every cell")
    doc.p(
        "A cell is one config without its seed; statistics over its repeats (median, olympic mean "
        "= mean without the fastest and slowest repeat, CV), p5/p95 over all measured steps. "
        "Failed repeats count as infinitely slow. Flags: CV > 5%, failures, fewer than 5 repeats."
    )
    doc.table(cells, "Cells", CELL_COLUMNS)
    failed = data.failed
    if len(failed):
        doc.table(
            failed.assign(error=[scrub_paths(e) if e else "" for e in failed["error"]]),
            "Failed runs (kept, counted as infinitely slow)",
            ["run_id", "status", "method", "workload", "cluster", "error"],
        )
    if c.skipped:
        doc.table(
            pd.DataFrame([{"run_id": rid, "why": scrub_paths(why)} for rid, why in c.skipped]),
            "Unreadable records (skipped: in no number of this report)",
        )
