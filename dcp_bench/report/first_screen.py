"""The report's first screen: the answer, then what it rests on.

For a campaign that holds a claim's runs: the verdict in one sentence with its basis (simulated,
by which cost model, or measured, on what), the seed confidence interval and the model band,
whether the reproduction is complete; then one forest plot of every headline comparison (the
claim in paper mode, the fair-mode comparisons, each method over each baseline); then the few
facts a reviewer needs to judge it: the share of the epoch each side trains, and what the verdict
depends on (the readings of the reference and the cost constants that change it, the fair-mode
number). For a user's campaign: its own methods over its baselines, in the same order. Method
labels are explained in a glossary (`glossary_section`), not in the opening lines.

The claim's fields are read from its summary row (`ClaimResult.to_summary`), so fields other
parts of the suite add there (``basis``, ``model_band_low`` / ``model_band_high``,
``trained_fraction``, ``imbalance``, a verdict string such as "incomplete: ...") appear as soon
as they are present; absent, the screen says "not computed".
"""

from __future__ import annotations

import importlib
import math
from typing import Any

import numpy as np
import pandas as pd

from dcp_bench.report import figures as fig
from dcp_bench.report.claims import tolerance_band, within_tolerance
from dcp_bench.report.document import Document

# The sections read a `dcp_bench.report.data.ReportData`; typed ``Any`` here because the writer
# imports this module (imports point one way).
ReportData = Any

VERDICT_WORDS = ("reproduced", "not reproduced", "exceeded", "undecided", "no data")
FOREST_MAX_ROWS = (
    30  # a user's campaign with more comparisons shows the first ones; the table has all
)
FOREST_FIGURE = "forest_headline"


def _finite(x: Any) -> bool:
    try:
        return x is not None and math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def _ci(lo: Any, hi: Any) -> str:
    return f"[{float(lo):.2f}, {float(hi):.2f}]" if _finite(lo) and _finite(hi) else "[-]"


def model_band_text(row: dict[str, Any]) -> str:
    """ "model band [a, b]" when the row carries one, else says it was not computed."""
    lo, hi = row.get("model_band_low"), row.get("model_band_high")
    if _finite(lo) and _finite(hi):
        return f"model band {_ci(lo, hi)}"
    return "model band: not computed"


def _per_side(value: Any, what: str) -> str:
    """``{"method": f, "baseline": f}`` as words; "not computed" when absent."""
    if isinstance(value, dict) and any(_finite(v) for v in value.values()):
        sides = [f"{side} {float(v):.0%}" for side, v in value.items() if _finite(v)]
        return f"{what}: " + ", ".join(sides)
    return f"{what}: not computed"


def claim_basis(data: ReportData, claim: dict[str, Any]) -> str:
    """Where the claim's number comes from: the claim's own ``basis`` when it carries one, else
    read from its two cells' records (simulator and cost-model source, or the hardware measured)."""
    if claim.get("basis"):
        return str(claim["basis"])
    cells = data.cells
    if cells.empty:
        return "no data"
    sel = cells[cells["config_hash"].isin([claim.get("method_cell"), claim.get("baseline_cell")])]
    if sel.empty:
        return "no data"
    if (sel["executor"] != "sim").any():
        runs = data.campaign.runs
        hw = (
            sorted(
                {
                    str(h)
                    for h in runs.loc[runs["config_hash"].isin(sel["config_hash"]), "hardware"]
                    if h
                }
            )
            if not runs.empty and "hardware" in runs
            else []
        )
        return f"measured on {', '.join(hw) or 'the recorded hardware'}"
    sources = sorted({str(s) for s in sel["cost_source"] if s})
    gpu = (sel["cluster"].astype(str) != "cpu").all() and not any(
        str(c).startswith("cpu") for c in sel["cluster"]
    )
    if sources == ["analytical"] and gpu:
        return (
            "in simulation (analytical cost model calibrated on published H100/H200 measurements, "
            "not validated on a GPU run of this suite)"
        )
    if sources == ["profiled"]:
        return (
            "in simulation (cost model profiled on measured runs; its fit error is in the "
            "provenance section)"
        )
    return f"in simulation ({', '.join(sources) or 'unnamed'} cost model)"


