"""The claims engine: every claim of a claim file (`dcp_bench.report.claim_spec`, docs/claims.md)
judged against a campaign, once. It computes each claim's tolerance band, its seed-CI verdict,
the system-level validation rule (`verdict_rule`: a simulated verdict stands only when the
simulator reproduces the claim's system's own published measurement within the tolerance), the
model band, the verdict of every variant (readings, sensitivity rows), the decomposition of a
speedup, its sensitivity to cost constants, "what it takes" and the paper-mode table (every
faithful method on the reference's three mixes and two clusters). The report, its first screen
and summary.json render what it decided; none recomputes a band or a verdict.

Selecting cells. A selector names a method, optionally its mode, its parameters and the run unit
(``unit: epoch | step``; paper mode without one prefers the reference's epoch loop). Among the
cells that match, the ones whose *other* method parameters differ least from the method's config
defaults are taken, so a reading's extra parameter (e.g. ``deals_per_iteration: 0``) never
stands in for the headline's default."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dcp_bench.config import load_config, to_container
from dcp_bench.cost.base import (
    DEFAULT_MEM_CAP_FRACTION,
    MICROBATCH_TIME_TERMS,
    STEP_TIME_TERMS,
    SYNC_PART,
    time_parts,
)
from dcp_bench.errors import ConfigError, DcpBenchError
from dcp_bench.paths import CONF_DIR
from dcp_bench.planners.base import method_label
from dcp_bench.reference import unit_of_label
from dcp_bench.report.claim_spec import load_claim_set
from dcp_bench.report.stats import relative_half_width
from dcp_bench.report.system_validation import (
    PublishedSystem,
    SystemValidation,
    rows_missed,
    system_for_claim,
    validate_system,
)
from dcp_bench.report.tables import STEP_PARTS, Campaign, cell_seeds, speedup_between


def load_claims(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A claims list or claim file (docs/claims.md), checked, in the engine's form
    (`dcp_bench.report.claim_spec.ClaimSet.as_dict`)."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(
            f"claims file {str(path)!r} not found (expected results/reference/claims.yaml)"
        )
    return load_claim_set(path).as_dict()


def campaign_system_values(
    c: Campaign,
    cells: pd.DataFrame,
    system: PublishedSystem,
    extra_context: dict[str, Any] | None = None,
    mem_cap_fraction: float | None = DEFAULT_MEM_CAP_FRACTION,
) -> dict[str, dict[int, float]]:
    """Per row of ``system``, the campaign's per-seed figures of the matching cell (the
    system's context, ``extra_context`` (e.g. a cost source) and the row's selector; default
    cost constants), in the metric's own unit."""
    out: dict[str, dict[int, float]] = {}
    mean_steps = system.metric == "mean_step_time_s"
    if cells.empty or (system.metric not in c.runs.columns and not mean_steps):
        return out
    context = {**system.context, **(extra_context or {})}
    for row in system.rows:
        sel = select_cells(cells, context, row.select, mem_cap_fraction=mem_cap_fraction)
        if sel.empty:
            continue
        runs = c.runs[(c.runs["config_hash"] == sel.iloc[0]["config_hash"])]
        runs = runs[runs["status"] == "ok"]
        if mean_steps:
            means = c.steps.groupby("run_id")["step_time_s"].mean()
            runs = runs.assign(mean_step_time_s=[means.get(rid) for rid in runs["run_id"]])
        vals = {
            int(sd): float(v)
            for sd, v in zip(runs["seed"], runs[system.metric])
            if v is not None and math.isfinite(float(v))
        }
        if vals:
            out[row.id] = vals
    return out


def claim_validation(
    c: Campaign,
    cells: pd.DataFrame,
    claims: dict[str, Any],
    claim_id: str,
    extra_context: dict[str, Any] | None = None,
    mem_cap_fraction: float | None = DEFAULT_MEM_CAP_FRACTION,
) -> SystemValidation | None:
    """The claim's system validated on this campaign's own runs (None: no system names it)."""
    system = system_for_claim(claims.get("_systems") or [], claim_id)
    if system is None:
        return None
    values = campaign_system_values(c, cells, system, extra_context, mem_cap_fraction)
    missing = [r.id for r in system.rows if r.id not in values]
    note = f"not in this campaign: {', '.join(missing)}" if missing else ""
    return validate_system(system, values, note=note)


def _as_list(x: Any) -> list[Any]:
    return list(x) if isinstance(x, (list, tuple)) else [x]


def spec_for(claims: dict[str, Any], key: str, claim_id: str) -> dict[str, Any]:
    """A claim's ``paper_table``, ``sensitivity`` or ``model_band`` section (one mapping, or a
    list of them when several claims have one; a section without ``claim`` is every claim's)."""
    for spec in _as_list(claims.get(key) or []):
        if spec and spec.get("claim", claim_id) == claim_id:
            return dict(spec)
    return {}


_DEFAULTS: dict[str, dict[str, Any] | None] = {}


def method_defaults(name: str) -> dict[str, Any] | None:
    """A method's config defaults (its parameters, without name, _target_ and mode); None for a
    method the packaged configs do not know (a user's, or a test's)."""
    if name not in _DEFAULTS:
        try:
            node = dict(to_container(load_config([f"method={name}"]))["method"])
        except DcpBenchError:
            _DEFAULTS[name] = None
        else:
            _DEFAULTS[name] = {
                k: v for k, v in node.items() if k not in ("name", "_target_", "mode")
            }
    return _DEFAULTS[name]


