"""The peer table: every method's step time against the lower bound of the same batches, per
workload and GPU count, with its failures counted.

The lower bound (`dcp_bench.sim.lower_bound`, recorded with every step) is a step time no valid
plan of the batch can beat, so ``step / bound`` says how much room each method leaves, on one
scale for every method: a reader sees that no peer is a strawman (or where one fails, and how).

Only fair-mode runs at default cost constants and the default memory cap enter: a paper-mode
step trains a subset of the batch the bound covers, and sensitivity variants change the bound.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from dcp_bench.cost.base import DEFAULT_MEM_CAP_FRACTION

if TYPE_CHECKING:
    from dcp_bench.report.document import Document

# How a run that produced no step time failed, from its status and error (run records).
FAILURE_KINDS = ("oom", "infeasible", "timeout", "error")
GROUP_KEYS = ["workload", "model", "cluster", "world_size", "executor", "method"]
PEER_COLUMNS = [
    *GROUP_KEYS,
    "runs",
    "ok",
    "step_over_bound",
    "step_over_bound_min",
    "step_over_bound_max",
    "idle_share",
    "steps",
    "step_time_s",
    "lower_bound_s",
    "planner_ms",
    *FAILURE_KINDS,
    "cost_source",
]
# Our planner first, then the faithful DCP methods; every other method (the peers) after them.
LEADING_METHODS = ("dcp", "dcp_inter_pac", "dcp_inter", "dcp_intra")


def failure_kind(status: str, error: str | None) -> str | None:
    """The failure a run's record shows (None for ``ok``): ``infeasible`` when the method raised
    `InfeasibleError` (it found no configuration that runs the batch under the memory cap)."""
    if status == "ok":
        return None
    if status in ("oom", "timeout"):
        return status
    if status == "error" and (error or "").startswith("InfeasibleError"):
        return "infeasible"
    return "error"


def _default_constants(runs: pd.DataFrame) -> pd.Series:
    def plain(scales: Any) -> bool:
        try:
            values = json.loads(scales) if isinstance(scales, str) else (scales or {})
        except ValueError:
            return False
        return all(float(v) == 1.0 for v in values.values())

    scales = runs["scales"] if "scales" in runs else pd.Series(["{}"] * len(runs), index=runs.index)
    cap = (
        runs["mem_cap_fraction"]
        if "mem_cap_fraction" in runs
        else pd.Series([None] * len(runs), index=runs.index)
    )
    cap_ok = cap.isna() | np.isclose(
        cap.astype(float).fillna(DEFAULT_MEM_CAP_FRACTION), DEFAULT_MEM_CAP_FRACTION
    )
    return scales.map(plain) & cap_ok


def _method_names(runs: pd.DataFrame) -> pd.Series:
    """The method column: its label, plus the parameters that tell apart two configurations of
    one method inside one context (e.g. two static SP degrees)."""
    names = runs["label"].astype(str) if "label" in runs else runs["method"].astype(str)
    if "params" not in runs:
        return names
    out = names.copy()
    keys = ["workload", "model", "cluster"]
    for _, df in runs.assign(_name=names).groupby([*keys, "_name"], sort=False):
        if df["params"].nunique() < 2:
            continue
        parsed = {p: json.loads(p) for p in df["params"].unique()}
        differing = sorted(
            {
                k
                for d in parsed.values()
                for k in d
                if len({json.dumps(x.get(k)) for x in parsed.values()}) > 1
            }
        )
        for idx, p in zip(df.index, df["params"]):
            tag = ", ".join(f"{k}={json.dumps(parsed[p].get(k))}" for k in differing)
            out.loc[idx] = f"{names.loc[idx]}({tag})"
    return out


def peer_table(runs: pd.DataFrame, steps: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per workload, model, cluster, executor and method of a campaign's tables
    (`dcp_bench.report.tables.Campaign`: ``runs`` one row per run, ``steps`` one per measured
    step of the ok runs).

    ``step_over_bound``: step time / lower bound, per measured step where ``steps`` carries the
    step's ``lower_bound_s``, else per run (its median step time over its median bound), the
    median over every ok repeat; ``_min`` / ``_max`` the extremes; ``steps`` the measured steps
    behind it. ``idle_share``: the share of the step's GPU time left idle (a step record's
    ``imbalance``: idle rank-seconds over ranks x step time), median over the same steps (else the
    runs' medians): where one long document sets the bound, a ratio of 1.000 can still leave much
    of the machine idle. ``runs``, ``ok`` and the failure counts (`FAILURE_KINDS`) count repeats.
    Paper-mode runs and runs at non-default cost constants or memory cap are left out (module
    docstring)."""
    if runs is None or runs.empty:
        return pd.DataFrame(columns=PEER_COLUMNS)
    keep = _default_constants(runs)
    if "mode" in runs:
        keep &= runs["mode"].fillna("fair") != "paper"
    runs = runs[keep].copy()
    if runs.empty:
        return pd.DataFrame(columns=PEER_COLUMNS)
    runs["method"] = _method_names(runs)
    runs["failure"] = [
        failure_kind(s, e) for s, e in zip(runs["status"], runs.get("error", [None] * len(runs)))
    ]
    per_step = (
        steps is not None and not steps.empty and "lower_bound_s" in steps and "run_id" in steps
    )
    rows = []
    for key, df in runs.groupby(GROUP_KEYS, sort=False, dropna=False):
        ok = df[df["status"] == "ok"]
        if per_step and steps is not None:
            st = steps[steps["run_id"].isin(ok["run_id"])]
            ratios = (
                st["step_time_s"].astype(float) / st["lower_bound_s"].astype(float)
            ).to_numpy()
        else:
            ratios = (
                ok["step_time_s"].astype(float) / ok["lower_bound_s"].astype(float)
            ).to_numpy()
        ratios = ratios[np.isfinite(ratios)]
        if per_step and steps is not None and "imbalance" in steps:
            idle = steps.loc[steps["run_id"].isin(ok["run_id"]), "imbalance"]
        else:
            idle = ok["imbalance"] if "imbalance" in ok else pd.Series(dtype=float)
        idle = pd.to_numeric(idle, errors="coerce").dropna()
        n_steps = (
            len(ratios)
            if per_step
            else int(ok["n_steps"].fillna(0).astype(int).sum())
            if "n_steps" in ok
            else len(ratios)
        )
        row: dict[str, Any] = dict(zip(GROUP_KEYS, key))
        row.update(
            runs=len(df),
            ok=len(ok),
            step_over_bound=float(np.median(ratios)) if len(ratios) else math.nan,
            step_over_bound_min=float(ratios.min()) if len(ratios) else math.nan,
            step_over_bound_max=float(ratios.max()) if len(ratios) else math.nan,
            idle_share=float(np.median(idle)) if len(idle) else math.nan,
            steps=int(n_steps),
            step_time_s=float(np.median(ok["step_time_s"].astype(float))) if len(ok) else math.nan,
            lower_bound_s=float(np.median(ok["lower_bound_s"].astype(float)))
            if len(ok)
            else math.nan,
            planner_ms=float(np.nanmedian(ok["planner_ms"].astype(float)))
            if len(ok) and "planner_ms" in ok and ok["planner_ms"].notna().any()
            else math.nan,
            cost_source=str(df["cost_source"].dropna().iloc[0])
            if "cost_source" in df and df["cost_source"].notna().any()
            else "",
        )
        for kind in FAILURE_KINDS:
            row[kind] = int((df["failure"] == kind).sum())
        rows.append(row)
    out = pd.DataFrame(rows, columns=PEER_COLUMNS)
    order = {m: i for i, m in enumerate(LEADING_METHODS)}
    out["_m"] = [order.get(m.split("(")[0], len(order)) for m in out["method"]]
    out = out.sort_values(
        ["workload", "model", "world_size", "executor", "_m", "method"], kind="stable"
    )
    return out.drop(columns="_m").reset_index(drop=True)


