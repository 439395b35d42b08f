"""Report section: scaling with GPU count."""

from __future__ import annotations

from dcp_bench.report import figures as fig
from dcp_bench.report.data import ReportData, evidence
from dcp_bench.report.document import Document


def scaling_section(doc: Document, data: ReportData) -> None:
    cells = data.default
    if cells.empty:
        return
    cells = cells.assign(world_size=cells["world_size"].astype(float))
    if fig.scaling_series(cells, "tokens_per_s").empty:
        return
    doc.h2("Scaling with the number of GPUs")
    series = fig.scaling_series(cells, "tokens_per_s")
    kind = evidence(series, data.campaign.runs)
    doc.figure(
        fig.versus_gpus(
            cells,
            "imbalance",
            "imbalance (idle share)",
            f"{kind}: load imbalance vs GPUs",
            data.colors,
        ),
        "imbalance_vs_gpus",
        f"Load imbalance (idle share of rank-seconds) against GPU count ({kind}); one panel "
        "per model and GPU kind",
    )
    doc.figure(
        fig.versus_gpus(
            cells,
            "tokens_per_s",
            "tokens / s",
            f"{kind}: throughput vs GPUs",
            data.colors,
            log=True,
        ),
        "scaling",
        f"Throughput (tokens/s) against GPU count ({kind})",
    )