def _claim_rows(data: ReportData) -> list[dict[str, Any]]:
    """The summary rows of the claims this campaign holds runs of, with their two cells."""
    ids = {cl["id"] for cl in data.claims_in_campaign}
    out = []
    for r in data.claim_results:
        if r.id in ids:
            row = r.to_summary()
            row.update(
                method_cell=r.result.method_cell,
                baseline_cell=r.result.baseline_cell,
                workload=r.result.workload,
            )
            out.append(row)
    return out


def completeness_line(data: ReportData) -> str | None:
    """One line on how much of the reproduction ran, when the inputs say (``completeness``:
    {"complete", "sections_done", "sections_total", "cut"})."""
    comp = getattr(data.inp, "completeness", None)
    if not isinstance(comp, dict):
        return None
    if comp.get("complete"):
        return f"Complete: all {comp.get('sections_total', '?')} sections ran."
    cut = comp.get("cut") or []
    return (
        f"**Incomplete**: {comp.get('sections_done', '?')} of {comp.get('sections_total', '?')} "
        "sections ran"
        + (f" (cut: {', '.join(str(c) for c in cut)})" if cut else "")
        + "; rerun `make reproduce` to resume."
    )


def verdict_lines(data: ReportData, claim: dict[str, Any]) -> list[str]:
    """The verdict box of one claim: the verdict string the claim carries, its basis, the number
    with its seed CI and model band, against the claimed value and its tolerance band."""
    claimed = float(claim["claimed"])
    band = tolerance_band(claimed, float(claim["tolerance"]))
    basis = claim_basis(data, claim)
    v: Any = claim.get("speedup")
    word = str(claim["verdict"])
    # The verdict words in capitals; a longer verdict string (e.g. an incomplete run's, with the
    # command to resume it) exactly as the claim carries it.
    lines = [f"**{claim['id']}: {word.upper() if word in VERDICT_WORDS else word}**, {basis}."]
    if _finite(v):
        lines.append(
            f"{float(v):.2f}x, 95% CI over {claim.get('pairs', '?')} paired "
            f"{'steps' if claim.get('pair_by') == 'step' else 'seeds'} "
            f"{_ci(claim.get('ci_low'), claim.get('ci_high'))}; {model_band_text(claim)}; claimed "
            f"{claimed:g}x, tolerance band {_ci(*band)} (reproduced when the whole CI lies inside "
            f"the band). `{claim['method']}` over `{claim['baseline']}`, "
            f"{claim.get('workload', '')}."
        )
    else:
        lines.append(
            f"No number: {'; '.join(claim.get('reasons') or ['a side is not in this campaign'])}."
        )
    val = validation_line(claim)
    if val:
        lines.append(val)
    lines.append(f"Claim: {claim['statement']}")
    return lines


def validation_line(claim: dict[str, Any]) -> str | None:
    """The claim's system-level check beside its verdict: the simulated and published speedup
    of the claimed comparison on the claim's own system, the error, and what the rule made of
    it (`dcp_bench.report.claims.verdict_rule`)."""
    val = claim.get("validation")
    rule = str(claim.get("verdict_rule") or "")
    if not val:
        return rule or None
    cm = val.get("claimed_comparison") or {}
    sim, pub, err = cm.get("simulated_speedup"), cm.get("published_speedup"), cm.get("error")
    head = (
        f"Validation on the authors' own measurement ({val.get('hardware', '').split(' (')[0]}, "
        f"{val.get('context', {}).get('workload', '')}): "
    )
    link = " [System-level validation](#system-level-validation)."
    if not (_finite(sim) and _finite(pub) and _finite(err)):
        return head + (rule or "not simulated in this campaign") + "." + link
    tol = float(claim["tolerance"])
    sim_x, pub_x, err_x = float(str(sim)), float(str(pub)), float(str(err))
    numbers = (
        f"`{cm.get('method')}` over `{cm.get('baseline')}` simulated {sim_x:.2f}x, "
        f"published {pub_x:.2f}x, error {err_x:+.0%}"
    )
    if within_tolerance(err_x, tol):
        outcome = f"within the claim's {tol:.0%} tolerance, so the simulated verdict stands"
    else:
        outcome = (
            f"beyond the claim's {tol:.0%} tolerance, so the verdict is UNDECIDED in simulation "
            f"(the seed CI alone: {claim.get('ci_verdict', '?')})"
        )
    return f"{head}{numbers}: {outcome}.{link}"