def _distance(params_json: str, selector: dict[str, Any]) -> int:
    """How many parameters of a cell, besides the selector's own, differ from the defaults."""
    defaults = method_defaults(str(selector["method"]))
    if defaults is None:
        return 0
    params = json.loads(params_json)
    given = selector.get("params") or {}
    keys = (set(params) | set(defaults)) - set(given)
    return sum(1 for k in keys if params.get(k) != defaults.get(k))


def select_cells(
    cells: pd.DataFrame,
    context: dict[str, Any],
    selector: dict[str, Any],
    scales: dict[str, float] | None = None,
    mem_cap_fraction: float | None = DEFAULT_MEM_CAP_FRACTION,
) -> pd.DataFrame:
    """Cells matching a context (workload/cluster/model, each a value or a list), a method
    selector {method, mode?, unit?, params?}, the given cost scales (default: none) and memory
    cap; per context, only the closest to the method's defaults (module docstring)."""
    if cells.empty:
        return cells
    mask = np.ones(len(cells), dtype=bool)
    for key in ("workload", "cluster", "model", "cost_source"):
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
    units = np.array([unit_of_label(str(lb)) for lb in cells["label"]])
    if "unit" in selector:
        mask &= units == str(selector["unit"])
    elif selector.get("mode") == "paper" and (mask & (units == "epoch")).any():
        mask &= units == "epoch"  # paper mode means the reference's epoch loop where there is one
    out = cells[mask]
    if out.empty:
        return out
    if selector.get("pick") == "fastest":
        return _fastest(out)
    # Per context: the cells closest to the method's defaults.
    score = np.array([_distance(p, selector) for p in out["params"]], dtype=float)
    keep = np.zeros(len(out), dtype=bool)
    ctx = out["context_hash"].to_numpy()
    for h in set(ctx):
        sel = ctx == h
        keep |= sel & (score == score[sel].min())
    return out[keep]


def _fastest(cells: pd.DataFrame) -> pd.DataFrame:
    """Per context, the cell with the smallest median step time among those whose every run
    succeeded (``pick: fastest``: a setting hand-tuned over the swept ones, as a publication
    tunes its baseline); none in a context where every cell failed somewhere."""
    ok = cells[(cells["failures"].astype(int) == 0) & cells["median_s"].notna()]
    keep = [group["median_s"].astype(float).idxmin() for _, group in ok.groupby("context_hash")]
    return cells.loc[sorted(keep)]


def speedup_by_step(
    c: Campaign, baseline_cell: str, method_cell: str, n_boot: int = 2000, seed: int = 0
) -> dict[str, Any]:
    """Speedup of one cell over another paired by step: the ratio of the summed step times over
    the (seed, step) pairs both sides measured, with the percentile interval of that ratio over
    the pairs resampled together (``pair_by: step``: the steps are fixed iterations, the same data
    on both sides). Only ok runs count; a side without any gives no number."""
    runs = c.runs[c.runs["status"] == "ok"][["run_id", "config_hash", "seed"]]
    steps = c.steps.merge(runs, on=["run_id", "config_hash"])
    sides = []
    for cell in (baseline_cell, method_cell):
        st = steps[steps["config_hash"] == cell]
        sides.append(
            {
                (int(sd), int(k)): float(t)
                for sd, k, t in zip(st["seed"], st["step"], st["step_time_s"])
            }
        )
    keys = sorted(set(sides[0]) & set(sides[1]))
    empty = {"value": math.nan, "ci_low": math.nan, "ci_high": math.nan, "pairs": 0}
    if not keys:
        return {**empty, "metric": "step_time"}
    b = np.array([sides[0][k] for k in keys])
    m = np.array([sides[1][k] for k in keys])
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(keys), size=(n_boot, len(keys)))
    draws = b[idx].sum(axis=1) / m[idx].sum(axis=1)
    return {
        "value": float(b.sum() / m.sum()),
        "ci_low": float(np.quantile(draws, 0.025)),
        "ci_high": float(np.quantile(draws, 0.975)),
        "pairs": len(keys),
        "metric": "step_time",
    }


def _no_data_note(side: str, selector: dict[str, Any], workload: str) -> str:
    """Why a side has no cells: no workload config of that name, its method has no config at
    all, or it is not in the campaign."""
    if not (CONF_DIR / "workload" / f"{workload}.yaml").is_file():
        return f"not judged: no workload {workload}"
    if method_defaults(str(selector["method"])) is None:
        return f"not judged: no method {selector['method']}"
    return f"no data: {side} not in this campaign"


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
    steps_per_run: dict[str, float] = field(
        default_factory=dict
    )  # median measured steps per run, each side
    unit: str = ""  # epoch (the reference's epoch loop) or step


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
    pair_by: str = "seed",
) -> list[PairResult]:
    """Speedups of ``method`` over ``baseline`` in every matching context (one per workload),
    over the repeats with the given ``seeds`` only when given; paired by seed (the median of the
    per-seed ratios) or, ``pair_by="step"``, by step (`speedup_by_step`)."""
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
            if bw.empty or mw.empty:
                side, sel = ("baseline", baseline) if bw.empty else ("method", method)
                note = _no_data_note(side, sel, wl)
                unpicked = {k: v for k, v in sel.items() if k != "pick"}
                if (
                    "pick" in sel
                    and not select_cells(
                        cells, {**context, "workload": wl}, unpicked, scales, mem_cap_fraction
                    ).empty
                ):
                    note = f"not judged: every {side} cell ({sel['method']}) failed in some run"
            else:
                note = "no data: a shared context not in this campaign"
            out.append(
                PairResult(
                    wl,
                    b_name,
                    m_name,
                    math.nan,
                    math.nan,
                    math.nan,
                    0,
                    "",
                    None,
                    None,
                    note=note,
                )
            )
            continue
        b, m = pair
        if pair_by == "step":
            sp = speedup_by_step(c, b["config_hash"], m["config_hash"], n_boot=n_boot)
        else:
            sp = speedup_between(c, b["config_hash"], m["config_hash"], n_boot=n_boot, seeds=seeds)
        note = ""
        if b["failures"] or m["failures"]:
            note = (
                f"failures: baseline {b['failures']}/{b['repeats']}, method "
                f"{m['failures']}/{m['repeats']}"
            )
        steps = {
            side: _median_steps(c, cell["config_hash"])
            for side, cell in (("baseline", b), ("method", m))
        }
        out.append(
            PairResult(
                wl,
                b_name,
                m_name,
                sp["value"],
                sp["ci_low"],
                sp["ci_high"],
                sp["pairs"],
                sp["metric"],
                b["config_hash"],
                m["config_hash"],
                note,
                steps,
                unit_of_label(str(m["label"])),
            )
        )
    return out


