"""`build_report`: a campaign's run records -> reports/<campaign>/ (report.md, report.html, CSV
tables, figures, summary.json).

Every number in the report traces to its run records: the cells table names each cell's config
hash (``runs/<campaign>/<run_id>/config.yaml`` holds the config), the provenance section names the
command, git sha and system description, and simulated numbers name their cost-model source and
its measured error.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dcp_bench.cost.base import DEFAULT_MEM_CAP_FRACTION
from dcp_bench.envinfo import git_state
from dcp_bench.files import atomic_write_json
from dcp_bench.paths import REPORTS_DIR, RESULTS_DIR
from dcp_bench.report import figures as fig
from dcp_bench.report.claims import (
    decompose,
    evaluate_claims,
    evaluate_comparisons,
    load_claims,
    sensitivity,
    verdict,
)
from dcp_bench.report.document import Document
from dcp_bench.report.stats import max_relative_difference, relative_error
from dcp_bench.report.tables import Campaign, cell_table, load_campaign, speedup_table, write_csv

CELL_COLUMNS = [
    "workload", "cluster", "model", "label", "params", "scales_label", "executor", "repeats",
    "failures", "median_s", "olympic_mean_s", "cv", "p5_s", "p95_s", "tokens_per_s", "imbalance",
    "peak_mem_gib", "mem_cap_gib", "mfu", "planner_ms", "cost_source", "config_hash", "flags",
]
SPEEDUP_COLUMNS = ["workload", "cluster", "model", "method", "baseline", "speedup", "ci_low", "ci_high", "pairs", "metric"]
SIM_ERROR_TARGET = 0.15


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
    baselines: list[str] | None = None  # method names treated as baselines (default: classes in `baselines.`)


def _default_context(cells: pd.DataFrame) -> pd.DataFrame:
    """Cells at the default cost constants and memory cap (not sensitivity variants)."""
    if cells.empty:
        return cells
    return cells[(cells["scales"] == "{}") & np.isclose(cells["mem_cap_fraction"].astype(float), DEFAULT_MEM_CAP_FRACTION)]


def calibration_error() -> dict[str, Any] | None:
    """Where the committed calibration states its measured error (a README or JSON under
    results/calibration/), when it does."""
    folder = RESULTS_DIR / "calibration"
    if not folder.is_dir():
        return None
    found: dict[str, Any] = {}
    for path in sorted(folder.rglob("README.md")):
        lines = [ln.strip() for ln in path.read_text().splitlines() if "error" in ln.lower()]
        if lines:
            found[str(path.relative_to(RESULTS_DIR.parent))] = lines[:4]
    for path in sorted(folder.rglob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(data, dict):
            for key in ("validation", "error", "errors", "fit_error", "held_out"):
                if key in data:
                    found[str(path.relative_to(RESULTS_DIR.parent))] = {key: data[key]}
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
            bits.append(f"profile `{path}` (sha256 {str(prof.get('sha256') or d.get('profile_sha256'))[:12]})")
        err = d.get("fit_max_rel_err") or prof.get("fit_max_rel_err")
        if err is not None:
            bits.append(f"in-sample fit max relative error {json.dumps(err, default=str)[:200]}")
        if d.get("source") == "analytical":
            bits.append("unvalidated on GPU" if "cpu" not in str(d.get("cluster")) else "analytical CPU constants")
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
        match = sim[(sim["label"] == t["label"]) & (sim["workload"] == t["workload"])
                    & (sim["model"] == t["model"]) & (sim["cluster"] == t["cluster"])
                    & (sim["params"] == t["params"])]
        s = match.iloc[0] if len(match) else None
        sim_s = float(s["median_s"]) if s is not None else math.nan
        rows.append({
            "workload": t["workload"], "model": t["model"], "method": t["label"],
            "is_baseline": t["is_baseline"], "measured_s": float(t["median_s"]), "measured_cv": t["cv"],
            "simulated_s": sim_s, "error": relative_error(sim_s, float(t["median_s"])),
            "cost_source": s["cost_source"] if s is not None else None,
            "measured_cell": t["config_hash"], "simulated_cell": s["config_hash"] if s is not None else None,
        })
    return pd.DataFrame(rows)


def validation_speedups(v: pd.DataFrame) -> pd.DataFrame:
    """Speedup of every non-baseline method over every baseline, measured and simulated."""
    rows = []
    for wl, df in v.groupby("workload", sort=False):
        for _, b in df[df["is_baseline"]].iterrows():
            for _, m in df[~df["is_baseline"]].iterrows():
                meas = b["measured_s"] / m["measured_s"]
                simv = b["simulated_s"] / m["simulated_s"]
                rows.append({"workload": wl, "method": m["method"], "baseline": b["method"],
                             "measured_speedup": meas, "simulated_speedup": simv,
                             "error": relative_error(simv, meas)})
    return pd.DataFrame(rows)


@dataclass
class ReportData:
    """Everything the report's sections read, computed once from the campaign's records."""

    inp: ReportInputs
    campaign: Campaign
    claims: dict[str, Any]
    cells: pd.DataFrame
    default: pd.DataFrame  # cells at default cost constants
    speedups: pd.DataFrame
    claim_results: list[Any]
    comparisons: pd.DataFrame
    sensitivity: pd.DataFrame
    validation: pd.DataFrame
    validation_speedups: pd.DataFrame
    git: dict[str, Any]
    env: dict[str, Any]
    calibration: dict[str, Any] | None
    decompositions: list[pd.DataFrame] = field(default_factory=list)

    @property
    def failed(self) -> pd.DataFrame:
        runs = self.campaign.runs
        return runs[runs["status"] != "ok"] if not runs.empty else runs


def gather_report_data(inp: ReportInputs) -> ReportData:
    """Read the campaign and compute every table the report shows."""
    c = load_campaign(inp.root, inp.campaign, baselines=inp.baselines)
    claims = load_claims(inp.claims_path)
    cells = cell_table(c)
    if not cells.empty:
        cells["scales_label"] = [fig.scales_label(s, m) for s, m in zip(cells["scales"], cells["mem_cap_fraction"])]
    default = _default_context(cells)
    speedups = speedup_table(c, default, n_boot=inp.n_boot) if not default.empty else pd.DataFrame()
    claim_results = evaluate_claims(c, cells, claims, n_boot=inp.n_boot) if not cells.empty else []
    comparisons = evaluate_comparisons(c, cells, claims, n_boot=inp.n_boot) if not cells.empty else pd.DataFrame()
    sens = sensitivity(c, cells, claims, n_boot=max(500, inp.n_boot // 2)) if not cells.empty else pd.DataFrame()
    validation = validation_table(c, cells)
    val_sp = validation_speedups(validation) if not validation.empty else pd.DataFrame()
    return ReportData(inp=inp, campaign=c, claims=claims, cells=cells, default=default, speedups=speedups,
                      claim_results=claim_results, comparisons=comparisons, sensitivity=sens,
                      validation=validation, validation_speedups=val_sp, git=git_state(),
                      env=next(iter(c.envs.values()), {}), calibration=calibration_error())


def build_report(inp: ReportInputs) -> dict[str, Any]:
    """Write the report; return the summary (also written as summary.json)."""
    data = gather_report_data(inp)
    doc = Document(inp.title or f"dcp-bench report: {inp.campaign}")
    for section in (_opening, _verdict_section, _headline_section, _decomposition_section, _sensitivity_section,
                    _speedup_section, _context_section, _scaling_section, _validation_section, _cells_section,
                    _provenance_section):
        section(doc, data)
    paths = doc.write(Path(inp.out_dir))
    return _write_summary(data, paths)


def _opening(doc: Document, data: ReportData) -> None:
    inp = data.inp
    c = data.campaign
    cells = data.cells
    git = data.git
    doc.p(f"Campaign `{inp.campaign}`: {len(c.runs)} complete runs in {len(cells)} cells"
          f"{f', {len(c.incomplete)} incomplete runs ignored' if c.incomplete else ''}. "
          f"Generated by `{inp.command or 'dcp-bench report campaign=' + inp.campaign}` at git "
          f"`{(git.get('git_sha') or 'unknown')[:12]}`{' (dirty tree)' if git.get('git_dirty') else ''}.")


def _verdict_section(doc: Document, data: ReportData) -> None:
    cells = data.cells
    claims = data.claims
    sens = data.sensitivity
    validation = data.validation
    calib = data.calibration
    claim_results = data.claim_results
    # -- verdict ------------------------------------------------------------------------------
    doc.h2("Verdict")
    robustness = _robustness(sens, claims)
    for r in claim_results:
        doc.p(f"**{r.id}: {r.verdict.upper()}.** Claim: {r.statement} (claimed {r.claimed:g}x, tolerance "
              f"{r.tolerance:.0%}).")
        doc.bullets([*r.reasons, *robustness.get(r.id, [])])
    if not claim_results:
        doc.p("No claims evaluated: the campaign holds no runs.")
    if not cells.empty and set(cells["executor"]) == {"sim"} or (not cells.empty and "sim" in set(cells["executor"])):
        doc.p("Simulated numbers come from the cost model named in the cells table (`cost_source`). The "
              "analytical H200 model is **unvalidated on GPU**: no H200 measurement has been compared "
              "with it yet, so the H200 speedups are model predictions whose robustness the sensitivity "
              "section shows." + (" CPU calibration on record: " + ", ".join(f"`{k}`" for k in calib) + "." if calib else ""))

    if not validation.empty and validation["error"].notna().any():
        med = _nanmedian_abs(validation["error"])
        doc.p(f"The simulator's own error, measured here on CPU ranks against real training (section "
              f"'Simulator against measurement'): median {med:.0%} on median step time "
              f"(target {SIM_ERROR_TARGET:.0%}){'' if med <= SIM_ERROR_TARGET else ': above target, so read simulated speedups as estimates of that precision'}.")


def _headline_section(doc: Document, data: ReportData) -> None:
    claim_results = data.claim_results
    comparisons = data.comparisons
    doc.h2("Headline comparisons")
    head_rows = [
        {"comparison": r.id, "workload": r.result.workload, "method": r.result.method, "baseline": r.result.baseline,
         "speedup": r.result.speedup, "ci_low": r.result.ci_low, "ci_high": r.result.ci_high,
         "pairs": r.result.pairs, "metric": r.result.metric, "note": r.verdict} for r in claim_results
    ]
    head = pd.concat([pd.DataFrame(head_rows), comparisons], ignore_index=True) if head_rows or not comparisons.empty else pd.DataFrame()
    missing = head[head["pairs"] == 0] if not head.empty else head
    head = head[head["pairs"] > 0] if not head.empty else head
    doc.table(head, "Speedup of method over baseline: ratio of medians over paired repeats, 95% paired-bootstrap CI",
              ["comparison", "workload", "method", "baseline", "speedup", "ci_low", "ci_high", "pairs", "metric", "note"])
    if not missing.empty:
        doc.p("**Not in this campaign** (no runs, so no number): " + "; ".join(
            f"{r['comparison']}: {r['method']} vs {r['baseline']} on {r['workload']}" for _, r in missing.iterrows()) + ".")
    doc.p("`metric=throughput`: tokens per second (used whenever a side runs in paper mode, which trains a "
          "different number of samples per step); `metric=step_time`: ratio of median step times (fair mode: "
          "every method trains the same samples with one optimizer step per global batch).")


def _decomposition_section(doc: Document, data: ReportData) -> None:
    c = data.campaign
    cells = data.cells
    claims = data.claims
    # -- decomposition ------------------------------------------------------------------------
    doc.h2("Where the speedup comes from")
    for cl in claims.get("claims", []):
        dec = decompose(c, cells, cl) if not cells.empty else None
        if dec is None:
            doc.p(f"{cl['id']}: decomposition needs the baseline and the method in both fair and paper mode "
                  "in the claim's context; not all four are in this campaign.")
            continue
        dec.insert(0, "claim", cl["id"])
        data.decompositions.append(dec)
        doc.table(dec, f"{cl['id']}: factors of the speedup (their product is the headline speedup)",
                  ["factor", "factor_x", "share_of_log_speedup", "baseline_s", "method_s"])
        doc.figure(fig.decomposition_bars(dec, f"{cl['id']}: decomposition"), f"decomposition_{cl['id']}",
                   f"{cl['id']}: multiplicative factors of the speedup")
    doc.p("Fair-mode parts come from the simulator's time accounting (mean per rank per step: compute, "
          "recomputation, all-to-all, gradient sync + optimizer, and the rest of the step: ranks idle "
          "waiting for the slowest); the paper-mode factors are the switch from fair to paper mode on each "
          "side (sample dealing and dropping, optimizer steps over different sample counts).")


def _sensitivity_section(doc: Document, data: ReportData) -> None:
    claims = data.claims
    sens = data.sensitivity
    # -- sensitivity --------------------------------------------------------------------------
    doc.h2("Sensitivity to uncertain cost-model constants")
    if sens.empty or not np.isfinite(sens["speedup"].astype(float)).any():
        doc.p("No sensitivity runs in this campaign.")
    else:
        by_id = {x["id"]: x for x in [*claims.get("claims", []), *claims.get("comparisons", [])]}
        for comp_id in dict.fromkeys(sens["comparison"]):
            cl = by_id.get(comp_id, {})
            doc.figure(fig.tornado(sens, comp_id, cl.get("value"), cl.get("tolerance"),
                                   f"{comp_id}: speedup with each constant halved / doubled"),
                       f"tornado_{comp_id}", f"Tornado: {comp_id} speedup when each uncertain constant is halved and doubled")
        doc.table(sens, "Sensitivity runs", ["comparison", "constant", "factor", "speedup", "ci_low", "ci_high",
                                             "reference_speedup", "note"])
        doc.p("Constants: `act_bytes` (activation bytes per token), `attn_eff` (attention kernel efficiency), "
              "`small_kernel_eff` (efficiency of small kernels), `a2a_eff` (all-to-all efficiency), all "
              f"multipliers of the analytical model; `mem_cap` scales the per-GPU memory cap ({DEFAULT_MEM_CAP_FRACTION} of usable "
              "memory: x0.5 = 0.35; x2 is clipped to 1.0, all usable memory, since a cap cannot exceed it).")


def _speedup_section(doc: Document, data: ReportData) -> None:
    speedups = data.speedups
    # -- all speedups ------------------------------------------------------------------------
    doc.h2("Speedups per workload and method")
    if not speedups.empty:
        for (cl_name, model, base), sub in speedups.groupby(["cluster", "model", "baseline"], sort=False):
            if sub["workload"].nunique() < 1:
                continue
            name = f"speedup_{cl_name}_{model}_{base}".replace(" ", "_").replace("(", "").replace(")", "")
            doc.figure(fig.speedup_bars(sub, f"over {base} on {cl_name}, {model}"), name,
                       f"Speedup over {base} ({cl_name}, {model}); error bars: 95% paired-bootstrap CI")
    doc.table(speedups, "Every method over every baseline (default constants)", SPEEDUP_COLUMNS)


def _context_section(doc: Document, data: ReportData) -> None:
    c = data.campaign
    cells = data.cells
    claims = data.claims
    # -- claim context figures ------------------------------------------------------------------
    doc.h2("Step times, memory and plan shapes in the claim's context")
    ctx_cells = _claim_context_cells(cells, claims)
    ctx_steps = c.steps[c.steps["config_hash"].isin(ctx_cells["config_hash"])] if not c.steps.empty else c.steps
    doc.figure(fig.step_time_distributions(ctx_steps, ctx_cells, "step-time distribution per method"),
               "step_times", "Step time per method (all measured steps of all repeats)")
    doc.figure(fig.peak_memory_per_rank(ctx_steps, ctx_cells, "peak memory per rank"), "peak_memory",
               "Peak memory per rank (max over steps) against the cap")
    doc.figure(fig.share_histogram(ctx_steps, ctx_cells, "sp_tokens", "SP degree", "SP degree (share of tokens)"),
               "sp_degree_hist", "Share of tokens run at each SP degree, per method (token-weighted: the few long "
               "videos carry most of the work; sample-weighted counts are in the run records)")
    doc.figure(fig.share_histogram(ctx_steps, ctx_cells, "ckpt_tokens", "checkpointed share of layers",
                                   "recomputation (share of tokens)"), "recompute_hist",
               "Share of tokens per checkpointed fraction of layers (0 = no recomputation, 1 = full)")


def _scaling_section(doc: Document, data: ReportData) -> None:
    default = data.default
    doc.h2("Scaling with the number of GPUs")
    scale_cells = default[default["executor"] == "sim"] if not default.empty else default
    if not scale_cells.empty:
        scale_cells = scale_cells.assign(world_size=scale_cells["world_size"].astype(float))
    doc.figure(fig.versus_gpus(scale_cells, "imbalance", "imbalance (idle share)", "imbalance vs GPUs") if not scale_cells.empty else None,
               "imbalance_vs_gpus", "Load imbalance (idle share of rank-seconds) against GPU count (8, 16, 32, 64)")
    doc.figure(fig.versus_gpus(scale_cells, "tokens_per_s", "tokens / s", "throughput vs GPUs", log=True) if not scale_cells.empty else None,
               "scaling", "Throughput (tokens/s) against GPU count")


def _validation_section(doc: Document, data: ReportData) -> None:
    c = data.campaign
    validation = data.validation
    val_sp = data.validation_speedups
    # -- measured vs simulated ----------------------------------------------------------------
    doc.h2("Simulator against measurement (CPU, gloo)")
    if validation.empty:
        doc.p("No measured (torch executor) runs in this campaign, so the simulator's error is not measured here.")
    else:
        med_err = _nanmedian_abs(validation["error"])
        max_err = float(np.nanmax(np.abs(validation["error"].astype(float)))) if validation["error"].notna().any() else math.nan
        doc.p(f"Median absolute error of the simulated median step time: **{med_err:.1%}** (max {max_err:.1%}; "
              f"target within {SIM_ERROR_TARGET:.0%}). The simulated runs use the cost model named in "
              "`cost_source`; the measured ones ran on this machine's CPU ranks.")
        doc.table(validation, "Median step time, measured vs simulated",
                  ["workload", "model", "method", "measured_s", "measured_cv", "simulated_s", "error", "cost_source"])
        if not val_sp.empty:
            sp_err = _nanmedian_abs(val_sp["error"])
            doc.p(f"Median absolute error of the simulated speedup: **{sp_err:.1%}**.")
            doc.table(val_sp, "Speedup, measured vs simulated")
        doc.figure(fig.sim_vs_measured(validation, "simulated vs measured"), "sim_vs_measured",
                   "Simulated against measured median step time")
        loss = _loss_parity(c)
        if not loss.empty:
            doc.table(loss, "Loss parity: max relative difference of per-step losses against the first method, same seed")


def _cells_section(doc: Document, data: ReportData) -> None:
    c = data.campaign
    cells = data.cells
    # -- cells ----------------------------------------------------------------------------------
    doc.h2("Every cell")
    doc.p("A cell is one config without its seed; statistics over its repeats (median, olympic mean = mean "
          "without the fastest and slowest repeat, CV), p5/p95 over all measured steps. Failed repeats count "
          "as infinitely slow. Flags: CV > 5%, failures, fewer than 5 repeats.")
    doc.table(cells, "Cells", CELL_COLUMNS)
    failed = c.runs[c.runs["status"] != "ok"] if not c.runs.empty else c.runs
    if len(failed):
        doc.table(failed, "Failed runs (kept, counted as infinitely slow)",
                  ["run_id", "status", "method", "workload", "cluster", "error"])


def _provenance_section(doc: Document, data: ReportData) -> None:
    inp = data.inp
    c = data.campaign
    git = data.git
    env = data.env
    calib = data.calibration
    # -- provenance ----------------------------------------------------------------------------
    doc.h2("Provenance")
    items = [
        f"command: `{inp.command or 'dcp-bench report campaign=' + inp.campaign}`",
        f"git sha: `{git.get('git_sha')}`, dirty: {git.get('git_dirty')}",
        f"run records: `{Path(inp.root) / inp.campaign}/<run_id>/` (config.yaml, env.json, steps.jsonl, run.json); "
        "run ids end in the cell's config hash and the seed",
        f"system: {env.get('cpu_model', '?')}, {env.get('cpu_cores', '?')} cores, torch {env.get('torch', '?')}, "
        f"python {env.get('python', '?')}, host {env.get('hostname', '?')}",
        *[f"cost model: {line}" for line in cost_models_used(c)[:12]],
        "calibration error: " + (json.dumps(calib, default=str)[:400] if calib else
                                 "no calibration error on record in results/calibration/"),
        "planner time: measured on this machine, charged per `run.planner_clock` (default overlap: "
        "max(step, planner))",
    ]
    doc.bullets(items)
    doc.bullets(inp.notes)


def _write_summary(data: ReportData, paths: dict[str, Any]) -> dict[str, Any]:
    inp = data.inp
    c = data.campaign
    cells = data.cells
    sens = data.sensitivity
    validation = data.validation
    val_sp = data.validation_speedups
    git = data.git
    calib = data.calibration
    speedups = data.speedups
    claim_results = data.claim_results
    comparisons = data.comparisons
    out = Path(inp.out_dir)
    decs = data.decompositions
    failed = data.failed
    tables = {"cells": cells, "speedups": speedups, "comparisons": comparisons, "sensitivity": sens,
              "validation": validation, "validation_speedups": val_sp,
              "decomposition": pd.concat(decs, ignore_index=True) if decs else pd.DataFrame(),
              "runs": c.runs}
    for name, df in tables.items():
        if df is not None and not df.empty:
            write_csv(df, out / "tables" / f"{name}.csv")
    summary = {
        "campaign": inp.campaign,
        "command": inp.command,
        "git_sha": git.get("git_sha"),
        "git_dirty": git.get("git_dirty"),
        "runs": int(len(c.runs)),
        "failed_runs": int(len(failed)),
        "claims": [r.to_summary() for r in claim_results],
        "comparisons": _records(comparisons),
        "sensitivity": _records(sens),
        "simulator_error": {
            "median_abs_step_time_error": _none_if_nan(_nanmedian_abs(validation["error"])) if not validation.empty else None,
            "median_abs_speedup_error": _none_if_nan(_nanmedian_abs(val_sp["error"])) if not val_sp.empty else None,
            "target": SIM_ERROR_TARGET,
            "cells": _records(validation),
        },
        "calibration": calib,
        "notes": inp.notes,
        "report": {k: str(v) for k, v in paths.items()},
    }
    atomic_write_json(out / "summary.json", summary)
    return summary


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


def _claim_context_cells(cells: pd.DataFrame, claims: dict[str, Any]) -> pd.DataFrame:
    if cells.empty:
        return cells
    ctx = (claims.get("claims") or [{}])[0].get("context", {})
    mask = np.ones(len(cells), dtype=bool)
    for key in ("workload", "cluster", "model"):
        if key in ctx:
            mask &= (cells[key] == ctx[key]).to_numpy()
    sub = _default_context(cells[mask])
    return sub[sub["executor"] == "sim"] if "sim" in set(sub["executor"]) else sub


def _robustness(sens: pd.DataFrame, claims: dict[str, Any]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    if sens.empty:
        return out
    for cl in claims.get("claims", []):
        sub = sens[(sens["comparison"] == cl["id"]) & np.isfinite(sens["speedup"].astype(float))]
        if sub.empty:
            continue
        flips = []
        for _, r in sub.iterrows():
            v = verdict(float(cl["value"]), float(cl["tolerance"]), float(r["ci_low"]), float(r["ci_high"]))
            flips.append((r["constant"], r["factor"], float(r["speedup"]), v))
        lo = min(f[2] for f in flips)
        hi = max(f[2] for f in flips)
        changed = [f"{k} x{f:g} ({s:.2f}x: {v})" for k, f, s, v in flips]
        out[cl["id"]] = [f"sensitivity: with each uncertain constant halved or doubled the speedup ranges "
                         f"{lo:.2f}x to {hi:.2f}x; verdicts: " + "; ".join(changed)]
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
                rows.append({"workload": wl, "seed": seed, "reference": ref_name, "method": name,
                             "max_rel_loss_diff": max_relative_difference(ref, ls), "steps": min(len(ref), len(ls))})
    return pd.DataFrame(rows)


def default_out_dir(campaign: str) -> Path:
    return REPORTS_DIR / campaign