def headline_rows(data: ReportData) -> pd.DataFrame:
    """The forest plot's rows: each claim (its tolerance band and model band where known), then
    every comparison of the claims file this campaign holds, grouped by comparison."""
    rows: list[dict[str, Any]] = []
    for cl in _claim_rows(data):
        band_low, band_high = tolerance_band(float(cl["claimed"]), float(cl["tolerance"]))
        rows.append(
            {
                "group": f"claim {cl['id']} (paper mode: the reference's epoch loop)",
                "label": f"{cl['method']} over {cl['baseline']}",
                "method": cl["method"],
                "speedup": cl.get("speedup"),
                "ci_low": cl.get("ci_low"),
                "ci_high": cl.get("ci_high"),
                "model_band_low": cl.get("model_band_low"),
                "model_band_high": cl.get("model_band_high"),
                "band_low": band_low,
                "band_high": band_high,
                "method_cell": cl.get("method_cell"),
                "baseline_cell": cl.get("baseline_cell"),
                "why": "; ".join(cl.get("reasons") or []),
            }
        )
    comps = data.comparisons
    if not comps.empty:
        ids = {cl["id"] for cl in data.claims_in_campaign}
        titles = {c["id"]: c.get("title", c["id"]) for c in data.claims.get("comparisons", [])}
        several = comps.groupby("comparison")["workload"].nunique()
        for _, r in comps[comps["comparison"].isin(ids)].iterrows():
            if int(r["pairs"]) == 0:
                continue
            wl = f", {r['workload']}" if several.get(r["comparison"], 1) > 1 else ""
            rows.append(
                {
                    "group": f"{r['comparison']}: {titles.get(r['comparison'], '')}",
                    "method_cell": r.get("method_cell"),
                    "baseline_cell": r.get("baseline_cell"),
                    "label": f"{r['method']} over {r['baseline']}{wl}"
                    + (
                        f" ({int(r['pairs'])} seed{'s' if int(r['pairs']) != 1 else ''})"
                        if int(r["pairs"]) < 5
                        else ""
                    ),
                    "method": r["method"],
                    "speedup": r["speedup"],
                    "ci_low": r["ci_low"],
                    "ci_high": r["ci_high"],
                    "model_band_low": r.get("model_band_low"),
                    "model_band_high": r.get("model_band_high"),
                }
            )
    return pd.DataFrame(rows)


def own_rows(data: ReportData) -> pd.DataFrame:
    """The forest plot's rows for a user's campaign: every method over every baseline, grouped
    by context (cluster, model, executor), failed comparisons named."""
    own = data.own
    if own.empty:
        return pd.DataFrame()
    rows = []
    several = own["workload"].nunique() > 1
    for _, r in own.head(FOREST_MAX_ROWS).iterrows():
        failed = "failed" in str(r["outcome"])
        rows.append(
            {
                "group": f"{r['cluster']}, {r['model']} "
                f"({'simulated' if r['executor'] == 'sim' else 'measured'})",
                "label": f"{r['method']} over {r['baseline']}"
                + (f", {r['workload']}" if several else ""),
                "method": r["method"],
                "speedup": math.nan if failed else r["speedup"],
                "ci_low": r["ci_low"],
                "ci_high": r["ci_high"],
                "why": r["outcome"],
            }
        )
    return pd.DataFrame(rows)


def _rows_evidence(data: ReportData, rows: pd.DataFrame) -> str:
    """ "simulated", "measured" or both, from the executors of the cells behind ``rows``."""
    hashes = {
        h
        for col in ("method_cell", "baseline_cell")
        if col in rows
        for h in rows[col]
        if isinstance(h, str)
    }
    sel = data.cells[data.cells["config_hash"].isin(hashes)] if not data.cells.empty else data.cells
    kinds = (
        {"simulated" if e == "sim" else "measured" for e in sel["executor"]}
        if not sel.empty
        else set()
    )
    return " and ".join(sorted(kinds, reverse=True)) or "no data"


