"""Report section "Step times, memory and plan shapes", per context (cluster, model, executor)."""

from __future__ import annotations

from dcp_bench.report import figures as fig
from dcp_bench.report.data import (
    MAX_CONTEXT_FIGURES,
    ReportData,
    evidence,
    fig_name,
    report_contexts,
)
from dcp_bench.report.document import Document


def context_section(doc: Document, data: ReportData) -> None:
    c = data.campaign
    contexts = report_contexts(data.default)
    if not contexts:
        return
    if data.leads_with_claims:
        # The claims' contexts first: they are what the campaign was run for.
        claimed = {
            (str(cl["context"].get("cluster")), str(cl["context"].get("model")))
            for cl in data.claims_in_campaign
            if isinstance(cl.get("context"), dict)
        }
        contexts.sort(key=lambda g: (g[0][:2] not in claimed, g[0][2] != "sim"))
    doc.h2("Step times, memory and plan shapes")
    drawn, left = contexts[:MAX_CONTEXT_FIGURES], contexts[MAX_CONTEXT_FIGURES:]
    for (cluster, model, executor), cells in drawn:
        kind = evidence(cells, c.runs)
        steps = (
            c.steps[c.steps["config_hash"].isin(cells["config_hash"])]
            if not c.steps.empty
            else c.steps
        )
        where = f"{cluster}, {model}"
        doc.h3(f"{where} ({kind})")
        name = fig_name(cluster, model, executor)
        doc.figure(
            fig.step_time_distributions(
                steps, cells, f"{kind}: step time per method, {where}", data.colors
            ),
            f"step_times_{name}",
            f"Step time per method, all measured steps of all repeats ({kind})",
        )
        doc.figure(
            fig.peak_memory_per_rank(
                steps, cells, f"{kind}: peak memory per rank, {where}", data.colors
            ),
            f"peak_memory_{name}",
            f"Peak memory per rank (max over steps) against the cap ({kind})",
        )
        doc.figure(
            fig.share_histogram(
                steps,
                cells,
                "sp_tokens",
                "SP degree",
                f"{kind}: SP degree (share of tokens), {where}",
            ),
            f"sp_degree_{name}",
            f"Share of tokens run at each SP degree, per method ({kind}; token-weighted: the few "
            "long sequences carry most of the work; sample-weighted counts are in the run "
            "records)",
        )
        doc.figure(
            fig.share_histogram(
                steps,
                cells,
                "ckpt_tokens",
                "checkpointed share of layers",
                f"{kind}: recomputation (share of tokens), {where}",
            ),
            f"recompute_{name}",
            f"Share of tokens per checkpointed fraction of layers ({kind}; 0 = no "
            "recomputation, 1 = full)",
        )
    if left:
        doc.p(
            "Not drawn (the cells table holds their numbers): "
            + "; ".join(
                f"{cl}, {m} ({'simulated' if ex == 'sim' else 'measured'}, {len(df)} cells)"
                for (cl, m, ex), df in left
            )
            + "."
        )