def _median_steps(c: Campaign, cell: str) -> float:
    """Median measured steps (epoch unit: iterations of the epoch) per ok run of a cell."""
    runs = c.runs[(c.runs["config_hash"] == cell) & (c.runs["status"] == "ok")]
    return float(np.median(runs["n_steps"].astype(float))) if len(runs) else math.nan


def _epochs(c: Campaign, cell: str | None) -> int | None:
    """Measured epochs per run of an epoch-unit cell, where the run records say (column
    ``epochs``)."""
    if cell is None or "epochs" not in c.runs.columns:
        return None
    vals = c.runs.loc[c.runs["config_hash"] == cell, "epochs"].dropna()
    return int(vals.iloc[0]) if len(vals) else None


def _selector_label(sel: dict[str, Any]) -> str:
    label = str(sel["method"])
    params = sel.get("params") or {}
    if params:
        label += "(" + ", ".join(f"{k}={v}" for k, v in params.items()) + ")"
    return method_label(label, str(sel.get("mode", "fair")))


def tolerance_band(value: float, tolerance: float) -> tuple[float, float]:
    """The claimed value's tolerance band [value / (1 + tolerance), value x (1 + tolerance)]:
    the one place the band is computed."""
    return value / (1.0 + tolerance), value * (1.0 + tolerance)


def within_tolerance(error: float, tolerance: float) -> bool:
    """Whether the simulator's relative error on a published comparison is within a claim's
    tolerance (the validation rule's test)."""
    return abs(error) <= tolerance


def verdict(value: float, tolerance: float, lo: float, hi: float) -> str:
    """ "reproduced" when the CI lies inside the tolerance band [value/(1+tol), value*(1+tol)],
    "not reproduced" when it lies wholly outside it (below or above), "undecided" when it
    straddles an edge of the band; "no data" without a CI."""
    if any(math.isnan(x) for x in (lo, hi)):
        return "no data"
    band_lo, band_hi = tolerance_band(value, tolerance)
    if hi < band_lo or lo > band_hi:
        return "not reproduced"
    if band_lo <= lo and hi <= band_hi:
        return "reproduced"
    return "undecided"


def verdict_words(v: str, value: float, tolerance: float, lo: float, hi: float) -> str:
    """The verdict said in words, with where the CI lies against the band."""
    band_lo, band_hi = tolerance_band(value, tolerance)
    where = {
        "reproduced": (
            f"the whole 95% CI [{lo:.2f}, {hi:.2f}] lies inside the tolerance band "
            f"[{band_lo:.2f}, {band_hi:.2f}]"
        ),
        "not reproduced": (
            f"the whole 95% CI [{lo:.2f}, {hi:.2f}] lies {'below' if hi < band_lo else 'above'} "
            f"the tolerance band [{band_lo:.2f}, {band_hi:.2f}]"
        ),
        "undecided": (
            f"the 95% CI [{lo:.2f}, {hi:.2f}] straddles an edge of the tolerance band "
            f"[{band_lo:.2f}, {band_hi:.2f}]"
        ),
    }.get(v, "no confidence interval")
    return f"{v}: {where}"


def verdict_rule(
    ci_verdict: str, tolerance: float, validation: SystemValidation | None
) -> tuple[str, str]:
    """The claim's verdict and the rule's reason in words. A CI verdict of "reproduced" or "not
    reproduced" stands only when the simulator's error on the claimed comparison, as the
    claim's system published it, is within ``tolerance``; otherwise the verdict is "undecided"
    (in simulation). "no data" and "undecided" stay as they are."""
    if ci_verdict not in ("reproduced", "not reproduced"):
        return ci_verdict, ""
    if validation is None:
        return (
            "undecided",
            "undecided in simulation: no published end-to-end measurement of the claim's system "
            "validates the simulator (results/validation/systems.yaml names none)",
        )
    s = validation.system
    err = validation.claimed_error
    cm = s.claimed_comparison
    what = (
        f"the authors' {s.hardware.split(' (')[0]} measurement of this comparison "
        f"({cm['method']} over {cm['baseline']}, {s.context.get('workload', '')})"
    )
    if not math.isfinite(err):
        why = validation.note or "its cells are not in this campaign"
        return "undecided", f"undecided in simulation: {what} could not be simulated ({why})"
    sim, pub = validation.claimed_simulated, validation.claimed_published
    numbers = f"simulated {sim:.2f}x, published {pub:.2f}x"
    missed = rows_missed(validation, tolerance)
    if missed:
        unit = s.unit.split(" (")[0]
        rows = "; ".join(
            f"{r['label']} simulated {float(r['simulated']):.2f}, published {r['published']:g}"
            for r in missed
        )
        return (
            "undecided",
            f"undecided in simulation: the simulator misses the authors' own published "
            f"measurements ({unit}) by more than the claim's {tolerance:.0%} tolerance"
            + (f" plus the {s.reading_error:g} reading error" if s.reading_error else "")
            + f": {rows}; the seed CI alone would say {ci_verdict}",
        )
    if not within_tolerance(err, tolerance):
        return (
            "undecided",
            f"undecided in simulation: the simulator misses {what} by {abs(err):.0%} ({numbers}; "
            f"the claim's tolerance is {tolerance:.0%}); the seed CI alone would say "
            f"{ci_verdict}",
        )
    return (
        ci_verdict,
        f"the simulator reproduces {what} within {abs(err):.0%} ({numbers}; tolerance "
        f"{tolerance:.0%}), so the simulated verdict stands",
    )