def _reading_name(r: dict[str, Any]) -> str:
    """A reading as the bullet names it: a short answer ("no") with its question."""
    reading = str(r.get("reading", ""))
    return f"{str(r.get('question', '')).rstrip('?')}? {reading}" if len(reading) < 12 else reading


def _depends_on(data: ReportData, claim: dict[str, Any]) -> list[str]:
    """What changes the verdict or the number, most telling first: the fair-mode comparison, the
    cost constants that flip it, the readings of the reference whose verdict differs from the
    headline's, the paper-mode table's other mixes, the readings that keep it."""
    out = []
    # variants are judged by their seed CI alone, so they are compared with the headline's
    verdict = str(claim.get("ci_verdict") or claim.get("verdict"))
    comps = data.comparisons
    if not comps.empty:
        fair = comps[(comps["comparison"] == "fair_mode") & (comps["pairs"] > 0)]
        for _, r in fair.iterrows():
            out.append(
                "Fair mode (same samples, one optimizer step per global batch): "
                f"{float(r['speedup']):.2f}x {_ci(r['ci_low'], r['ci_high'])}."
            )
    judged = next((r for r in data.claim_results if r.id == claim["id"]), None)
    if judged is not None and judged.sensitivity_verdicts:
        changed = [
            (v["constant"], v["factor"], v["speedup"], v["verdict"])
            for v in judged.sensitivity_verdicts
        ]
        flipped = [c for c in changed if c[3] != verdict]
        out.append(
            f"Cost-model constants halved or doubled ({len(changed)} variants, same seeds): "
            f"{min(c[2] for c in changed):.2f}x to {max(c[2] for c in changed):.2f}x; "
            + (
                "the verdict changes with "
                + "; ".join(f"{k} x{f:g} ({s:.2f}x: {v})" for k, f, s, v in flipped)
                if flipped
                else "no variant changes the verdict"
            )
            + "."
        )
    readings = [r for r in claim.get("what_it_takes") or [] if not r.get("headline_reading")]
    flips = [r for r in readings if str(r.get("verdict")) != verdict and _finite(r.get("speedup"))]
    if flips:
        out.append(
            "Readings of the reference's code that change the verdict (one choice at a time): "
            + "; ".join(
                f"{_reading_name(r)}: {float(r['speedup']):.2f}x ({r['verdict']})" for r in flips
            )
            + "."
        )
    table = pd.DataFrame(claim.get("paper_mode_table") or [])
    if not table.empty:
        wl = claim.get("workload")
        others = table[(table["method"] == claim["method"]) & (table["workload"] != wl)]
        if "cluster" in table and len(table[table["workload"] == wl]):
            ctx = table[(table["method"] == claim["method"]) & (table["workload"] == wl)]
            if len(ctx):
                others = others[others["cluster"].isin(set(ctx["cluster"].head(1)))]
        if len(others):
            out.append(
                "Other mixes, same clusters and loop: "
                + "; ".join(
                    f"{r['workload']} {float(r['speedup']):.2f}x"
                    for _, r in others.iterrows()
                    if _finite(r["speedup"])
                )
                + "."
            )
    same = [r for r in readings if str(r.get("verdict")) == verdict and _finite(r.get("speedup"))]
    if same:
        out.append(
            f"Readings that keep it {verdict}: "
            + "; ".join(f"{_reading_name(r)}: {float(r['speedup']):.2f}x" for r in same)
            + "."
        )
    return out


# A reproduction names the CPU calibration its real CPU section was priced with in a note that
# starts so (dcp_bench/campaign/reproduce.py): this machine's, or a mismatch.
CALIBRATION_NOTE = "CPU calibration: "


def calibration_note(data: ReportData) -> str | None:
    """The inputs' note on the CPU calibration, without its prefix (None when there is none)."""
    for note in getattr(data.inp, "notes", None) or []:
        if isinstance(note, str) and note.startswith(CALIBRATION_NOTE):
            return note[len(CALIBRATION_NOTE) :]
    return None


