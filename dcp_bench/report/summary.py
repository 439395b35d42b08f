"""summary.json: the machine-readable summary of a report."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dcp_bench.files import atomic_write_json
from dcp_bench.report.data import SIM_ERROR_TARGET, ReportData, scrub_paths, shown_path
from dcp_bench.report.memory_error import memory_prediction_error
from dcp_bench.report.tables import (
    write_csv,
)


def write_summary(data: ReportData, paths: dict[str, Any]) -> dict[str, Any]:
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
        "method_vs_baseline": frame_records(data.own),
        "claims": [r.to_summary() for r in data.claim_results],
        "comparisons": frame_records(data.comparisons),
        "sensitivity": frame_records(data.sensitivity),
        "simulator_error": {
            "median_abs_step_time_error": none_if_nan(nanmedian_abs(validation["error"]))
            if not validation.empty
            else None,
            "median_abs_speedup_error": none_if_nan(nanmedian_abs(val_sp["error"]))
            if not val_sp.empty
            else None,
            "target": SIM_ERROR_TARGET,
            "cells": frame_records(validation),
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


def nanmedian_abs(values: pd.Series) -> float:
    """Median of |values| over the finite ones; nan when there are none (no warning)."""
    arr = np.abs(values.astype(float).to_numpy())
    arr = arr[np.isfinite(arr)]
    return float(np.median(arr)) if arr.size else math.nan


def none_if_nan(x: float) -> float | None:
    return None if math.isnan(x) else x


def frame_records(df: pd.DataFrame) -> list[dict[str, Any]]:
    if df is None or df.empty:
        return []
    clean = df.replace([np.inf, -np.inf], None).astype(object).where(df.notna(), None)
    return [{k: v for k, v in row.items()} for row in clean.to_dict(orient="records")]