# What every verdict rests on until a GPU calibration of this suite is committed (the cost
# model's constants are calibrated on published measurements, its memory on the counted models).
SIMULATED_BASIS = (
    "in simulation (analytical model calibrated on published measurements, activation memory "
    "counted from the runtime's models; not validated on a GPU)"
)


# What a claim's confidence interval covers, by run unit (the report prints it beside the verdict).
CI_COVERS = {
    "epoch": (
        "the seeds' different dealing of the fixed dataset (the samplers' shuffles and draws); "
        "the dataset, the cost model and the profile are the same for every seed"
    ),
    "step": "the seeds' different global batches (data sampling)",
}
CI_COVERS_BY_STEP = (
    "the iterations, resampled in pairs (the same iteration on both sides; the workload's "
    "iterations are fixed, the same for every seed)"
)


@dataclass
class ClaimResult:
    id: str
    statement: str
    claimed: float
    tolerance: float
    result: PairResult
    verdict: str
    reasons: list[str] = field(default_factory=list)
    epochs: int | None = None
    ci_covers: str = ""
    what_it_takes: list[dict[str, Any]] = field(default_factory=list)
    paper_mode_table: list[dict[str, Any]] = field(default_factory=list)
    # min / max of the headline over the model variants (sensitivity cells, the same seeds),
    # the default model included; NaN without variants
    model_band_low: float = math.nan
    model_band_high: float = math.nan
    model_variants: list[dict[str, Any]] = field(default_factory=list)
    trained_fraction: dict[str, float | None] = field(
        default_factory=dict
    )  # samples trained / epoch samples
    imbalance: dict[str, float | None] = field(
        default_factory=dict
    )  # median idle share of rank-seconds
    accounting: dict[str, Any] = field(
        default_factory=dict
    )  # per side: the epoch's samples and settings
    basis: str = SIMULATED_BASIS
    verdict_text: str = ""
    # what the seed CI alone says against the band, before the validation rule
    ci_verdict: str = ""
    # the claim's system simulated against its publication (None: no system names the claim)
    validation: SystemValidation | None = None
    verdict_rule: str = ""
    # the claim's tolerance band (`tolerance_band`)
    band: tuple[float, float] = (math.nan, math.nan)
    # every sensitivity row of the claim with finite speedup, judged by its seed CI against the
    # band: {constant, factor, speedup, verdict} (`judge_sensitivity`)
    sensitivity_verdicts: list[dict[str, Any]] = field(default_factory=list)
    # what the CI pairs (seed | step) and, for a claim judged under named cost sources, the
    # verdict under each (the first is the claim's own)
    pair_by: str = "seed"
    by_cost_source: list[dict[str, Any]] = field(default_factory=list)

    def to_summary(self) -> dict[str, Any]:
        r = self.result
        steps = [v for v in r.steps_per_run.values() if not math.isnan(v)]
        return {
            "id": self.id,
            "statement": self.statement,
            "claimed": self.claimed,
            "tolerance": self.tolerance,
            "speedup": _clean(r.speedup),
            "ci_low": _clean(r.ci_low),
            "ci_high": _clean(r.ci_high),
            "relative_ci_width": _clean((r.ci_high - r.ci_low) / r.speedup) if r.speedup else None,
            "reproduced_value": _clean(r.speedup),
            "ci95": [_clean(r.ci_low), _clean(r.ci_high)],
            "pairs": r.pairs,
            "unit": r.unit,
            "measured_steps_per_run": min(steps) if steps else None,
            "measured_steps_per_run_by_side": {k: _clean(v) for k, v in r.steps_per_run.items()},
            "epochs": self.epochs,
            "ci_covers": self.ci_covers,
            "metric": r.metric,
            "baseline": r.baseline,
            "method": r.method,
            "verdict": self.verdict,
            "reasons": self.reasons,
            "what_it_takes": self.what_it_takes,
            "paper_mode_table": self.paper_mode_table,
            "model_band_low": _clean(self.model_band_low),
            "model_band_high": _clean(self.model_band_high),
            "model_variants": self.model_variants,
            "trained_fraction": {
                k: _clean(v) if v is not None else None for k, v in self.trained_fraction.items()
            },
            "imbalance": {
                k: _clean(v) if v is not None else None for k, v in self.imbalance.items()
            },
            "epoch_accounting": self.accounting,
            "basis": self.basis,
            "verdict_text": self.verdict_text,
            "ci_verdict": self.ci_verdict,
            "validation_error": _clean(self.validation.claimed_error)
            if self.validation is not None
            else None,
            "validation": self.validation.to_dict() if self.validation is not None else None,
            "verdict_rule": self.verdict_rule,
            **({"pair_by": self.pair_by} if self.pair_by != "seed" else {}),
            **({"by_cost_source": self.by_cost_source} if self.by_cost_source else {}),
        }