def _simulator_error_line(data: ReportData) -> str | None:
    calib = calibration_note(data)
    val = data.validation
    arr = (
        np.array([])
        if val.empty or "error" not in val
        else np.abs(val["error"].astype(float).to_numpy())
    )
    arr = arr[np.isfinite(arr)]
    if not arr.size:
        return f"The simulator's CPU check: calibration {calib}." if calib else None
    return (
        "The simulator against real training, measured here on CPU ranks: median error "
        f"{float(np.median(arr)):.0%} on step time"
        + (f", priced with calibration: {calib}" if calib else "")
        + " ([details](#simulator-against-measurement)); no GPU run of this suite checks the GPU "
        "model."
    )


def first_screen_section(doc: Document, data: ReportData) -> None:
    """The answer first: the claims' verdict when the campaign holds a claim's runs, else the
    campaign's own methods over its baselines."""
    if data.leads_with_claims:
        _claims_first_screen(doc, data)
    else:
        _own_first_screen(doc, data)


def claim_line(claim: dict[str, Any]) -> str:
    """One claim in one line, from the engine's decision (its summary row): the simulated
    speedup with its CI against the claimed value and the verdict, under each cost source the
    claim names (the first decides); "not judged" with the engine's reason without a number."""
    head = f"**{claim['id']}** (`{claim['method']}` over `{claim['baseline']}`): "
    rows = claim.get("by_cost_source") or [
        {
            "cost_source": None,
            "speedup": claim.get("speedup"),
            "ci95": [claim.get("ci_low"), claim.get("ci_high")],
            "verdict": claim["verdict"],
            "note": "; ".join(claim.get("reasons") or []),
        }
    ]
    notes = {str(r.get("note") or "no number").split("; ")[0] for r in rows}
    if len(notes) == 1 and not any(_finite(r.get("speedup")) for r in rows):
        return head + notes.pop() + "."  # the same reason under every cost source
    parts = []
    for i, r in enumerate(rows):
        where = f" under `{r['cost_source']}`" if r.get("cost_source") else ""
        if not _finite(r.get("speedup")):
            why = str(r.get("note") or "no number").split("; ")[0]
            parts.append(f"{why}{where}")
            continue
        word = str(r["verdict"])
        parts.append(
            f"{float(r['speedup']):.2f}x {_ci(*r['ci95'])} simulated{where} vs "
            f"{float(claim['claimed']):g}x claimed: "
            f"{word.upper() if word in VERDICT_WORDS else word}"
            + (" (the claim's verdict)" if i == 0 and len(rows) > 1 else "")
        )
    return head + "; ".join(parts) + "."


def claim_lines(data: ReportData) -> list[str]:
    """One line per claim of the claims file (`claim_line`), in its order; none for a claims
    file of one claim, whose verdict box below is that line."""
    if len(data.claim_results) < 2:
        return []
    return [claim_line(r.to_summary()) for r in data.claim_results]


