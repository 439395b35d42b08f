"""Report section: the decomposition of each claim's speedup into factors."""

from __future__ import annotations

from dcp_bench.report import figures as fig
from dcp_bench.report.claims import (
    decompose,
)
from dcp_bench.report.data import ReportData, context_cells, evidence
from dcp_bench.report.document import Document


def decomposition_section(doc: Document, data: ReportData) -> None:
    c, cells = data.campaign, data.cells
    ids = {cl["id"] for cl in data.claims_in_campaign}
    claims = [cl for cl in data.claims.get("claims", []) if cl["id"] in ids]
    decs = [(cl, decompose(c, cells, cl)) for cl in claims] if not cells.empty else []
    if not any(dec is not None for _, dec in decs):
        return
    doc.h2("Where the speedup comes from")
    for cl, dec in decs:
        if dec is None:
            doc.p(
                f"{cl['id']}: decomposition needs the baseline and the method in both fair and "
                "paper mode in the claim's context; not all four are in this campaign."
            )
            continue
        dec.insert(0, "claim", cl["id"])
        data.decompositions.append(dec)
        doc.table(
            dec,
            f"{cl['id']}: factors of the speedup (their product is the headline speedup)",
            ["factor", "factor_x", "share_of_log_speedup", "baseline_s", "method_s"],
        )
        kind = evidence(context_cells(data.default, cl["context"]), c.runs)
        doc.figure(
            fig.decomposition_bars(dec, f"{kind}: {cl['id']} decomposition"),
            f"decomposition_{cl['id']}",
            f"{cl['id']}: multiplicative factors of the speedup ({kind})",
        )
    doc.p(
        "Fair-mode parts come from the simulator's time accounting (mean per rank per step: "
        "compute, recomputation, all-to-all, gradient sync + optimizer, and the rest of the step: "
        "ranks idle waiting for the slowest); the paper-mode factors are the switch from fair to "
        "paper mode on each side (sample dealing and dropping, optimizer steps over different "
        "sample counts)."
    )
