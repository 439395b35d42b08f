"""Report section: methods against baselines (the campaign's own comparisons, speedup figures)."""

from __future__ import annotations

import math

from dcp_bench.report import figures as fig
from dcp_bench.report.data import ReportData, evidence, fig_name, fmt_x
from dcp_bench.report.document import Document


def comparison_section(doc: Document, data: ReportData) -> None:
    own = data.own
    cells = data.default
    if cells.empty:
        return
    if data.leads_with_claims:
        doc.h2(
            "Methods against baselines"
        )  # a user's campaign: the first screen opened this section
    if not cells["is_baseline"].astype(bool).any():
        doc.p(
            "No baseline in this campaign, so nothing to compare against: name the baselines with "
            "`dcp-bench report ... baselines=a,b` (by default, methods whose class lives in "
            "`baselines/`)."
        )
        return
    if own.empty:
        if cells["is_baseline"].astype(bool).all():
            doc.p(
                "Every method of this campaign is a baseline: add `baseline_pairs=true` to "
                "compare them with each other, or name fewer with `baselines=a,b`."
            )
        else:
            doc.p(
                "No context (workload, cluster, model) holds both a method and a baseline, so no "
                "speedup can be paired."
            )
        return
    doc.p(
        "Speedup of each method over each baseline on the same workload, cluster and model: the "
        "baseline's median step time over the method's (> 1: the method is faster), repeats "
        "paired by seed (the same global batches), 95% paired-bootstrap CI. "
        f"{evidence(cells, data.campaign.runs).capitalize()}. "
        + (
            "Baselines are also compared with each other (`baseline_pairs=true`). "
            if data.inp.baseline_pairs
            else ""
        )
        + "`flags`: fewer than 5 paired repeats, or a degenerate CI (too few repeats for the "
        "bootstrap to move the median), or failed repeats."
    )
    shown = own.assign(
        speedup=[
            fmt_x(v) if "failed" not in o else "-" for v, o in zip(own["speedup"], own["outcome"])
        ],
        ci95=[
            f"[{lo:.2f}, {hi:.2f}]"
            if math.isfinite(lo) and math.isfinite(hi) and "failed" not in o
            else "-"
            for lo, hi, o in zip(own["ci_low"], own["ci_high"], own["outcome"])
        ],
    )
    cols = [
        "workload",
        "cluster",
        "model",
        "method",
        "baseline",
        "speedup",
        "ci95",
        "pairs",
        "outcome",
        "flags",
    ]
    if set(own["metric"]) - {"step_time"}:
        cols.insert(8, "metric")
    doc.table(shown, "", cols)
    for (cluster, model, executor), sub in own.groupby(
        ["cluster", "model", "executor"], sort=False
    ):
        ctx_cells = cells[
            (cells["cluster"] == cluster)
            & (cells["model"] == model)
            & (cells["executor"] == executor)
        ]
        kind = evidence(ctx_cells, data.campaign.runs)
        doc.figure(
            fig.speedup_bars(
                sub, f"{kind}: speedup over each baseline, {cluster}, {model}", data.colors
            ),
            fig_name("speedup", cluster, model, executor),
            f"Speedup over each baseline ({kind}; {cluster}, {model}); error bars: 95% "
            "paired-bootstrap CI; hatched: failed",
        )
