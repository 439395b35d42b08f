"""What planning costs each method, and the step time against the bound of the machine.

Planning cost: every step's planning time is on the clock (``planner_clock``: ``overlap``
charges it when slower than the step, ``serial`` always); a configuration search the planner
runs before training (static_tuned's grid, megatron_hybrid_cp's launch tuning) is booked as
offline work per step (``extra.offline_tune_s``). This section shows both, with the searches
repeated after the first step (retunes) and the steps over a planning budget the planner
declares (flexsp_milp's ``step_time_limit_s``), so no method's planning cost is hidden.

The bound of the machine: `dcp_bench.sim.physical_lower_bound`, the lower bound with the whole
usable GPU memory as the cap instead of the run's configured cap, beside the bound at the cap;
`dcp_bench.sim.BOUND_ASSUMPTIONS` lists what both keep from the cost model.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from dcp_bench.sim import BOUND_ASSUMPTIONS

if TYPE_CHECKING:
    from dcp_bench.report.document import Document

GROUP = ["workload", "model", "world_size", "label"]


def _num(series: pd.Series) -> pd.Series:
    return pd.to_numeric(series, errors="coerce")


def planning_cost_table(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per workload, model, GPU count and method: planning per step (median of the
    runs' medians, and the longest step), its share of the step, the planner clock, offline
    tuning per run (median, warm-up included), retunes and budget overruns (summed over runs)."""
    need = {"planner_ms", "step_time_s", *GROUP}
    if runs.empty or not need <= set(runs.columns):
        return pd.DataFrame()
    rows = []
    for key, g in runs.groupby(GROUP, sort=False, dropna=False):
        plan_ms = _num(g["planner_ms"])
        step = _num(g["step_time_s"])
        share = (plan_ms / 1e3 / step).replace([np.inf, -np.inf], np.nan)
        rows.append(
            {
                "workload": key[0],
                "model": key[1],
                "GPUs": int(key[2]) if key[2] is not None and not pd.isna(key[2]) else "-",
                "method": key[3],
                "runs": len(g),
                "plan() ms/step": _fmt(plan_ms.median()),
                "longest step ms": _fmt(_column(g, "planner_max_ms").max()),
                "plan() / step time": _fmt(share.median(), pct=True),
                "clock": ",".join(
                    sorted({str(c) for c in g.get("planner_clock", pd.Series(dtype=str)).dropna()})
                )
                or "-",
                "offline tuning s/run": _fmt(_column(g, "offline_tune_total_s").median()),
                "retunes": _int(_column(g, "retunes").sum(min_count=1)),
                "steps over budget": _int(_column(g, "planner_over_budget_steps").sum(min_count=1)),
            }
        )
    return pd.DataFrame(rows)


def machine_bound_table(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per workload, model, GPU count and method: median step time over the bound at the
    run's cap and over the bound at the physical memory limit, and the share of the step's GPU
    time left idle beside them (the runs' ``imbalance``; medians over runs that finished)."""
    need = {"step_time_s", "lower_bound_s", "lower_bound_physical_s", *GROUP}
    if runs.empty or not need <= set(runs.columns):
        return pd.DataFrame()
    ok = runs[_num(runs["step_time_s"]).notna()]
    rows = []
    for key, g in ok.groupby(GROUP, sort=False, dropna=False):
        step = _num(g["step_time_s"])
        cap = _num(g.get("mem_cap_fraction", pd.Series(dtype=float)))
        rows.append(
            {
                "workload": key[0],
                "model": key[1],
                "GPUs": int(key[2]) if key[2] is not None and not pd.isna(key[2]) else "-",
                "method": key[3],
                "cap": _fmt(cap.median()),
                "step / bound at cap": _fmt((step / _num(g["lower_bound_s"])).median(), digits=3),
                "step / physical bound": _fmt(
                    (step / _num(g["lower_bound_physical_s"])).median(), digits=3
                ),
                "idle share": _fmt(_column(g, "imbalance").median(), pct=True),
            }
        )
    return pd.DataFrame(rows)


def _column(g: pd.DataFrame, name: str) -> pd.Series:
    return _num(g[name]) if name in g else pd.Series(dtype=float)


def _fmt(value: Any, digits: int = 4, pct: bool = False) -> str:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return "-"
    if not math.isfinite(v):
        return "-"
    return f"{100 * v:.2f}%" if pct else f"{v:.{digits}g}"


def _int(value: Any) -> str:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return "-"
    return str(int(v)) if math.isfinite(v) else "-"


def planning_cost_section(doc: Document, data: Any) -> None:
    """The report section (``data``: the report's `ReportData`, anything with ``campaign.runs``)."""
    table = planning_cost_table(data.campaign.runs)
    doc.h2("Planning cost of every method")
    if table.empty:
        doc.p("*No runs with planning times in this campaign.*")
        return
    doc.p(
        "Planning time per step (wall time of `plan()`, median over steps and runs; a step that "
        "tuned includes its search) and how the run charged it "
        "(`overlap`: the next step is planned while this one runs, so only planning slower than "
        "the step adds time; `serial`: always added; `off`). Configuration searches a method's "
        "users run before training (static_tuned's grid, megatron_hybrid_cp's launch tuning) are "
        "not on the step clock; they are shown here as offline tuning per run, warm-up steps "
        "included, with the searches repeated after the first step (retunes). Steps over budget: "
        "steps whose planning overran the per-step budget the planner declares (flexsp_milp's "
        "`step_time_limit_s`)."
    )
    doc.table(table, "Planning and tuning cost per workload, GPU count and method")


def machine_bound_section(doc: Document, data: Any) -> None:
    """Step time over the bound at the configured cap and at the physical memory limit."""
    table = machine_bound_table(data.campaign.runs)
    doc.h2("The bound at the cap and at the machine's memory")
    if table.empty:
        doc.p("*No runs recorded the physical bound in this campaign.*")
        return
    doc.p(
        "The lower bound at the run's memory cap is a bound of the plans the cap allows; with the "
        "whole usable GPU memory as the cap it is a bound of the machine, which no plan under any "
        "cap beats. Both keep the cost model's other assumptions:"
    )
    doc.bullets(list(BOUND_ASSUMPTIONS))
    doc.table(table, "Median step time over the bound at the cap and at the physical memory limit")
