"""Report section "Verdict in detail": each claim's verdict as the claims engine decided it, with
its reasons and the sensitivity verdicts in words."""

from __future__ import annotations

from typing import Any

from dcp_bench.report.data import SIM_ERROR_TARGET, ReportData
from dcp_bench.report.document import Document
from dcp_bench.report.sections.calibration import uses_calibration
from dcp_bench.report.sections.headline import all_simulated, flag_text, simulated_word
from dcp_bench.report.summary import nanmedian_abs


def robustness_lines(results: list[Any]) -> dict[str, list[str]]:
    """Each claim's sensitivity verdicts (`dcp_bench.report.claims.judge_sensitivity`) in words."""
    out: dict[str, list[str]] = {}
    for res in results:
        flips = res.sensitivity_verdicts
        if not flips:
            continue
        lo = min(f["speedup"] for f in flips)
        hi = max(f["speedup"] for f in flips)
        changed = [
            f"{f['constant']} x{f['factor']:g} ({f['speedup']:.2f}x: {f['verdict']})" for f in flips
        ]
        out[res.id] = [
            f"sensitivity: with each uncertain constant halved or doubled the speedup ranges "
            f"{lo:.2f}x to {hi:.2f}x; verdicts: " + "; ".join(changed)
        ]
    return out


def verdict_section(doc: Document, data: ReportData) -> None:
    ids = {cl["id"] for cl in data.claims_in_campaign}
    results = [r for r in data.claim_results if r.id in ids]
    if not results:
        return
    doc.h2("Verdict in detail")
    robustness = robustness_lines(data.claim_results)
    for r in results:
        doc.p(
            f"**{r.id}: {r.verdict.upper()}.** Claim: {r.statement} (claimed {r.claimed:g}x, "
            f"tolerance {r.tolerance:.0%})."
        )
        flags = (
            []
            if r.result.pairs == 0
            else flag_text(r.result.speedup, r.result.ci_low, r.result.ci_high, r.result.pairs)
        )
        simulated = all_simulated(data.cells, [r.result.method_cell, r.result.baseline_cell])
        doc.bullets(
            [
                *(simulated_word(x) if simulated else x for x in r.reasons),
                *robustness.get(r.id, []),
                *flags,
            ]
        )
    calib = data.calibration
    if calib and uses_calibration(data):
        doc.p("CPU calibration on record: " + ", ".join(f"`{k}`" for k in calib) + ".")
    validation = data.validation
    if not validation.empty and validation["error"].notna().any():
        med = nanmedian_abs(validation["error"])
        doc.p(
            "The simulator's own error, measured here on CPU ranks against real training "
            f"(section 'Simulator against measurement'): median {med:.0%} on median step time "
            f"(target {SIM_ERROR_TARGET:.0%})"
            + (
                ""
                if med <= SIM_ERROR_TARGET
                else ": above target, so read simulated speedups as estimates of that precision"
            )
            + "."
        )
