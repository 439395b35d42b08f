"""Report section: the analytical cost model against published measurements."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from dcp_bench.paths import RESULTS_DIR
from dcp_bench.report.data import ReportData
from dcp_bench.report.document import Document


def published_validation() -> dict[str, Any] | None:
    """The committed validation of the analytical GPU model against published measurements
    (`dcp-bench validate`, results/validation/summary.json), or None when absent or unreadable."""
    try:
        doc = json.loads((RESULTS_DIR / "validation" / "summary.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return doc if isinstance(doc, dict) and "after" in doc and "before" in doc else None


def calibration_section(doc: Document, data: ReportData) -> None:
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


def uses_calibration(data: ReportData) -> bool:
    """Whether any number rests on a measured profile (the calibration matters to it)."""
    cells = data.cells
    return not cells.empty and bool(
        ((cells["cost_source"] == "profiled") | (cells["executor"] != "sim")).any()
    )
