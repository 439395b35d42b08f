"""Claims (``results/reference/claims.yaml``) checked against a campaign: verdicts with their
confidence intervals, the decomposition of a speedup, and its sensitivity to cost constants."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from dcp_bench.cost.base import DEFAULT_MEM_CAP_FRACTION
from dcp_bench.errors import ConfigError
from dcp_bench.planners.base import method_label
from dcp_bench.report.tables import STEP_PARTS, Campaign, cell_seeds, speedup_between

SCALE_CONSTANTS = ("act_bytes", "attn_eff", "small_kernel_eff", "a2a_eff")


def load_claims(path: str | os.PathLike[str]) -> dict[str, Any]:
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"claims file {str(path)!r} not found (expected results/reference/claims.yaml)")
    data = yaml.safe_load(path.read_text()) or {}
    for c in data.get("claims", []):
        for key in ("id", "value", "tolerance", "context", "baseline", "method"):
            if key not in c:
                raise ConfigError(f"claim {c.get('id', '?')!r} in {path}: missing {key!r}")
    return data


def _as_list(x: Any) -> list[Any]:
    return list(x) if isinstance(x, (list, tuple)) else [x]


def select_cells(
    cells: pd.DataFrame,
    context: dict[str, Any],
    selector: dict[str, Any],
    scales: dict[str, float] | None = None,
    mem_cap_fraction: float | None = DEFAULT_MEM_CAP_FRACTION,
) -> pd.DataFrame:
    """Cells matching a context (workload/cluster/model, each a value or a list), a method
    selector {method, mode?, params?}, the given cost scales (default: none) and memory cap."""
    if cells.empty:
        return cells
    mask = np.ones(len(cells), dtype=bool)
    for key in ("workload", "cluster", "model"):
        if key in context:
            mask &= cells[key].isin([str(v) for v in _as_list(context[key])]).to_numpy()
    mask &= (cells["method"] == selector["method"]).to_numpy()
    if "mode" in selector:
        mask &= (cells["mode"] == selector["mode"]).to_numpy()
    want = json.dumps(scales or {}, sort_keys=True)
    mask &= (cells["scales"] == want).to_numpy()
    if mem_cap_fraction is not None:
        mask &= np.isclose(cells["mem_cap_fraction"].astype(float), mem_cap_fraction)
    params = selector.get("params") or {}
    if params:
        ok = [all(json.loads(p).get(k) == v for k, v in params.items()) for p in cells["params"]]
        mask &= np.array(ok, dtype=bool)
    return cells[mask]


@dataclass
class PairResult:
    workload: str
    baseline: str
    method: str
    speedup: float
    ci_low: float
    ci_high: float
    pairs: int
    metric: str
    baseline_cell: str | None
    method_cell: str | None
    note: str = ""


def compare(
    c: Campaign,
    cells: pd.DataFrame,
    context: dict[str, Any],
    baseline: dict[str, Any],
    method: dict[str, Any],
    scales: dict[str, float] | None = None,
    mem_cap_fraction: float | None = DEFAULT_MEM_CAP_FRACTION,
    n_boot: int = 2000,
    seeds: set[int] | None = None,
) -> list[PairResult]:
    """Speedups of ``method`` over ``baseline`` in every matching context (one per workload),
    over the repeats with the given ``seeds`` only when given."""
    out = []
    b_cells = select_cells(cells, context, baseline, scales, mem_cap_fraction)
    m_cells = select_cells(cells, context, method, scales, mem_cap_fraction)
    b_name = _selector_label(baseline)
    m_name = _selector_label(method)
    workloads = [str(w) for w in _as_list(context.get("workload", sorted(set(cells["workload"]))))]
    for wl in workloads:
        bw = b_cells[b_cells["workload"] == wl]
        mw = m_cells[m_cells["workload"] == wl]
        pair = None
        for _, b in bw.iterrows():
            same = mw[mw["context_hash"] == b["context_hash"]]
            if len(same):
                pair = (b, same.iloc[0])
                break
        if pair is None:
            missing = "baseline" if bw.empty else ("method" if mw.empty else "a shared context")
            out.append(PairResult(wl, b_name, m_name, math.nan, math.nan, math.nan, 0, "", None, None,
                                  note=f"no data: {missing} not in this campaign"))
            continue
        b, m = pair
        sp = speedup_between(c, b["config_hash"], m["config_hash"], n_boot=n_boot, seeds=seeds)
        note = ""
        if b["failures"] or m["failures"]:
            note = f"failures: baseline {b['failures']}/{b['repeats']}, method {m['failures']}/{m['repeats']}"
        out.append(PairResult(wl, b_name, m_name, sp["value"], sp["ci_low"], sp["ci_high"], sp["pairs"],
                              sp["metric"], b["config_hash"], m["config_hash"], note))
    return out


def _selector_label(sel: dict[str, Any]) -> str:
    label = str(sel["method"])
    params = sel.get("params") or {}
    if params:
        label += "(" + ", ".join(f"{k}={v}" for k, v in params.items()) + ")"
    return method_label(label, str(sel.get("mode", "fair")))


def verdict(value: float, tolerance: float, lo: float, hi: float) -> str:
    """Reproduced when the CI overlaps [value/(1+tol), value*(1+tol)]."""
    if any(math.isnan(x) for x in (lo, hi)):
        return "no data"
    band_lo, band_hi = value / (1.0 + tolerance), value * (1.0 + tolerance)
    if hi < band_lo:
        return "not reproduced"
    if lo > band_hi:
        return "exceeded"
    return "reproduced"


@dataclass
class ClaimResult:
    id: str
    statement: str
    claimed: float
    tolerance: float
    result: PairResult
    verdict: str
    reasons: list[str] = field(default_factory=list)

    def to_summary(self) -> dict[str, Any]:
        r = self.result
        return {
            "id": self.id,
            "statement": self.statement,
            "claimed": self.claimed,
            "tolerance": self.tolerance,
            "reproduced_value": _clean(r.speedup),
            "ci95": [_clean(r.ci_low), _clean(r.ci_high)],
            "pairs": r.pairs,
            "metric": r.metric,
            "baseline": r.baseline,
            "method": r.method,
            "verdict": self.verdict,
            "reasons": self.reasons,
        }


def _clean(x: float) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def evaluate_claims(c: Campaign, cells: pd.DataFrame, claims: dict[str, Any], n_boot: int = 2000) -> list[ClaimResult]:
    out = []
    for cl in claims.get("claims", []):
        res = compare(c, cells, cl["context"], cl["baseline"], cl["method"], n_boot=n_boot)
        r = res[0]
        v = verdict(float(cl["value"]), float(cl["tolerance"]), r.ci_low, r.ci_high)
        reasons = []
        if r.note:
            reasons.append(r.note)
        if v != "no data":
            band = (cl["value"] / (1 + cl["tolerance"]), cl["value"] * (1 + cl["tolerance"]))
            reasons.append(
                f"measured {r.speedup:.2f}x, 95% CI [{r.ci_low:.2f}, {r.ci_high:.2f}] over {r.pairs} paired "
                f"repeats ({r.metric}); tolerance band [{band[0]:.2f}, {band[1]:.2f}]"
            )
        out.append(ClaimResult(cl["id"], " ".join(str(cl.get("statement", "")).split()), float(cl["value"]),
                               float(cl["tolerance"]), r, v, reasons))
    return out


def evaluate_comparisons(c: Campaign, cells: pd.DataFrame, claims: dict[str, Any], n_boot: int = 2000) -> pd.DataFrame:
    rows = []
    for comp in claims.get("comparisons", []):
        for base in _as_list(comp["baseline"]):
            for meth in _as_list(comp["method"]):
                for r in compare(c, cells, comp["context"], base, meth, n_boot=n_boot):
                    rows.append({"comparison": comp["id"], "workload": r.workload, "method": r.method,
                                 "baseline": r.baseline, "speedup": r.speedup, "ci_low": r.ci_low,
                                 "ci_high": r.ci_high, "pairs": r.pairs, "metric": r.metric, "note": r.note,
                                 "baseline_cell": r.baseline_cell, "method_cell": r.method_cell})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------
# Decomposition


def _cell_parts(c: Campaign, cell: str) -> dict[str, float]:
    st = c.steps[c.steps["config_hash"] == cell]
    out = {k: float(st[k].astype(float).mean()) for k in STEP_PARTS}
    sim_total = sum(out.values())
    out["planner_s"] = max(0.0, float(st["step_time_s"].astype(float).mean()) - sim_total)
    return out


def _median_thr(c: Campaign, cell: str) -> float:
    runs = c.runs[c.runs["config_hash"] == cell]
    vals = [float(v) if s == "ok" and v is not None else 0.0 for v, s in zip(runs["tokens_per_s"], runs["status"])]
    return float(np.median(vals)) if vals else math.nan


PART_NAMES = {
    "idle_s": "load imbalance (ranks waiting)",
    "comm_s": "sequence-parallel communication",
    "recompute_s": "activation recomputation",
    "compute_s": "forward + backward compute",
    "sync_s": "gradient sync + optimizer step",
    "planner_s": "planner time not hidden",
}


def decompose(c: Campaign, cells: pd.DataFrame, claim: dict[str, Any]) -> pd.DataFrame | None:
    """Split the claim's speedup S = thr(method, paper) / thr(baseline, paper) into factors:

    S = [thr(b, fair) / thr(b, paper)] x [thr(m, fair) / thr(b, fair)] x [thr(m, paper) / thr(m, fair)]

    The outer two are the paper-mode switches (how samples are dealt, dropped and grouped into
    optimizer steps: optimizer-step amortisation) on each side; the middle one is the fair-mode
    speedup, split further by the simulator's time accounting: mean step time T = compute +
    recompute + communication + sync + idle (+ planner), so log(T_b / T_m) is shared out in
    proportion to each part's saving. Returns None when a cell is missing."""
    ctx = claim["context"]
    sel = {}
    for side in ("baseline", "method"):
        for mode in ("paper", "fair"):
            s = dict(claim[side])
            s["mode"] = mode
            found = select_cells(cells, ctx, s)
            if found.empty:
                return None
            sel[(side, mode)] = found.iloc[0]["config_hash"]
    thr = {k: _median_thr(c, v) for k, v in sel.items()}
    if any(not (x > 0) for x in thr.values()):
        return None
    parts_b = _cell_parts(c, sel[("baseline", "fair")])
    parts_m = _cell_parts(c, sel[("method", "fair")])
    T_b, T_m = sum(parts_b.values()), sum(parts_m.values())
    rows = [{"factor": "paper mode, baseline side (dealing, drops, optimizer-step amortisation)",
             "log_share": math.log(thr[("baseline", "fair")] / thr[("baseline", "paper")])}]
    fair_log = math.log(thr[("method", "fair")] / thr[("baseline", "fair")])
    acct_log = math.log(T_b / T_m) if T_m > 0 and T_b > 0 else 0.0
    for key, name in PART_NAMES.items():
        saving = parts_b[key] - parts_m[key]
        share = acct_log * saving / (T_b - T_m) if T_b != T_m else 0.0
        rows.append({"factor": f"fair mode: {name}", "log_share": share,
                     "baseline_s": parts_b[key], "method_s": parts_m[key]})
    rows.append({"factor": "fair mode: median vs mean (statistical residual)", "log_share": fair_log - acct_log})
    rows.append({"factor": "paper mode, method side (dealing, drops, optimizer-step amortisation)",
                 "log_share": math.log(thr[("method", "paper")] / thr[("method", "fair")])})
    df = pd.DataFrame(rows)
    df["factor_x"] = np.exp(df["log_share"])
    total = math.log(thr[("method", "paper")] / thr[("baseline", "paper")])
    df["share_of_log_speedup"] = df["log_share"] / total if total else math.nan
    return df