def _clean(x: float) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def evaluate_claims(
    c: Campaign, cells: pd.DataFrame, claims: dict[str, Any], n_boot: int = 2000
) -> list[ClaimResult]:
    """Every claim's verdict, with its statistics (what the CI covers, steps or epochs per run,
    whether the CI met the convergence target), and for the claims that have them, the
    "what it takes" readings and the paper-mode table."""
    out = []
    target = float((claims.get("statistics") or {}).get("max_relative_half_width", 0.05))
    for cl in claims.get("claims", []):
        sources = list(cl.get("cost_sources") or [])
        pair_by = str(cl.get("pair_by", "seed"))
        # judged under named cost sources: each source's cells carry their own memory cap
        cap = None if sources else DEFAULT_MEM_CAP_FRACTION
        context = {**cl["context"], **({"cost_source": sources[0]} if sources else {})}
        res = compare(
            c,
            cells,
            context,
            cl["baseline"],
            cl["method"],
            n_boot=n_boot,
            mem_cap_fraction=cap,
            pair_by=pair_by,
        )
        r = res[0]
        v = verdict(float(cl["value"]), float(cl["tolerance"]), r.ci_low, r.ci_high)
        reasons = []
        if r.note:
            reasons.append(r.note)
        epochs = _epochs(c, r.method_cell)
        covers = CI_COVERS_BY_STEP if pair_by == "step" else CI_COVERS.get(r.unit, "")
        if v != "no data":
            band = tolerance_band(float(cl["value"]), float(cl["tolerance"]))
            per_run = ", ".join(
                f"{k} {x:g}" for k, x in r.steps_per_run.items() if not math.isnan(x)
            )
            unit = "iterations of one epoch" if r.unit == "epoch" else "measured steps"
            how = (
                f"summed step times over {r.pairs} paired steps"
                if pair_by == "step"
                else f"median of {r.pairs} paired per-seed ratios"
            )
            reasons.append(
                f"measured {r.speedup:.2f}x, 95% CI [{r.ci_low:.2f}, {r.ci_high:.2f}] ({how}, "
                f"{r.metric}; {unit} per run: {per_run}); "
                f"tolerance band [{band[0]:.2f}, {band[1]:.2f}]"
            )
            half = relative_half_width(r.speedup, r.ci_low, r.ci_high)
            reasons.append(
                f"the CI covers {covers}; its half-width is {half:.1%} of the value "
                f"({'within' if half <= target else 'ABOVE'} the {target:.0%} target)"
            )
        readings = evaluate_readings(c, cells, claims, cl, n_boot=n_boot)
        table = evaluate_paper_table(c, cells, claims, cl, n_boot=n_boot)
        res_ = ClaimResult(
            cl["id"],
            " ".join(str(cl.get("statement", "")).split()),
            float(cl["value"]),
            float(cl["tolerance"]),
            r,
            v,
            reasons,
            epochs,
            covers,
            _records(readings),
            _records(table),
        )
        _add_model_band(res_, c, cells, claims, cl)
        for side, cell in (("method", r.method_cell), ("baseline", r.baseline_cell)):
            acc = epoch_accounting(c, cell)
            res_.accounting[side] = acc
            res_.trained_fraction[side] = acc.get("trained_fraction")
            res_.imbalance[side] = median_imbalance(c, cell)
        res_.band = tolerance_band(res_.claimed, res_.tolerance)
        res_.ci_verdict = v
        res_.validation = claim_validation(
            c, cells, claims, cl["id"], {"cost_source": sources[0]} if sources else None, cap
        )
        res_.verdict, res_.verdict_rule = verdict_rule(v, float(cl["tolerance"]), res_.validation)
        res_.pair_by = pair_by
        if sources:
            res_.basis = (
                f"in simulation under the cost source {sources[0]} (the claim's verdict)"
                + (f"; also shown under {', '.join(sources[1:])}" if sources[1:] else "")
                + "; no constant fitted to the published numbers, not validated on a GPU run "
                "of this suite"
            )
        for source in sources:
            res_.by_cost_source.append(
                _judge_under(c, cells, claims, cl, source, pair_by, n_boot)
                if source != sources[0]
                else _source_row(source, r, v, res_.verdict, res_.verdict_rule, res_.validation)
            )
        if v != "no data":
            words = verdict_words(
                v, float(cl["value"]), float(cl["tolerance"]), r.ci_low, r.ci_high
            )
            if res_.verdict != v:
                words = f"{res_.verdict} ({res_.verdict_rule}); the seed CI: {words}"
            res_.verdict_text = f"{words}; {res_.basis}"
            res_.reasons.insert(0, res_.verdict_text)
            if res_.verdict == v and res_.verdict_rule:
                res_.reasons.insert(1, res_.verdict_rule)
            if not math.isnan(res_.model_band_low):
                res_.reasons.append(
                    f"model band [{res_.model_band_low:.2f}, {res_.model_band_high:.2f}]: the "
                    f"headline over {len(res_.model_variants)} cost-model variants (the same "
                    f"seeds), beside the seed CI [{r.ci_low:.2f}, {r.ci_high:.2f}]"
                )
        out.append(res_)
    return out