def cell_text(row: pd.Series) -> str:
    """A peer-table cell as read: ``1.012`` (every repeat ran), ``1.30 (1 oom)`` (some failed),
    ``infeasible 3/3`` (none ran); with the idle share beside the ratio where the table has one:
    ``1.000, idle 31%``."""
    fails = [f"{int(row[k])} {k}" for k in FAILURE_KINDS if int(row[k])]
    if int(row["ok"]) == 0 or not math.isfinite(float(row["step_over_bound"])):
        if len(fails) == 1:
            kind = fails[0].split(" ", 1)[1]
            return f"{kind} {int(row['runs'])}/{int(row['runs'])}"
        return "failed: " + ", ".join(fails) if fails else "-"
    text = f"{float(row['step_over_bound']):.3f}"
    idle = float(row.get("idle_share", math.nan))
    if math.isfinite(idle):
        text += f", idle {100 * idle:.0f}%"
    return f"{text} ({', '.join(fails)})" if fails else text


def peer_matrix(table: pd.DataFrame) -> pd.DataFrame:
    """The peer table to read: one row per workload, model, GPU count (and executor, when a
    campaign holds more than one), one column per method, cells as `cell_text`."""
    if table.empty:
        return pd.DataFrame()
    t = table.assign(cell=[cell_text(r) for _, r in table.iterrows()])
    t["GPUs"] = t["world_size"].map(lambda w: int(w) if w is not None and not pd.isna(w) else "-")
    index = ["workload", "model", "GPUs"] + (["executor"] if t["executor"].nunique() > 1 else [])
    methods = list(dict.fromkeys(t["method"]))
    wide = t.pivot_table(index=index, columns="method", values="cell", aggfunc="first", sort=False)
    wide = wide.reindex(columns=methods).fillna("-").reset_index()
    wide.columns.name = None
    return wide