# --------------------------------------------------------------------------------------------
# Sensitivity


def sensitivity(
    c: Campaign, cells: pd.DataFrame, claims: dict[str, Any], n_boot: int = 1000
) -> pd.DataFrame:
    """The headline speedups with each uncertain constant halved and doubled (tornado data)."""
    sens = claims.get("sensitivity") or {}
    if not sens:
        return pd.DataFrame()
    by_id = {x["id"]: x for x in [*claims.get("claims", []), *claims.get("comparisons", [])]}
    targets = [by_id[i] for i in [sens.get("claim"), sens.get("also")] if i in by_id]
    rows = []
    for t in targets:
        for const in sens.get("constants", []):
            for f in sens.get("factors", [0.5, 2.0]):
                if const == "mem_cap":
                    # A cap cannot exceed the GPU's usable memory: doubling 0.7 is clipped to 1.0.
                    r = compare(c, cells, t["context"], t["baseline"], t["method"],
                                mem_cap_fraction=min(1.0, DEFAULT_MEM_CAP_FRACTION * float(f)), n_boot=n_boot)[0]
                else:
                    r = compare(c, cells, t["context"], t["baseline"], t["method"],
                                scales={const: float(f)}, n_boot=n_boot)[0]
                # The reference (default constants) over the same seeds as this variant, so a bar
                # shows the constant's effect, not a difference in which batches were drawn.
                seeds = (cell_seeds(c, r.baseline_cell) & cell_seeds(c, r.method_cell)) if r.method_cell and r.baseline_cell else None
                base = compare(c, cells, t["context"], t["baseline"], t["method"], n_boot=n_boot, seeds=seeds)[0]
                rows.append({"comparison": t["id"], "constant": const, "factor": float(f),
                             "speedup": r.speedup, "ci_low": r.ci_low, "ci_high": r.ci_high,
                             "reference_speedup": base.speedup, "pairs": r.pairs, "note": r.note})
    return pd.DataFrame(rows)
