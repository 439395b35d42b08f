"""Report section "Simulator against measurement": measured runs beside their simulated twins,
and loss parity between methods."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from dcp_bench.report import figures as fig
from dcp_bench.report.data import SIM_ERROR_TARGET, ReportData
from dcp_bench.report.document import Document
from dcp_bench.report.stats import max_relative_difference
from dcp_bench.report.summary import nanmedian_abs
from dcp_bench.report.tables import (
    Campaign,
)


def loss_parity(c: Campaign) -> pd.DataFrame:
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


def _load_sentence(validation: pd.DataFrame) -> str:
    """What else ran on the machine while the cells were measured (`load_1m`: each cell's median
    1-minute load average), or nothing when the records carry no load."""
    if "load_1m" not in validation:
        return ""
    loads = pd.to_numeric(validation["load_1m"], errors="coerce").dropna()
    if loads.empty:
        return ""
    return (
        f" Measured at a 1-minute load average of {loads.min():.1f}-{loads.max():.1f} "
        "(`load_1m`, each cell's median over its steps): on a machine shared with other work a "
        "measured step time grows with the load, a simulated one does not."
    )


def measurement_section(doc: Document, data: ReportData) -> None:
    c = data.campaign
    validation = data.validation
    val_sp = data.validation_speedups
    if validation.empty:
        return
    doc.h2("Simulator against measurement")
    med_err = nanmedian_abs(validation["error"])
    max_err = (
        float(np.nanmax(np.abs(validation["error"].astype(float))))
        if validation["error"].notna().any()
        else math.nan
    )
    doc.p(
        f"Median absolute error of the simulated median step time: **{med_err:.1%}** (max "
        f"{max_err:.1%}; target within {SIM_ERROR_TARGET:.0%}). The simulated runs use the cost "
        "model named in `cost_source`; the measured ones ran on this machine's ranks."
        + _load_sentence(validation)
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
            "load_1m",
            "cost_source",
        ],
    )
    if not val_sp.empty:
        sp_err = nanmedian_abs(val_sp["error"])
        doc.p(f"Median absolute error of the simulated speedup: **{sp_err:.1%}**.")
        doc.table(val_sp, "Speedup, measured vs simulated")
    doc.figure(
        fig.sim_vs_measured(validation, "simulated vs measured median step time", data.colors),
        "sim_vs_measured",
        "Simulated (vertical) against measured (horizontal) median step time",
    )
    loss = loss_parity(c)
    if not loss.empty:
        doc.table(
            loss,
            "Loss parity: max relative difference of per-step losses against the first method, "
            "same seed",
        )