def _source_row(
    source: str,
    r: PairResult,
    ci_verdict: str,
    final: str,
    rule: str,
    validation: SystemValidation | None,
) -> dict[str, Any]:
    return {
        "cost_source": source,
        "speedup": _clean(r.speedup),
        "ci95": [_clean(r.ci_low), _clean(r.ci_high)],
        "pairs": r.pairs,
        "baseline_cell": r.baseline_cell,
        "method_cell": r.method_cell,
        "note": r.note,
        "ci_verdict": ci_verdict,
        "verdict": final,
        "verdict_rule": rule,
        "validation": validation.to_dict() if validation is not None else None,
    }


def _judge_under(
    c: Campaign,
    cells: pd.DataFrame,
    claims: dict[str, Any],
    cl: dict[str, Any],
    source: str,
    pair_by: str,
    n_boot: int,
) -> dict[str, Any]:
    """The claim's verdict under one more cost source: the same band, CI and validation rule."""
    r = compare(
        c,
        cells,
        {**cl["context"], "cost_source": source},
        cl["baseline"],
        cl["method"],
        n_boot=n_boot,
        mem_cap_fraction=None,
        pair_by=pair_by,
    )[0]
    v = verdict(float(cl["value"]), float(cl["tolerance"]), r.ci_low, r.ci_high)
    val = claim_validation(c, cells, claims, cl["id"], {"cost_source": source}, None)
    final, rule = verdict_rule(v, float(cl["tolerance"]), val)
    return _source_row(source, r, v, final, rule, val)


def epoch_accounting(c: Campaign, cell: str | None) -> dict[str, Any]:
    """The epoch's accounting of a paper-mode cell, from its first ok run (the dataset is fixed,
    so the seeds differ only in how it is dealt): dataset, trained and dropped samples (by
    reason), ``trained_fraction`` (trained / dataset samples; the median over the ok runs) and
    the reference profile's per-bucket settings (sp, bs, ckpt_layers). Empty without one."""
    if cell is None or "epoch_info" not in c.runs.columns:
        return {}
    runs = c.runs[(c.runs["config_hash"] == cell) & (c.runs["status"] == "ok")]
    infos = []
    for raw in runs["epoch_info"]:
        if not raw:
            continue
        epochs = json.loads(raw)
        if epochs:
            infos.append(epochs[0])
    if not infos:
        return {}
    fractions = [
        float(i["trained_samples"]) / float(i["dataset_samples"])
        for i in infos
        if i.get("dataset_samples")
    ]
    first = infos[0]
    return {
        "dataset_samples": first.get("dataset_samples"),
        "trained_samples_median": float(
            np.median([float(i.get("trained_samples", 0)) for i in infos])
        ),
        "dropped_samples": first.get("dropped_samples", {}),
        "trained_fraction": float(np.median(fractions)) if fractions else None,
        "profile": first.get("profile", {}),
        "runs": len(infos),
        # the reference's own estimate from the profile (sampler.py:259-271), median over runs
        "reference_imbalance": _median_or_none([i.get("reference_imbalance") for i in infos]),
    }


def _median_or_none(values: list[Any]) -> float | None:
    vals = [float(v) for v in values if v is not None]
    return float(np.median(vals)) if vals else None


def median_imbalance(c: Campaign, cell: str | None) -> float | None:
    """Median over a cell's ok runs of the run's imbalance (idle share of all rank-seconds,
    sum(idle) / (W x step time), per iteration, median over the epoch's iterations)."""
    if cell is None:
        return None
    runs = c.runs[(c.runs["config_hash"] == cell) & (c.runs["status"] == "ok")]
    vals = [
        float(v)
        for v in runs["imbalance"]
        if v is not None and not (isinstance(v, float) and math.isnan(v))
    ]
    return float(np.median(vals)) if vals else None


def _add_model_band(
    res: ClaimResult, c: Campaign, cells: pd.DataFrame, claims: dict[str, Any], cl: dict[str, Any]
) -> None:
    """Fill the claim's model band: the headline's speedup under every model variant of the
    ``model_band`` spec in claims.yaml (cost scales, cost-model options, memory caps) whose runs
    are in the campaign, each over the seeds it shares with the headline, the default included."""
    spec = spec_for(claims, "model_band", cl["id"])
    if not spec:
        return
    r = res.result
    if math.isnan(r.speedup):
        return
    values = [r.speedup]
    for var in spec.get("variants", []):
        scales = {k: float(v) for k, v in (var.get("scales") or {}).items()}
        cap = float(var.get("mem_cap_fraction", DEFAULT_MEM_CAP_FRACTION))
        vr = compare(
            c,
            cells,
            cl["context"],
            cl["baseline"],
            cl["method"],
            scales=scales or None,
            mem_cap_fraction=cap,
            n_boot=200,
        )[0]
        if math.isnan(vr.speedup):
            continue
        values.append(vr.speedup)
        res.model_variants.append(
            {
                "variant": _variant_label(scales, cap),
                "speedup": vr.speedup,
                "ci_low": vr.ci_low,
                "ci_high": vr.ci_high,
                "pairs": vr.pairs,
            }
        )
    if res.model_variants:
        res.model_band_low, res.model_band_high = float(min(values)), float(max(values))


