"""The report's inputs and data: `ReportInputs`, `ReportData` (every table the sections read,
computed once from the campaign's records and the claims engine by `gather_report_data`), and
what several sections share (path scrubbing, evidence labels, contexts)."""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dcp_bench.cost.base import DEFAULT_MEM_CAP_FRACTION
from dcp_bench.envinfo import git_state
from dcp_bench.paths import REPO_ROOT, RESULTS_DIR
from dcp_bench.report import figures as fig
from dcp_bench.report.claims import (
    evaluate_claims,
    evaluate_comparisons,
    judge_sensitivity,
    load_claims,
    sensitivity,
)
from dcp_bench.report.stats import relative_error
from dcp_bench.report.tables import (
    Campaign,
    cell_table,
    comparison_table,
    load_campaign,
    speedup_table,
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


ABS_PATH = re.compile(r"(?<![\w.~/:-])(/[^\s'\"`,;:()\[\]{}<>|]+)")


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
    return ABS_PATH.sub(lambda m: shown_path(m.group(1)), str(text))


def default_context_cells(cells: pd.DataFrame) -> pd.DataFrame:
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
                "load_1m": _median_load(c, t["config_hash"]),
                "cost_source": s["cost_source"] if s is not None else None,
                "measured_cell": t["config_hash"],
                "simulated_cell": s["config_hash"] if s is not None else None,
            }
        )
    return pd.DataFrame(rows)


def _median_load(c: Campaign, config_hash: str) -> float:
    """The median 1-minute load average over a measured cell's steps (nan where its records
    carry none): what the machine ran besides the cell while it was measured."""
    if c.steps.empty or "load_1m" not in c.steps:
        return math.nan
    loads = pd.to_numeric(
        c.steps.loc[c.steps["config_hash"] == config_hash, "load_1m"], errors="coerce"
    ).dropna()
    return float(loads.median()) if len(loads) else math.nan


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
        return [cl for cl in items if not context_cells(self.default, cl.get("context", {})).empty]

    @property
    def leads_with_claims(self) -> bool:
        ids = {cl["id"] for cl in self.claims_in_campaign}
        return any(r.id in ids and r.result.pairs > 0 for r in self.claim_results) or (
            not self.comparisons.empty and bool((self.comparisons["pairs"] > 0).any())
        )


def context_cells(cells: pd.DataFrame, context: dict[str, Any]) -> pd.DataFrame:
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
    default = default_context_cells(cells)
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


def report_contexts(cells: pd.DataFrame) -> list[tuple[tuple[str, str, str], pd.DataFrame]]:
    """Default-constant cells grouped by (cluster, model, executor), largest group first."""
    if cells.empty:
        return []
    groups = [
        ((str(key[0]), str(key[1]), str(key[2])), df)
        for key, df in cells.groupby(["cluster", "model", "executor"], sort=False)
    ]
    return sorted(groups, key=lambda g: -len(g[1]))


def fig_name(*parts: Any) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", "_".join(str(p) for p in parts)).strip("_")


def fmt_x(v: float) -> str:
    return f"{v:.2f}x" if math.isfinite(v) else "-"
