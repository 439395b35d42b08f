"""`build_report`: a campaign's run records -> reports/<campaign>/ (report.md, report.html, CSV
tables, figures, summary.json).

The report leads with what the campaign has, in the same order for every campaign: the answer on
the first screen (`first_screen`: a campaign that holds a claim's runs opens with the verdict and
one forest plot of every headline comparison; any other, a user's own, with its methods against
its baselines), then the evidence section by section, then the method-label glossary, the
provenance and an appendix of long tables. Sections whose data the campaign lacks are left out
rather than shown empty. Every number traces to its run
records: the cells table names each cell's config hash (``<root>/<campaign>/<run_id>/config.yaml``
holds the config), the provenance section names the command, git sha and system description,
and simulated numbers name their cost-model source and its measured error. No absolute local
path appears in any report file.

A section is a function ``(Document, ReportData) -> None``; `report_sections` orders them. A new
section is one such function and one entry in that list.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dcp_bench.cost.base import DEFAULT_MEM_CAP_FRACTION
from dcp_bench.envinfo import git_state
from dcp_bench.files import atomic_write_json
from dcp_bench.paths import REPO_ROOT, REPORTS_DIR, RESULTS_DIR
from dcp_bench.report import figures as fig
from dcp_bench.report.adoption import adoption_section
from dcp_bench.report.claims import (
    decompose,
    evaluate_claims,
    evaluate_comparisons,
    judge_sensitivity,
    load_claims,
    reference_tables_section,
    sensitivity,
)
from dcp_bench.report.document import Document
from dcp_bench.report.first_screen import first_screen_section, glossary_section
from dcp_bench.report.memory import memory_decisions_section
from dcp_bench.report.memory_error import memory_prediction_error
from dcp_bench.report.peers import peer_section
from dcp_bench.report.planning import machine_bound_section, planning_cost_section
from dcp_bench.report.stats import max_relative_difference, relative_error
from dcp_bench.report.system_validation import ROW_FIELDS
from dcp_bench.report.tables import (
    Campaign,
    cell_table,
    comparison_flags,
    comparison_outcome,
    comparison_table,
    load_campaign,
    speedup_table,
    write_csv,
)

CELL_COLUMNS = [
    "workload",
    "cluster",
    "model",
    "label",
    "params",
    "scales_label",
    "executor",
    "repeats",
    "failures",
    "median_s",
    "olympic_mean_s",
    "cv",
    "p5_s",
    "p95_s",
    "tokens_per_s",
    "imbalance",
    "peak_mem_gib",
    "mem_cap_gib",
    "mfu",
    "planner_ms",
    "cost_source",
    "config_hash",
    "flags",
]
SIM_ERROR_TARGET = 0.15
MAX_CONTEXT_FIGURES = (
    4  # contexts (cluster, model, executor) that get step-time / memory / plan-shape figures
)


@dataclass
class ReportInputs:
    root: str | os.PathLike[str]
    campaign: str
    out_dir: str | os.PathLike[str]
    claims_path: str | os.PathLike[str] = RESULTS_DIR / "reference" / "claims.yaml"
    command: str = ""
    notes: list[str] = field(default_factory=list)  # what was not run, budgets, deviations
    n_boot: int = 2000
    title: str = ""
    baselines: list[str] | None = (
        None  # method names treated as baselines (default: classes in `baselines.`)
    )
    baseline_pairs: bool = False  # also compare baselines with each other
    # How much of a budgeted reproduction ran: {"complete": bool, "sections_done": n,
    # "sections_total": m, "cut": [...]}; shown on the first screen and kept in summary.json.
    completeness: dict[str, Any] | None = None


# --------------------------------------------------------------------------------------------
# Paths: reports are shared, so they never name a folder of the machine that wrote them.

_ABS_PATH = re.compile(r"(?<![\w.~/:-])(/[^\s'\"`,;:()\[\]{}<>|]+)")


def shown_path(path: str | os.PathLike[str]) -> str:
    """A path as a report shows it: relative to the current folder or the repository when under
    either, else ``.../<name>``; relative paths as given."""
    p = Path(path)
    if not p.is_absolute():
        return str(p)
    for base in (Path.cwd(), REPO_ROOT):
        try:
            rel = p.resolve().relative_to(base.resolve())
        except ValueError:
            continue
        return str(rel) if str(rel) != "." else "."
    return f".../{p.name}"


def scrub_paths(text: Any) -> str:
    """``text`` with every absolute path replaced by its `shown_path`."""
    return _ABS_PATH.sub(lambda m: shown_path(m.group(1)), str(text))


# --------------------------------------------------------------------------------------------
# What the report reads


def _default_context(cells: pd.DataFrame) -> pd.DataFrame:
    """Cells at the default cost constants and memory cap (not sensitivity variants)."""
    if cells.empty:
        return cells
    return cells[
        (cells["scales"] == "{}")
        & np.isclose(cells["mem_cap_fraction"].astype(float), DEFAULT_MEM_CAP_FRACTION)
    ]


def calibration_error() -> dict[str, Any] | None:
    """The committed calibrations that state their measured error: a README under
    results/calibration/ (named, not excerpted) or the error fields of a JSON artifact."""
    folder = RESULTS_DIR / "calibration"
    if not folder.is_dir():
        return None
    found: dict[str, Any] = {}
    for path in sorted(folder.rglob("README.md")):
        if "error" in path.read_text().lower():
            found[str(path.relative_to(REPO_ROOT))] = "states the calibration's measured error"
    for path in sorted(folder.rglob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(data, dict):
            for key in ("validation", "error", "errors", "fit_error", "held_out"):
                if data.get(key) is not None:
                    found[str(path.relative_to(REPO_ROOT))] = {key: data[key]}
    return found or None


def cost_models_used(c: Campaign) -> list[str]:
    """One line per cost model behind the simulated runs: source, cluster, model, and for a
    profiled source its artifact, hash and fit error."""
    if c.runs.empty or "cost_desc" not in c.runs:
        return []
    out = []
    variants = 0
    for desc_json in sorted(set(c.runs.loc[c.runs["executor"] == "sim", "cost_desc"])):
        d = json.loads(desc_json or "{}")
        if not d:
            continue
        if any(float(v) != 1.0 for v in (d.get("scales") or {}).values()):
            variants += 1  # sensitivity variants: listed in the sensitivity section
            continue
        prof = d.get("profile") if isinstance(d.get("profile"), dict) else {}
        bits = [f"`{d.get('source')}` cost model of {d.get('model')} on {d.get('cluster')}"]
        path = prof.get("path") or d.get("profile_path")
        if path:
            bits.append(
                f"profile `{path}` (sha256 "
                f"{str(prof.get('sha256') or d.get('profile_sha256'))[:12]})"
            )
        err = d.get("fit_max_rel_err") or prof.get("fit_max_rel_err")
        if err is not None:
            bits.append(f"in-sample fit max relative error {json.dumps(err, default=str)[:200]}")
        if d.get("source") == "analytical":
            bits.append(
                "calibrated against published H100/H200 measurements (results/validation), not "
                "yet against a measured run of this suite"
                if "cpu" not in str(d.get("cluster"))
                else "analytical CPU constants"
            )
        out.append(", ".join(bits))
    if variants:
        out.append(f"and {variants} sensitivity variants of these (constants halved / doubled)")
    return out


def validation_table(c: Campaign, cells: pd.DataFrame) -> pd.DataFrame:
    """Measured (torch executor) against simulated cells of the same method, workload, model and
    cluster: median step time and its relative error."""
    if cells.empty or "torch" not in set(cells["executor"]):
        return pd.DataFrame()
    sim = cells[cells["executor"] == "sim"]
    rows = []
    for _, t in cells[cells["executor"] == "torch"].iterrows():
        match = sim[
            (sim["label"] == t["label"])
            & (sim["workload"] == t["workload"])
            & (sim["model"] == t["model"])
            & (sim["cluster"] == t["cluster"])
            & (sim["params"] == t["params"])
        ]
        s = match.iloc[0] if len(match) else None
        sim_s = float(s["median_s"]) if s is not None else math.nan
        rows.append(
            {
                "workload": t["workload"],
                "model": t["model"],
                "method": t["label"],
                "is_baseline": t["is_baseline"],
                "measured_s": float(t["median_s"]),
                "measured_cv": t["cv"],
                "simulated_s": sim_s,
                "error": relative_error(sim_s, float(t["median_s"])),
                "cost_source": s["cost_source"] if s is not None else None,
                "measured_cell": t["config_hash"],
                "simulated_cell": s["config_hash"] if s is not None else None,
            }
        )
    return pd.DataFrame(rows)


def validation_speedups(v: pd.DataFrame) -> pd.DataFrame:
    """Speedup of every non-baseline method over every baseline, measured and simulated."""
    rows = []
    for wl, df in v.groupby("workload", sort=False):
        for _, b in df[df["is_baseline"]].iterrows():
            for _, m in df[~df["is_baseline"]].iterrows():
                meas = b["measured_s"] / m["measured_s"]
                simv = b["simulated_s"] / m["simulated_s"]
                rows.append(
                    {
                        "workload": wl,
                        "method": m["method"],
                        "baseline": b["method"],
                        "measured_speedup": meas,
                        "simulated_speedup": simv,
                        "error": relative_error(simv, meas),
                    }
                )
    return pd.DataFrame(rows)


@dataclass
class ReportData:
    """Everything the report's sections read, computed once from the campaign's records."""

    inp: ReportInputs
    campaign: Campaign
    claims: dict[str, Any]
    cells: pd.DataFrame
    default: pd.DataFrame  # cells at default cost constants
    speedups: pd.DataFrame  # every method over every baseline (baselines over each other too)
    own: pd.DataFrame  # the campaign's own comparisons: methods over baselines, outcome and flags
    claim_results: list[Any]
    comparisons: pd.DataFrame
    sensitivity: pd.DataFrame
    validation: pd.DataFrame
    validation_speedups: pd.DataFrame
    git: dict[str, Any]
    env: dict[str, Any]
    calibration: dict[str, Any] | None
    colors: dict[str, Any] = field(
        default_factory=dict
    )  # one colour per method label, every figure
    decompositions: list[pd.DataFrame] = field(default_factory=list)

    @property
    def failed(self) -> pd.DataFrame:
        runs = self.campaign.runs
        return runs[runs["status"] != "ok"] if not runs.empty else runs

    @property
    def claims_in_campaign(self) -> list[dict[str, Any]]:
        """The claims and comparisons of the claims file whose context (workload, cluster,
        model) holds at least one cell of this campaign."""
        items = [*self.claims.get("claims", []), *self.claims.get("comparisons", [])]
        return [cl for cl in items if not _context_cells(self.default, cl.get("context", {})).empty]

    @property
    def leads_with_claims(self) -> bool:
        ids = {cl["id"] for cl in self.claims_in_campaign}
        return any(r.id in ids and r.result.pairs > 0 for r in self.claim_results) or (
            not self.comparisons.empty and bool((self.comparisons["pairs"] > 0).any())
        )


def _context_cells(cells: pd.DataFrame, context: dict[str, Any]) -> pd.DataFrame:
    if cells.empty:
        return cells
    mask = np.ones(len(cells), dtype=bool)
    for key in ("workload", "cluster", "model"):
        if key in context:
            want = context[key] if isinstance(context[key], (list, tuple)) else [context[key]]
            mask &= cells[key].isin([str(v) for v in want]).to_numpy()
    return cells[mask]


def gather_report_data(inp: ReportInputs) -> ReportData:
    """Read the campaign and compute every table the report shows."""
    c = load_campaign(inp.root, inp.campaign, baselines=inp.baselines)
    claims = load_claims(inp.claims_path)
    cells = cell_table(c)
    if not cells.empty:
        cells["scales_label"] = [
            fig.scales_label(s, m) for s, m in zip(cells["scales"], cells["mem_cap_fraction"])
        ]
    default = _default_context(cells)
    speedups = speedup_table(c, default, n_boot=inp.n_boot) if not default.empty else pd.DataFrame()
    own = comparison_table(speedups, default, baseline_pairs=inp.baseline_pairs)
    claim_results = evaluate_claims(c, cells, claims, n_boot=inp.n_boot) if not cells.empty else []
    comparisons = (
        evaluate_comparisons(c, cells, claims, n_boot=inp.n_boot)
        if not cells.empty
        else pd.DataFrame()
    )
    sens = (
        sensitivity(c, cells, claims, n_boot=max(500, inp.n_boot // 2))
        if not cells.empty
        else pd.DataFrame()
    )
    judge_sensitivity(claim_results, sens)
    validation = validation_table(c, cells)
    val_sp = validation_speedups(validation) if not validation.empty else pd.DataFrame()
    colors = fig.method_colors(cells["label"]) if not cells.empty else {}
    return ReportData(
        inp=inp,
        campaign=c,
        claims=claims,
        cells=cells,
        default=default,
        speedups=speedups,
        own=own,
        claim_results=claim_results,
        comparisons=comparisons,
        sensitivity=sens,
        validation=validation,
        validation_speedups=val_sp,
        git=git_state(),
        env=next(iter(c.envs.values()), {}),
        calibration=calibration_error(),
        colors=colors,
    )


Section = Callable[[Document, "ReportData"], None]


def report_sections(data: ReportData) -> list[Section]:
    """The sections in reading order. The first screen gives the answer (the claims' verdict
    when the campaign holds a claim's runs, else its own methods against its baselines), the
    section that answer comes from follows it, then the rest of the evidence, the glossary and
    provenance; long tables land in the appendix (`Document.table`)."""
    claim_sections: list[Section] = [
        _verdict_section,
        _system_validation_section,
        _headline_section,
        _reference_section,
        _decomposition_section,
        _sensitivity_section,
        _calibration_section,
    ]
    lead: list[Section] = (
        [*claim_sections, _opening, _comparison_section]
        if data.leads_with_claims
        else [_comparison_section, _opening, *claim_sections]
    )
    return [
        first_screen_section,
        *lead,
        peer_section,
        machine_bound_section,
        planning_cost_section,
        _context_section,
        _scaling_section,
        _validation_section,
        _cells_section,
        _workloads_section,
        adoption_section,
        glossary_section,
        _provenance_section,
    ]


def _reference_section(doc: Document, data: ReportData) -> None:
    """The claims' paper-mode table on the reference's mixes and "what it takes" table, for the
    claims this campaign holds runs of."""
    ids = {cl["id"] for cl in data.claims_in_campaign}
    reference_tables_section(
        doc, [r for r in data.claim_results if r.id in ids and r.result.pairs > 0]
    )
    memory_decisions_section(
        doc, [r for r in data.claim_results if r.id in ids and r.result.pairs > 0]
    )


def build_report(inp: ReportInputs) -> dict[str, Any]:
    """Write the report; return the summary (also written as summary.json)."""
    data = gather_report_data(inp)
    doc = Document(inp.title or f"dcp-bench report: {inp.campaign}")
    for section in report_sections(data):
        section(doc, data)
    paths = doc.write(Path(inp.out_dir))
    return _write_summary(data, paths)


# --------------------------------------------------------------------------------------------
# Labels every section uses


def evidence(cells: pd.DataFrame, runs: pd.DataFrame | None = None) -> str:
    """Whether ``cells``' numbers are simulated (and by which cost model) or measured (and on
    what), for titles and captions."""
    if cells.empty:
        return "no data"
    parts = []
    sim = cells[cells["executor"] == "sim"]
    if not sim.empty:
        sources = ", ".join(sorted({str(s) for s in sim["cost_source"] if s}))
        parts.append(f"simulated ({sources} cost model)" if sources else "simulated")
    real = cells[cells["executor"] != "sim"]
    if not real.empty:
        hw = (
            sorted(
                {
                    str(h)
                    for h in runs.loc[runs["config_hash"].isin(real["config_hash"]), "hardware"]
                    if h
                }
            )
            if runs is not None and not runs.empty
            else []
        )
        parts.append(f"measured ({', '.join(hw)})" if hw else "measured")
    return " and ".join(parts)


def _contexts(cells: pd.DataFrame) -> list[tuple[tuple[str, str, str], pd.DataFrame]]:
    """Default-constant cells grouped by (cluster, model, executor), largest group first."""
    if cells.empty:
        return []
    groups = [
        ((str(key[0]), str(key[1]), str(key[2])), df)
        for key, df in cells.groupby(["cluster", "model", "executor"], sort=False)
    ]
    return sorted(groups, key=lambda g: -len(g[1]))


def _fig_name(*parts: Any) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", "_".join(str(p) for p in parts)).strip("_")


def _x(v: float) -> str:
    return f"{v:.2f}x" if math.isfinite(v) else "-"


# --------------------------------------------------------------------------------------------
# Sections


def _opening(doc: Document, data: ReportData) -> None:
    inp, c, cells, git = data.inp, data.campaign, data.cells, data.git
    runs = c.runs
    n_ok = int((runs["status"] == "ok").sum()) if not runs.empty else 0
    bits = [
        f"Campaign `{inp.campaign}`: {len(runs)} complete runs ({n_ok} ok, {len(runs) - n_ok} "
        f"failed) in {len(cells)} cells"
    ]
    if c.incomplete:
        bits.append(f"{len(c.incomplete)} incomplete runs ignored")
    if c.cut_by_budget:
        bits.append(
            f"{len(c.cut_by_budget)} runs cut short by the time budget left out (not counted as "
            "failures; a resumed run redoes them)"
        )
    if c.skipped:
        bits.append(
            f"**{len(c.skipped)} unreadable record(s) skipped**: "
            + "; ".join(f"`{rid}` ({scrub_paths(why)})" for rid, why in c.skipped[:10])
            + (" ..." if len(c.skipped) > 10 else "")
        )
    text = ", ".join(bits) + "."
    doc.h2("About this campaign")
    if not cells.empty:
        methods = sorted(set(cells.loc[~cells["is_baseline"].astype(bool), "label"]))
        bases = sorted(set(cells.loc[cells["is_baseline"].astype(bool), "label"]))
        text += (
            f" {len(methods)} method label(s) and {len(bases) or 'no'} baseline "
            f"label(s){'' if bases else ' (name them with baselines=a,b)'} (every label: "
            f"[glossary](#method-labels)); workloads {', '.join(sorted(set(cells['workload'])))}; "
            f"clusters {', '.join(sorted(set(cells['cluster'])))}; models "
            f"{', '.join(sorted(set(cells['model'])))}. Numbers are {evidence(cells, runs)}."
        )
        if (
            not data.default.empty
            and (
                (data.default["executor"] == "sim")
                & (data.default["cost_source"] == "analytical")
                & (data.default["cluster"] != "cpu")
            ).any()
        ):
            text += (
                " The analytical GPU cost model is calibrated against published H100/H200 "
                "measurements (`dcp-bench validate`, results/validation: its held-out error is in "
                "the section on published measurements), not yet against a GPU run of this suite: "
                "its speedups are model predictions"
                + (
                    " (the sensitivity section shows how they move with its uncertain constants)."
                    if _has_sensitivity(data)
                    else "."
                )
            )
        if "torch" not in set(cells["executor"]):
            text += " No measured runs: the simulator's error is not measured in this campaign."
    text += (
        " Generated by "
        f"`{scrub_paths(inp.command or 'dcp-bench report campaign=' + inp.campaign)}` at git "
        f"`{(git.get('git_sha') or 'unknown')[:12]}`"
        f"{' (dirty tree)' if git.get('git_dirty') else ''}."
    )
    doc.p(text)


def _comparison_section(doc: Document, data: ReportData) -> None:
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
            _x(v) if "failed" not in o else "-" for v, o in zip(own["speedup"], own["outcome"])
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
            _fig_name("speedup", cluster, model, executor),
            f"Speedup over each baseline ({kind}; {cluster}, {model}); error bars: 95% "
            "paired-bootstrap CI; hatched: failed",
        )


def _verdict_section(doc: Document, data: ReportData) -> None:
    ids = {cl["id"] for cl in data.claims_in_campaign}
    results = [r for r in data.claim_results if r.id in ids]
    if not results:
        return
    doc.h2("Verdict in detail")
    robustness = _robustness(data.claim_results)
    for r in results:
        doc.p(
            f"**{r.id}: {r.verdict.upper()}.** Claim: {r.statement} (claimed {r.claimed:g}x, "
            f"tolerance {r.tolerance:.0%})."
        )
        flags = (
            []
            if r.result.pairs == 0
            else _flag_text(r.result.speedup, r.result.ci_low, r.result.ci_high, r.result.pairs)
        )
        simulated = _all_simulated(data.cells, [r.result.method_cell, r.result.baseline_cell])
        doc.bullets(
            [
                *(_simulated_word(x) if simulated else x for x in r.reasons),
                *robustness.get(r.id, []),
                *flags,
            ]
        )
    calib = data.calibration
    if calib and _uses_calibration(data):
        doc.p("CPU calibration on record: " + ", ".join(f"`{k}`" for k in calib) + ".")
    validation = data.validation
    if not validation.empty and validation["error"].notna().any():
        med = _nanmedian_abs(validation["error"])
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


def _system_validation_section(doc: Document, data: ReportData) -> None:
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


def _all_simulated(cells: pd.DataFrame, hashes: list[str | None]) -> bool:
    sel = cells[cells["config_hash"].isin([h for h in hashes if h])] if not cells.empty else cells
    return not sel.empty and bool((sel["executor"] == "sim").all())


def _simulated_word(reason: str) -> str:
    """A reason line of a simulated result: it says "simulated", not "measured"."""
    return "simulated " + reason[len("measured ") :] if reason.startswith("measured ") else reason


def _flag_text(speedup: float, lo: float, hi: float, pairs: int) -> list[str]:
    flags = comparison_flags(speedup, lo, hi, pairs)
    return [f"**flag**: {'; '.join(flags)}"] if flags else []


def _headline_section(doc: Document, data: ReportData) -> None:
    ids = {cl["id"] for cl in data.claims_in_campaign}
    if not ids:
        return
    head_rows = [
        {
            "comparison": r.id,
            "workload": r.result.workload,
            "method": r.result.method,
            "baseline": r.result.baseline,
            "speedup": r.result.speedup,
            "ci_low": r.result.ci_low,
            "ci_high": r.result.ci_high,
            "pairs": r.result.pairs,
            "metric": r.result.metric,
            "note": r.verdict,
            "baseline_cell": r.result.baseline_cell,
            "method_cell": r.result.method_cell,
        }
        for r in data.claim_results
    ]
    comparisons = data.comparisons
    head = (
        pd.concat([pd.DataFrame(head_rows), comparisons], ignore_index=True)
        if head_rows or not comparisons.empty
        else pd.DataFrame()
    )
    if head.empty:
        return
    head = head[head["comparison"].isin(ids)]
    missing = head[head["pairs"] == 0]
    head = head[head["pairs"] > 0]
    if head.empty:
        return
    doc.h2("Headline comparisons")
    by_cell = data.cells.set_index("config_hash")
    outcomes, flags = [], []
    for _, r in head.iterrows():
        v, lo, hi, n = float(r["speedup"]), float(r["ci_low"]), float(r["ci_high"]), int(r["pairs"])
        if r["method_cell"] in by_cell.index and r["baseline_cell"] in by_cell.index:
            outcomes.append(
                comparison_outcome(
                    v, lo, hi, by_cell.loc[r["method_cell"]], by_cell.loc[r["baseline_cell"]]
                )
            )
        else:
            outcomes.append("")
        flags.append(
            "; ".join(comparison_flags(v, lo, hi, n)) if "failed" not in outcomes[-1] else ""
        )
    failed = ["failed" in o for o in outcomes]
    shown = head.assign(
        outcome=outcomes,
        flags=flags,
        speedup=["-" if f else _x(float(v)) for v, f in zip(head["speedup"], failed)],
        ci95=[
            "-"
            if f or not (math.isfinite(float(lo)) and math.isfinite(float(hi)))
            else f"[{float(lo):.2f}, {float(hi):.2f}]"
            for lo, hi, f in zip(head["ci_low"], head["ci_high"], failed)
        ],
    )
    doc.table(
        shown,
        "Speedup of method over baseline: median of paired per-seed ratios, 95% paired-bootstrap "
        "CI",
        [
            "comparison",
            "workload",
            "method",
            "baseline",
            "speedup",
            "ci95",
            "pairs",
            "metric",
            "outcome",
            "note",
            "flags",
        ],
    )
    if not missing.empty:
        by_id = missing.groupby("comparison", sort=False).size()
        doc.p(
            f"Not in this campaign (no runs, so no number): {len(missing)} pair(s) of "
            + ", ".join(f"`{k}` ({v})" for k, v in by_id.items())
            + "; `tables/comparisons.csv` lists them."
        )
    doc.p(
        "`metric=throughput`: tokens per second (used whenever a side runs in paper mode, which "
        "trains a different number of samples per step); `metric=step_time`: ratio of median step "
        "times (fair mode: every method trains the same samples with one optimizer step per "
        "global batch)."
    )


def _decomposition_section(doc: Document, data: ReportData) -> None:
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
        kind = evidence(_context_cells(data.default, cl["context"]), c.runs)
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


def _has_sensitivity(data: ReportData) -> bool:
    sens = data.sensitivity
    return not sens.empty and bool(np.isfinite(sens["speedup"].astype(float)).any())


def _sensitivity_section(doc: Document, data: ReportData) -> None:
    claims, sens = data.claims, data.sensitivity
    if not _has_sensitivity(data):
        return
    doc.h2("Sensitivity to uncertain cost-model constants")
    by_id = {x["id"]: x for x in [*claims.get("claims", []), *claims.get("comparisons", [])]}
    for comp_id in dict.fromkeys(sens["comparison"]):
        cl = by_id.get(comp_id, {})
        kind = evidence(_context_cells(data.cells, cl.get("context", {})), data.campaign.runs)
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


def published_validation() -> dict[str, Any] | None:
    """The committed validation of the analytical GPU model against published measurements
    (`dcp-bench validate`, results/validation/summary.json), or None when absent or unreadable."""
    try:
        doc = json.loads((RESULTS_DIR / "validation" / "summary.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return doc if isinstance(doc, dict) and "after" in doc and "before" in doc else None


def _calibration_section(doc: Document, data: ReportData) -> None:
    """Beside the sensitivity section: how far the analytical GPU model is from published
    measurements, before and after its constants were fitted (held-out rows)."""
    cells = data.default
    if (
        cells.empty
        or not (
            (cells["executor"] == "sim")
            & (cells["cost_source"] == "analytical")
            & (cells["cluster"] != "cpu")
        ).any()
    ):
        return
    val = published_validation()
    if val is None:
        return
    doc.h2("The GPU cost model against published measurements")
    rows = []
    for part, label in (
        ("holdout", "held-out half"),
        ("fit", "fit half"),
        ("reference", "references (not priced)"),
    ):
        b, a = val["before"].get(part) or {}, val["after"].get(part) or {}
        rows.append(
            {
                "rows": label,
                "n": a.get("n"),
                "median_abs_error_before": b.get("median_abs_error"),
                "median_abs_error_after": a.get("median_abs_error"),
                "max_abs_error_before": b.get("max_abs_error"),
                "max_abs_error_after": a.get("max_abs_error"),
            }
        )
    kinds = [
        {
            "rows": f"held-out: {kind}",
            "n": v.get("n"),
            "median_abs_error_after": v.get("median_abs_error"),
            "max_abs_error_after": v.get("max_abs_error"),
        }
        for kind, v in sorted((val.get("by_kind_holdout_after") or {}).items())
        if v.get("n")
    ]
    doc.table(
        pd.DataFrame([*rows, *kinds]),
        "Error of the analytical model's rates against published H100/H200 measurements (model / "
        "published - 1), before and after fitting its uncertain constants on half the rows",
    )
    doc.p(
        "From results/validation (rebuilt by `dcp-bench validate`; every row, its source and what "
        "the model does not price are in results/validation/table.md). The constants no public "
        "number pins stay in the sensitivity sweep above. These are kernel, collective and "
        "whole-model rates, not a GPU run of this suite: the simulated speedups remain model "
        "predictions."
    )


def _context_section(doc: Document, data: ReportData) -> None:
    c = data.campaign
    contexts = _contexts(data.default)
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
        name = _fig_name(cluster, model, executor)
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


def _scaling_section(doc: Document, data: ReportData) -> None:
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


def _validation_section(doc: Document, data: ReportData) -> None:
    c = data.campaign
    validation = data.validation
    val_sp = data.validation_speedups
    if validation.empty:
        return
    doc.h2("Simulator against measurement")
    med_err = _nanmedian_abs(validation["error"])
    max_err = (
        float(np.nanmax(np.abs(validation["error"].astype(float))))
        if validation["error"].notna().any()
        else math.nan
    )
    doc.p(
        f"Median absolute error of the simulated median step time: **{med_err:.1%}** (max "
        f"{max_err:.1%}; target within {SIM_ERROR_TARGET:.0%}). The simulated runs use the cost "
        "model named in `cost_source`; the measured ones ran on this machine's ranks."
    )
    doc.table(
        validation,
        "Median step time, measured vs simulated",
        [
            "workload",
            "model",
            "method",
            "measured_s",
            "measured_cv",
            "simulated_s",
            "error",
            "cost_source",
        ],
    )
    if not val_sp.empty:
        sp_err = _nanmedian_abs(val_sp["error"])
        doc.p(f"Median absolute error of the simulated speedup: **{sp_err:.1%}**.")
        doc.table(val_sp, "Speedup, measured vs simulated")
    doc.figure(
        fig.sim_vs_measured(validation, "simulated vs measured median step time", data.colors),
        "sim_vs_measured",
        "Simulated (vertical) against measured (horizontal) median step time",
    )
    loss = _loss_parity(c)
    if not loss.empty:
        doc.table(
            loss,
            "Loss parity: max relative difference of per-step losses against the first method, "
            "same seed",
        )


def _cells_section(doc: Document, data: ReportData) -> None:
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


def _workloads_section(doc: Document, data: ReportData) -> None:
    c = data.campaign
    if c.runs.empty:
        return
    rows = []
    for name in sorted(set(c.runs["workload"])):
        info = c.workloads.get(name, {})
        prov = info.get("provenance") or {}
        data_file = prov.get("data_file")
        rows.append(
            {
                "workload": name,
                "description": info.get("description", ""),
                "source": scrub_paths(prov.get("source", "not recorded")),
                "licence": prov.get("licence", "not recorded"),
                "data file": shown_path(data_file) if data_file else "-",
                "sha256": prov.get("data_sha256", "-"),
            }
        )
    doc.h2("Workloads and their data")
    doc.p(
        "What the runs recorded about their workload (`run.json` -> `extra.workload`): the "
        "config's description, source and licence, and the SHA-256 of the data file the runs read."
    )
    doc.table(pd.DataFrame(rows), "")


def _provenance_section(doc: Document, data: ReportData) -> None:
    inp, c, git, env, calib = data.inp, data.campaign, data.git, data.env, data.calibration
    doc.h2("Provenance")
    items = [
        f"command: `{scrub_paths(inp.command or 'dcp-bench report campaign=' + inp.campaign)}`",
        f"git sha: `{git.get('git_sha')}`, dirty: {git.get('git_dirty')}",
        f"run records: `{shown_path(Path(inp.root) / inp.campaign)}/<run_id>/` (config.yaml, "
        "env.json, steps.jsonl, run.json); run ids end in the cell's config hash and the seed",
        f"system: {env.get('cpu_model', '?')}, {env.get('cpu_cores', '?')} cores, torch "
        f"{env.get('torch', '?')}, python {env.get('python', '?')}, host "
        f"{env.get('hostname', '?')}",
        *[f"cost model: {scrub_paths(line)}" for line in cost_models_used(c)[:12]],
        *(
            [
                "calibration on record: "
                + (
                    "; ".join(
                        f"`{k}` ({v if isinstance(v, str) else json.dumps(v, default=str)[:200]})"
                        for k, v in calib.items()
                    )
                    if calib
                    else "no calibration error on record in results/calibration/"
                )
            ]
            if _uses_calibration(data)
            else []
        ),
        "planner time: measured on this machine (CPU and wall time), charged per "
        "`run.planner_time` (default: none on the simulator, CPU time on measured runs) and "
        "`run.planner_clock` (default overlap: max(step, planner))",
    ]
    doc.bullets(items)
    doc.bullets([scrub_paths(n) for n in inp.notes])


def _uses_calibration(data: ReportData) -> bool:
    """Whether any number rests on a measured profile (the calibration matters to it)."""
    cells = data.cells
    return not cells.empty and bool(
        ((cells["cost_source"] == "profiled") | (cells["executor"] != "sim")).any()
    )


def _write_summary(data: ReportData, paths: dict[str, Any]) -> dict[str, Any]:
    inp, c, cells = data.inp, data.campaign, data.cells
    validation, val_sp = data.validation, data.validation_speedups
    out = Path(inp.out_dir)
    decs = data.decompositions
    runs = (
        c.runs.assign(error=[scrub_paths(e) if e else e for e in c.runs["error"]])
        if not c.runs.empty
        else c.runs
    )
    tables = {
        "cells": cells,
        "speedups": data.speedups,
        "method_vs_baseline": data.own,
        "comparisons": data.comparisons,
        "sensitivity": data.sensitivity,
        "validation": validation,
        "validation_speedups": val_sp,
        "decomposition": pd.concat(decs, ignore_index=True) if decs else pd.DataFrame(),
        "runs": runs,
    }
    for name, df in tables.items():
        if df is not None and not df.empty:
            write_csv(df, out / "tables" / f"{name}.csv")
    summary = {
        "campaign": inp.campaign,
        "command": scrub_paths(inp.command),
        "git_sha": data.git.get("git_sha"),
        "git_dirty": data.git.get("git_dirty"),
        "runs": int(len(c.runs)),
        "failed_runs": int(len(data.failed)),
        "runs_cut_by_budget": len(data.campaign.cut_by_budget),
        "memory_prediction_error": memory_prediction_error(data.inp.root, data.inp.campaign),
        "skipped_records": [{"run_id": rid, "why": scrub_paths(why)} for rid, why in c.skipped],
        "method_vs_baseline": _records(data.own),
        "claims": [r.to_summary() for r in data.claim_results],
        "comparisons": _records(data.comparisons),
        "sensitivity": _records(data.sensitivity),
        "simulator_error": {
            "median_abs_step_time_error": _none_if_nan(_nanmedian_abs(validation["error"]))
            if not validation.empty
            else None,
            "median_abs_speedup_error": _none_if_nan(_nanmedian_abs(val_sp["error"]))
            if not val_sp.empty
            else None,
            "target": SIM_ERROR_TARGET,
            "cells": _records(validation),
        },
        "workloads": {
            k: json.loads(scrub_paths(json.dumps(v, default=str))) for k, v in c.workloads.items()
        },
        "calibration": data.calibration,
        "notes": [scrub_paths(n) for n in inp.notes],
        **({"completeness": inp.completeness} if inp.completeness is not None else {}),
        "report": {k: shown_path(v) for k, v in paths.items()},
    }
    atomic_write_json(out / "summary.json", summary)
    # The caller (a command printing where the report is) gets the real paths; the file does not.
    return {**summary, "report": {k: str(v) for k, v in paths.items()}}


def _nanmedian_abs(values: pd.Series) -> float:
    """Median of |values| over the finite ones; nan when there are none (no warning)."""
    arr = np.abs(values.astype(float).to_numpy())
    arr = arr[np.isfinite(arr)]
    return float(np.median(arr)) if arr.size else math.nan


def _none_if_nan(x: float) -> float | None:
    return None if math.isnan(x) else x


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
    if df is None or df.empty:
        return []
    clean = df.replace([np.inf, -np.inf], None).astype(object).where(df.notna(), None)
    return [{k: v for k, v in row.items()} for row in clean.to_dict(orient="records")]


def _robustness(results: list[Any]) -> dict[str, list[str]]:
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


def _loss_parity(c: Campaign) -> pd.DataFrame:
    torch_runs = c.runs[c.runs["executor"] == "torch"] if not c.runs.empty else c.runs
    if torch_runs.empty or c.steps.empty:
        return pd.DataFrame()
    rows = []
    for (wl, seed), df in torch_runs.groupby(["workload", "seed"]):
        losses = {}
        for _, r in df.iterrows():
            st = c.steps[c.steps["run_id"] == r["run_id"]].sort_values("step")
            if st["loss"].notna().any():
                losses[r["label"]] = list(st["loss"].astype(float))
        if len(losses) < 2:
            continue
        ref_name, ref = next(iter(losses.items()))
        for name, ls in losses.items():
            if name != ref_name:
                rows.append(
                    {
                        "workload": wl,
                        "seed": seed,
                        "reference": ref_name,
                        "method": name,
                        "max_rel_loss_diff": max_relative_difference(ref, ls),
                        "steps": min(len(ref), len(ls)),
                    }
                )
    return pd.DataFrame(rows)


def default_out_dir(campaign: str) -> Path:
    return REPORTS_DIR / campaign