def _variant_label(scales: dict[str, float], cap: float) -> str:
    parts = [f"{k}={v:g}" for k, v in sorted(scales.items())]
    if not math.isclose(cap, DEFAULT_MEM_CAP_FRACTION):
        parts.append(f"mem_cap_fraction={cap:g}")
    return ", ".join(parts) or "default"


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
    if df.empty:
        return []
    rows = (
        df.replace([np.inf, -np.inf], np.nan)
        .astype(object)
        .where(df.notna(), None)
        .to_dict(orient="records")
    )
    return [
        {str(k): (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}
        for row in rows
    ]


# --------------------------------------------------------------------------------------------
# What it takes: the verdict under each reading of the reference


def _merge(sel: dict[str, Any], extra: dict[str, Any] | None) -> dict[str, Any]:
    out = dict(sel)
    if extra:
        params = {**(sel.get("params") or {}), **(extra.get("params") or {})}
        out.update({k: v for k, v in extra.items() if k != "params"})
        if params:
            out["params"] = params
    return out


def evaluate_readings(
    c: Campaign,
    cells: pd.DataFrame,
    claims: dict[str, Any],
    claim: dict[str, Any],
    n_boot: int = 2000,
) -> pd.DataFrame:
    """ "What it takes to get the claimed value": the claim's speedup and verdict under each
    reading of the reference's code listed under ``readings`` (a reading changes the baseline
    and/or the method selector of the claim: a parameter, or the run unit). One row per reading;
    the first row of each question is the reading the headline uses."""
    rows = []
    for rd in claims.get("readings", []):
        if rd.get("claim", claim["id"]) != claim["id"]:
            continue
        ctx = {**claim["context"], **(rd.get("context") or {})}
        base = _merge(claim["baseline"], rd.get("baseline"))
        meth = _merge(claim["method"], rd.get("method"))
        r = compare(c, cells, ctx, base, meth, n_boot=n_boot)[0]
        rows.append(
            {
                "question": rd.get("question", ""),
                "reading": rd.get("reading", rd.get("id", "")),
                "headline_reading": bool(rd.get("headline", False)),
                "workload": r.workload,
                "speedup": r.speedup,
                "ci_low": r.ci_low,
                "ci_high": r.ci_high,
                "pairs": r.pairs,
                "verdict": verdict(
                    float(claim["value"]), float(claim["tolerance"]), r.ci_low, r.ci_high
                ),
                "baseline": r.baseline,
                "method": r.method,
                "note": r.note or rd.get("note", ""),
            }
        )
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------
# The paper-mode table


def evaluate_paper_table(
    c: Campaign,
    cells: pd.DataFrame,
    claims: dict[str, Any],
    claim: dict[str, Any],
    n_boot: int = 2000,
) -> pd.DataFrame:
    """Every method of ``paper_table`` over the claim's baseline on every workload and cluster
    listed there: median throughput of each side and the paired speedup with its CI."""
    spec = spec_for(claims, "paper_table", claim["id"])
    if not spec:
        return pd.DataFrame()
    rows = []
    for cluster in _as_list(spec.get("clusters", [claim["context"].get("cluster")])):
        for wl in _as_list(spec.get("workloads", [claim["context"].get("workload")])):
            ctx = {**claim["context"], "workload": wl, "cluster": cluster}
            base = select_cells(cells, ctx, claim["baseline"])
            base_thr = _median_thr(c, base.iloc[0]["config_hash"]) if len(base) else math.nan
            base_cell = str(base.iloc[0]["config_hash"]) if len(base) else None
            rows.append(
                {
                    "cluster": cluster,
                    "workload": wl,
                    "method": _selector_label(claim["baseline"]),
                    "tokens_per_s": base_thr,
                    "speedup": 1.0 if len(base) else math.nan,
                    "ci_low": math.nan,
                    "ci_high": math.nan,
                    "pairs": 0,
                    "imbalance": median_imbalance(c, base_cell),
                    "trained_fraction": epoch_accounting(c, base_cell).get("trained_fraction"),
                }
            )
            for msel in _as_list(spec.get("methods", [])):
                r = compare(c, cells, ctx, claim["baseline"], msel, n_boot=n_boot)[0]
                thr = _median_thr(c, r.method_cell) if r.method_cell else math.nan
                rows.append(
                    {
                        "cluster": cluster,
                        "workload": wl,
                        "method": r.method,
                        "tokens_per_s": thr,
                        "speedup": r.speedup,
                        "ci_low": r.ci_low,
                        "ci_high": r.ci_high,
                        "pairs": r.pairs,
                        "imbalance": median_imbalance(c, r.method_cell),
                        "trained_fraction": epoch_accounting(c, r.method_cell).get(
                            "trained_fraction"
                        ),
                    }
                )
    return pd.DataFrame(rows)


def evaluate_comparisons(
    c: Campaign, cells: pd.DataFrame, claims: dict[str, Any], n_boot: int = 2000
) -> pd.DataFrame:
    rows = []
    for comp in claims.get("comparisons", []):
        for base in _as_list(comp["baseline"]):
            for meth in _as_list(comp["method"]):
                # a context under a named cost source: its cells carry that source's memory cap
                cap = None if "cost_source" in comp["context"] else DEFAULT_MEM_CAP_FRACTION
                pair_by = str(comp.get("pair_by", "seed"))
                for r in compare(
                    c,
                    cells,
                    comp["context"],
                    base,
                    meth,
                    n_boot=n_boot,
                    mem_cap_fraction=cap,
                    pair_by=pair_by,
                ):
                    rows.append(
                        {
                            "comparison": comp["id"],
                            "workload": r.workload,
                            "method": r.method,
                            "baseline": r.baseline,
                            "speedup": r.speedup,
                            "ci_low": r.ci_low,
                            "ci_high": r.ci_high,
                            "pairs": r.pairs,
                            "metric": r.metric,
                            "note": r.note,
                            "baseline_cell": r.baseline_cell,
                            "method_cell": r.method_cell,
                        }
                    )
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------
# Decomposition


def _cell_parts(c: Campaign, cell: str) -> dict[str, float]:
    st = c.steps[c.steps["config_hash"] == cell]
    out = {k: float(st[k].astype(float).mean()) for k in STEP_PARTS}
    # a part some runs' cost models did not have is 0 in theirs
    out.update({k: float(st[k].astype(float).fillna(0.0).mean()) for k in c.added_parts})
    sim_total = sum(out.values())
    out["planner_s"] = max(0.0, float(st["step_time_s"].astype(float).mean()) - sim_total)
    return out


def _median_thr(c: Campaign, cell: str) -> float:
    runs = c.runs[c.runs["config_hash"] == cell]
    vals = [
        float(v) if s == "ok" and v is not None else 0.0
        for v, s in zip(runs["tokens_per_s"], runs["status"])
    ]
    return float(np.median(vals)) if vals else math.nan


def part_names(c: Campaign) -> dict[str, str]:
    """The decomposition's rows: each part of step time with its label, idle first, then the
    micro-batch parts last declared first (the added ones, communication, recomputation, compute),
    the once-per-step sync and the planner."""
    micro = {**time_parts(MICROBATCH_TIME_TERMS), **c.added_parts}
    return {
        "idle_s": "load imbalance (ranks waiting)",
        **{k: micro[k] for k in reversed(micro)},
        SYNC_PART: STEP_TIME_TERMS[0].label,
        "planner_s": "planner time not hidden",
    }


def decompose(c: Campaign, cells: pd.DataFrame, claim: dict[str, Any]) -> pd.DataFrame | None:
    """Split the claim's speedup S = thr(method, paper) / thr(baseline, paper) into factors:

    S = [thr(b, fair) / thr(b, paper)] x [thr(m, fair) / thr(b, fair)] x [thr(m, paper) / thr(m,
    fair)]

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
    rows = [
        {
            "factor": "paper mode, baseline side (dealing, drops, optimizer-step amortisation)",
            "log_share": math.log(thr[("baseline", "fair")] / thr[("baseline", "paper")]),
        }
    ]
    fair_log = math.log(thr[("method", "fair")] / thr[("baseline", "fair")])
    acct_log = math.log(T_b / T_m) if T_m > 0 and T_b > 0 else 0.0
    for key, name in part_names(c).items():
        saving = parts_b[key] - parts_m[key]
        share = acct_log * saving / (T_b - T_m) if T_b != T_m else 0.0
        rows.append(
            {
                "factor": f"fair mode: {name}",
                "log_share": share,
                "baseline_s": parts_b[key],
                "method_s": parts_m[key],
            }
        )
    rows.append(
        {
            "factor": "fair mode: median vs mean (statistical residual)",
            "log_share": fair_log - acct_log,
        }
    )
    rows.append(
        {
            "factor": "paper mode, method side (dealing, drops, optimizer-step amortisation)",
            "log_share": math.log(thr[("method", "paper")] / thr[("method", "fair")]),
        }
    )
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
    specs = [x for x in _as_list(claims.get("sensitivity") or []) if x]
    if not specs:
        return pd.DataFrame()
    by_id = {x["id"]: x for x in [*claims.get("claims", []), *claims.get("comparisons", [])]}
    rows = []
    targets = [
        (spec, by_id[i])
        for spec in specs
        for i in [spec.get("claim"), spec.get("also")]
        if i in by_id
    ]
    for sens, t in targets:
        for const in sens.get("constants", []):
            for f in sens.get("factors", [0.5, 2.0]):
                if const == "mem_cap":
                    # A cap cannot exceed the GPU's usable memory: doubling 0.7 is clipped to 1.0.
                    r = compare(
                        c,
                        cells,
                        t["context"],
                        t["baseline"],
                        t["method"],
                        mem_cap_fraction=min(1.0, DEFAULT_MEM_CAP_FRACTION * float(f)),
                        n_boot=n_boot,
                    )[0]
                else:
                    r = compare(
                        c,
                        cells,
                        t["context"],
                        t["baseline"],
                        t["method"],
                        scales={const: float(f)},
                        n_boot=n_boot,
                    )[0]
                # The reference (default constants) over the same seeds as this variant, so a bar
                # shows the constant's effect, not a difference in which batches were drawn.
                seeds = (
                    (cell_seeds(c, r.baseline_cell) & cell_seeds(c, r.method_cell))
                    if r.method_cell and r.baseline_cell
                    else None
                )
                base = compare(
                    c, cells, t["context"], t["baseline"], t["method"], n_boot=n_boot, seeds=seeds
                )[0]
                rows.append(
                    {
                        "comparison": t["id"],
                        "constant": const,
                        "factor": float(f),
                        "speedup": r.speedup,
                        "ci_low": r.ci_low,
                        "ci_high": r.ci_high,
                        "reference_speedup": base.speedup,
                        "pairs": r.pairs,
                        "note": r.note,
                    }
                )
    return pd.DataFrame(rows)


def judge_sensitivity(results: list[ClaimResult], sens: pd.DataFrame) -> None:
    """Each claim's sensitivity rows (finite speedup) judged by their seed CI against the
    claim's band, into ``ClaimResult.sensitivity_verdicts``: the report renders these."""
    if sens.empty:
        return
    for res in results:
        sub = sens[(sens["comparison"] == res.id) & np.isfinite(sens["speedup"].astype(float))]
        res.sensitivity_verdicts = [
            {
                "constant": r["constant"],
                "factor": float(r["factor"]),
                "speedup": float(r["speedup"]),
                "verdict": verdict(
                    res.claimed, res.tolerance, float(r["ci_low"]), float(r["ci_high"])
                ),
            }
            for _, r in sub.iterrows()
        ]
