"""Report section "System-level validation": the claim's system simulated against its
publication."""

from __future__ import annotations

import pandas as pd

from dcp_bench.report.data import ReportData
from dcp_bench.report.document import Document
from dcp_bench.report.system_validation import ROW_FIELDS


def system_validation_section(doc: Document, data: ReportData) -> None:
    """Each claim's system simulated against its authors' published end-to-end measurement, from
    this campaign's own runs (`dcp_bench.report.system_validation`)."""
    ids = {cl["id"] for cl in data.claims_in_campaign}
    results = [r for r in data.claim_results if r.id in ids and r.validation is not None]
    if not results:
        return
    doc.h2("System-level validation")
    for r in results:
        v = r.validation
        assert v is not None
        s = v.system
        doc.p(
            f"**{r.id}** rests on the simulator; it is checked against {s.system} as its authors "
            f"measured it: {s.hardware}, {s.unit} ({s.source}). Simulated from this campaign's "
            f"runs on `{', '.join(f'{k}={x}' for k, x in s.context.items())}` (median over the "
            "seeds run). The published figures validate; no constant is fitted to them. "
            f"Verdict rule: {r.verdict_rule or 'the seed CI decides'}."
        )
        table = pd.DataFrame(v.rows)
        if not table.empty:
            doc.table(
                table[["label", *ROW_FIELDS]],
                f"{s.id}: published vs simulated ({s.unit}; error = simulated / published - 1)",
            )
        if v.note:
            doc.p(f"Not simulated: {v.note}.")
