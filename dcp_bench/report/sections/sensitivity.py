"""Report section: sensitivity of the claims to uncertain cost-model constants (tornado plots)."""

from __future__ import annotations

import numpy as np

from dcp_bench.cost.base import DEFAULT_MEM_CAP_FRACTION
from dcp_bench.report import figures as fig
from dcp_bench.report.data import ReportData, context_cells, evidence
from dcp_bench.report.document import Document


def has_sensitivity(data: ReportData) -> bool:
    sens = data.sensitivity
    return not sens.empty and bool(np.isfinite(sens["speedup"].astype(float)).any())


def sensitivity_section(doc: Document, data: ReportData) -> None:
    claims, sens = data.claims, data.sensitivity
    if not has_sensitivity(data):
        return
    doc.h2("Sensitivity to uncertain cost-model constants")
    by_id = {x["id"]: x for x in [*claims.get("claims", []), *claims.get("comparisons", [])]}
    for comp_id in dict.fromkeys(sens["comparison"]):
        cl = by_id.get(comp_id, {})
        kind = evidence(context_cells(data.cells, cl.get("context", {})), data.campaign.runs)
        doc.figure(
            fig.tornado(
                sens,
                comp_id,
                cl.get("value"),
                cl.get("tolerance"),
                f"{kind}: {comp_id} speedup with each constant halved / doubled",
            ),
            f"tornado_{comp_id}",
            f"Tornado: {comp_id} speedup when each uncertain constant is halved and doubled "
            f"({kind})",
        )
    doc.table(
        sens,
        "Sensitivity runs",
        [
            "comparison",
            "constant",
            "factor",
            "speedup",
            "ci_low",
            "ci_high",
            "reference_speedup",
            "note",
        ],
    )
    doc.p(
        "Constants: `act_bytes` (activation bytes per token), `attn_eff` (attention kernel "
        "efficiency), `small_kernel_eff` (efficiency of small kernels), `a2a_eff` (all-to-all "
        "efficiency), `elementwise` (memory-bound per-token traffic, `elementwise_bytes_factor`, "
        "pinned by one whole-model row only), all multipliers of the analytical model; `mem_cap` "
        f"scales the per-GPU memory cap ({DEFAULT_MEM_CAP_FRACTION} of usable memory: x0.5 = "
        "0.35; x2 is clipped to 1.0, all usable memory, since a cap cannot exceed it)."
    )