def _claims_first_screen(doc: Document, data: ReportData) -> None:
    claims = _claim_rows(data)
    doc.h2("Verdict")
    lines = claim_lines(data)
    if lines:
        doc.bullets(lines)
    comp = completeness_line(data)
    if not claims:
        doc.callout(
            "No claim of the claims file has runs in this campaign; the comparisons it holds "
            "follow." + (f"\n{comp}" if comp else ""),
            anchor="answer",
        )
    for i, cl in enumerate(claims):
        doc.callout(
            "\n".join([*verdict_lines(data, cl), *([comp] if comp else [])]),
            anchor="answer" if i == 0 else f"answer-{i + 1}",
        )
        comp = None
    rows = headline_rows(data)
    if not rows.empty:
        kind = _rows_evidence(data, rows)
        bands = (
            rows[["model_band_low", "model_band_high"]].map(_finite).all(axis=1).any()
            if {"model_band_low", "model_band_high"} <= set(rows.columns)
            else False
        )
        doc.figure(
            fig.forest_plot(
                rows, f"Every headline comparison ({kind}; the headings name the mode)", data.colors
            ),
            FOREST_FIGURE,
            f"Every headline comparison ({kind}): speedup of method over baseline, 95% CI over "
            "paired seeds"
            + ("; pale bar: model band" if bands else "; model band: not computed")
            + "; shaded: the claimed value's tolerance band; line: 1x. Exact numbers: "
            "[headline comparisons](#headline-comparisons).",
        )
    facts = []
    for cl in claims:
        facts.append(_per_side(cl.get("trained_fraction"), "Share of the epoch each side trains"))
        if cl.get("imbalance") is not None:
            facts.append(_per_side(cl.get("imbalance"), "Idle share of rank-time, simulated"))
        ref_imb = {
            side: (acc or {}).get("reference_imbalance")
            for side, acc in (cl.get("epoch_accounting") or {}).items()
        }
        if any(v is not None for v in ref_imb.values()):
            facts.append(
                _per_side(
                    ref_imb,
                    "Imbalance as the reference estimates it from its profile (sampler.py:259-271)",
                )
            )
        facts += _depends_on(data, cl)
    err = _simulator_error_line(data)
    if err:
        facts.append(err)
    facts.append(
        "Method labels: [glossary](#method-labels); statistics and robustness: "
        "[verdict in detail](#verdict-in-detail); long tables: [appendix](#appendix)."
    )
    doc.p("**What the verdict rests on**")
    doc.bullets(facts)


def _own_first_screen(doc: Document, data: ReportData) -> None:
    own = data.own
    if data.default.empty:
        return
    doc.h2("Methods against baselines")  # the writer's comparison section continues it
    if own.empty:
        return
    counts = own["outcome"].astype(str).str.split(" \\(").str[0].value_counts()
    kind = (
        "simulated"
        if (own["executor"] == "sim").all()
        else ("measured" if (own["executor"] != "sim").all() else "simulated and measured")
    )
    doc.callout(
        f"{len(own)} comparisons of a method over a baseline ({kind}): "
        + ", ".join(f"{n} {k}" for k, n in counts.items())
        + ". Speedup = the baseline's median step time over "
        "the method's, seeds paired; the table and figures follow the plot.",
        anchor="answer",
    )
    rows = own_rows(data)
    more = f"; the first {FOREST_MAX_ROWS} of {len(own)}" if len(own) > FOREST_MAX_ROWS else ""
    doc.figure(
        fig.forest_plot(rows, f"Methods over baselines ({kind})", data.colors),
        FOREST_FIGURE,
        f"Every method over every baseline ({kind}{more}): speedup, 95% CI over paired seeds; "
        "line: 1x",
    )
    err = _simulator_error_line(data)  # the CPU check and its calibration, when measured
    if err:
        doc.p(err)


def method_source(target: Any) -> str:
    """What a method's planner class says it reproduces and its defaults, with their sources
    (`Planner.source`; empty when the class does not say or cannot be imported)."""
    module, _, attr = str(target or "").rpartition(".")
    if not module:
        return ""
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, ValueError):
        return ""
    return str(getattr(cls, "source", "") or "")


def glossary_section(doc: Document, data: ReportData) -> None:
    """Every method label of the campaign: its method family, mode and parameters, whether it
    is a baseline (colours follow the family in every figure), and for a peer the system it
    reproduces and its defaults, with their sources."""
    cells = data.cells
    if cells.empty:
        return
    rows = []
    for label, df in cells.groupby("label", sort=True):
        first = df.iloc[0]
        rows.append(
            {
                "label": label,
                "family (colour)": fig.method_family(str(label)),
                "mode": first.get("mode", ""),
                "baseline": bool(first["is_baseline"]),
                "parameters": first.get("params", ""),
                "source and defaults": method_source(first.get("target")),
            }
        )
    doc.h2("Method labels")
    doc.p(
        "A label is the method's name, the parameters it runs with where they differ from its "
        "defaults, and its mode: paper mode is the reference's own loop, otherwise fair mode. "
        "A peer's row names the system it reproduces and the defaults its users run, with their "
        "sources (baselines/README.md has the rules). "
        "Every figure gives a family one hue and its variants shades of it."
    )
    doc.table(pd.DataFrame(rows), "Method labels", appendix=False)