def peer_section(doc: Document, data: Any) -> None:
    """The report section: ``data`` is the report's `ReportData` (anything with
    ``campaign.runs`` and ``campaign.steps``)."""
    campaign = data.campaign
    table = peer_table(campaign.runs, campaign.steps)
    doc.h2("Every method against the lower bound")
    if table.empty:
        doc.p("*No fair-mode runs at default constants in this campaign: no peer table.*")
        return
    sources = sorted({s for s in table["cost_source"] if s})
    n_steps = table.loc[table["ok"] > 0, "steps"]
    doc.p(
        "Step time over the lower bound of the same batch (`dcp_bench.sim.lower_bound`: no valid "
        "plan of the batch is faster; it counts the fixed cost of every micro-batch the memory cap "
        "forces), per step where the records hold the step's bound, else each run's median step "
        "time over its median bound, then the median over repeats; 1.000 would be an optimal plan. "
        "Beside it, the share of the step's GPU time left idle (median over the same steps): "
        "where one long document sets the bound, a plan at 1.000 can still leave much of the "
        "machine idle, which the ratio alone hides. "
        "A failed run has no ratio and is counted: `oom` (a step over the GPU's memory), "
        "`infeasible` (the method found no configuration that runs the batch under the memory "
        "cap), `timeout` (the run passed its time limit), `error` (any other failure). Paper-mode "
        "runs and sensitivity variants are left out. "
        + (
            f"Measured steps per cell: {int(n_steps.min())}"
            + (f"-{int(n_steps.max())}" if n_steps.max() != n_steps.min() else "")
            + ". "
            if len(n_steps)
            else ""
        )
        + (f"Cost model: {', '.join(sources)} (simulated)." if sources else "")
    )
    doc.table(peer_matrix(table), "Step time / lower bound per workload, GPU count and method")
