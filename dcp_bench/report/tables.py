"""Run records -> tables: one row per run, per measured step, per cell, per speedup.

A *cell* is a ``config_hash`` (the run config without its seed); a *context* is a
``context_hash`` (the cell without its method): speedups compare cells of one context, pairing
their repeats by seed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from dcp_bench.cost.base import MICROBATCH_TIME_TERMS, SYNC_PART, time_parts
from dcp_bench.files import atomic_write_bytes, atomic_write_text, json_default
from dcp_bench.records import (
    RunSummary,
    StepRecord,
    check_run,
    iter_run_dirs,
    read_steps,
    read_summary,
)
from dcp_bench.report.stats import cell_stats, paired_speedup
from dcp_bench.run_ids import current_cell, current_context

# The config nodes the report reads as mappings.
CONFIG_GROUPS = ("workload", "method", "cluster", "model", "run", "cost", "train", "names")
# The parts of a simulated step's time, as its record's extra names them
# (`dcp_bench.sim.StepAccount`):
# those of the micro-batch time terms every cost source prices, the once-per-step sync, and the idle
# rest. A cost model that declares more terms adds parts; its records name them (``added_parts``).
MICROBATCH_PARTS = tuple(time_parts(MICROBATCH_TIME_TERMS))
STEP_PARTS = (*MICROBATCH_PARTS, SYNC_PART, "idle_s")


@dataclass
class Campaign:
    """Everything the report reads from one campaign's run records."""

    name: str
    runs: pd.DataFrame  # one row per complete run (failed runs included)
    steps: pd.DataFrame  # one row per measured (non-warm-up) step of the ok runs
    envs: dict[str, dict[str, Any]] = field(default_factory=dict)  # run_id -> env.json
    incomplete: list[str] = field(default_factory=list)
    # Records that could not be read (a truncated run.json or steps.jsonl, a broken config.yaml):
    # (run id, what is wrong), left out of every number and named in the report.
    skipped: list[tuple[str, str]] = field(default_factory=list)
    # workload name -> what its runs recorded about it: description and provenance (source,
    # licence, data file and its SHA-256)
    workloads: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Runs a sweep's time budget cut short (status timeout, extra.limit "budget"): the harness
    # ran out of time, the method did not fail, so they are left out like unrun runs and named.
    cut_by_budget: list[str] = field(default_factory=list)
    # Parts of step time beyond STEP_PARTS that the runs' cost models added (part -> label).
    added_parts: dict[str, str] = field(default_factory=dict)

    @property
    def step_parts(self) -> tuple[str, ...]:
        """Every part of a simulated step's time in this campaign: STEP_PARTS with the added parts
        after the micro-batch ones."""
        return (*MICROBATCH_PARTS, *self.added_parts, SYNC_PART, "idle_s")


# The typed parts of a summary (`dcp_bench.summary_schema`): one JSON column each in the index.
SUMMARY_PARTS = (
    "context",
    "cost_description",
    "outcome",
    "training",
    "epochs",
    "planning",
    "predictions",
    "executor_info",
    "notes",
)

# The run fields repeated on every row of a per-step index.
STEP_INDEX_KEYS = (
    "run_id",
    "campaign",
    "status",
    "executor",
    "method",
    "workload",
    "cluster",
    "model",
    "seed",
    "config_hash",
)


def build_index(
    root: str | os.PathLike[str],
    campaign: str | None = None,
    out: str | os.PathLike[str] | None = None,
    steps: bool = False,
) -> pd.DataFrame:
    """Gather complete runs into one pandas table (one row per run, or per step with
    ``steps=True``); written atomically as Parquet when ``out`` is given."""
    rows: list[dict[str, Any]] = []
    for run in iter_run_dirs(root, campaign):
        summary = read_summary(run)
        if summary is None:
            continue
        base = summary.to_dict()
        for key in (*SUMMARY_PARTS, "profile"):  # the typed parts, one JSON column each
            base[key] = json.dumps(base[key], sort_keys=True, default=json_default)
        base["profile"] = base["profile"] if summary.profile else None
        if not steps:
            rows.append(base)
            continue
        ident = {k: base[k] for k in STEP_INDEX_KEYS}
        for rec in read_steps(run):
            rec_d = dataclasses.asdict(rec)
            rec_d["extra"] = json.dumps(rec_d["extra"], sort_keys=True, default=json_default)
            rows.append({**ident, **rec_d})
    table = pd.DataFrame(rows)
    if out is not None:
        buf = io.BytesIO()
        table.to_parquet(buf, index=False)
        atomic_write_bytes(out, buf.getvalue())
    return table


def _is_baseline(target: Any) -> bool:
    # Baselines live in the top-level `baselines` package (baselines/README.md; README.md,
    # "Layout"): the report tells them apart by where their class lives, never by their name.
    return isinstance(target, str) and target.startswith("baselines.")


class BadRecord(Exception):
    """A run folder whose files cannot be read as a run record."""


def _read_run(run_dir: Path) -> tuple[Any, dict[str, Any], list[Any]] | None:
    """(summary, config, steps) of a complete run, None for an incomplete one; `BadRecord`
    saying which file is unreadable and why (without the folder's local path)."""
    # One rule for a damaged record, the sweep's (`check_run`): a record the sweep would redo
    # (e.g. an emptied steps.jsonl under a run.json that counts steps) is never counted here.
    state = check_run(run_dir, restore=False)
    if state.state == "incomplete":
        return None
    if state.state == "damaged":
        reason = (
            str(state.problem)
            .replace(str(run_dir) + os.sep, "")
            .replace(str(run_dir), run_dir.name)
        )
        raise BadRecord(reason.splitlines()[0][:300])
    what = "run.json"
    try:
        summary = read_summary(run_dir)
        if summary is None:
            return None
        what = "config.yaml"
        cfg = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
        if not isinstance(cfg, dict):
            raise ValueError("not a mapping")
        for group in CONFIG_GROUPS:  # what the report reads from the config, typed as it reads it
            if cfg.get(group) is not None and not isinstance(cfg[group], dict):
                raise TypeError(
                    f"{group} is {cfg[group]!r} ({type(cfg[group]).__name__}); expected a mapping"
                )
        what = "steps.jsonl"
        steps = read_steps(run_dir) if summary.status == "ok" else []
    except (OSError, ValueError, TypeError, KeyError, AttributeError, yaml.YAMLError) as exc:
        reason = str(exc).replace(str(run_dir / what), what).replace(str(run_dir), run_dir.name)
        raise BadRecord(f"{what}: {type(exc).__name__}: {reason}".splitlines()[0][:300]) from None
    return summary, cfg, steps


def _run_row(
    summary: RunSummary, cfg: dict[str, Any], baselines: list[str] | None
) -> dict[str, Any]:
    """One run's row of `Campaign.runs`, from its summary and config (see `load_campaign`). A
    summary without a run context (written before runs recorded one) is described by its
    config."""
    method_cfg = dict(cfg.get("method") or {})
    params = {k: v for k, v in method_cfg.items() if k not in ("name", "_target_", "mode")}
    cluster_cfg: dict[str, Any] = cfg["cluster"] if isinstance(cfg.get("cluster"), dict) else {}
    ctx = summary.context
    cap: float | None
    if ctx is not None:
        label = with_overrides(ctx.label, list(ctx.overrides))
        mode, target, cap = ctx.mode, ctx.target, ctx.mem_cap_fraction
    else:
        label = with_overrides(summary.method, [])
        mode = method_cfg.get("mode", "fair")
        target, cap = str(method_cfg.get("_target_") or ""), cfg.get("mem_cap_fraction")
    outcome, planning, epochs = summary.outcome, summary.planning, summary.epochs
    cost = summary.cost_description
    return {
        "run_id": summary.run_id,
        "status": summary.status,
        "executor": summary.executor,
        "method": summary.method,
        "label": label,
        "mode": mode,
        "params": json.dumps(params, sort_keys=True, default=str),
        "target": target,
        "workload": summary.workload,
        "cluster": summary.cluster,
        "gpu": str(cluster_cfg.get("gpu") or summary.cluster),
        "model": summary.model,
        "seed": summary.seed,
        # an earlier-id record's hashes read as the current ones (`dcp_bench.run_ids`), so its
        # runs pair with the same cell's and context's runs recorded since
        "config_hash": current_cell(summary.config_hash),
        "context_hash": current_context(ctx.context_hash) if ctx else "",
        "sweep": ctx.sweep if ctx else "",
        "world_size": summary.world_size,
        "scales": json.dumps(ctx.scales if ctx else {}, sort_keys=True),
        "mem_cap_fraction": cap,
        "is_baseline": (summary.method in baselines)
        if baselines is not None
        else _is_baseline(target),
        "step_time_s": summary.step_time_s,
        "tokens_per_s": summary.tokens_per_s,
        # the reference's own unit (latent voxels / s) where the run counts it (paper mode, video)
        "latent_tokens_per_s": epochs.latent_tokens_per_s if epochs else None,
        "samples_per_s": outcome.samples_per_s if outcome else None,
        "imbalance": summary.imbalance,
        "peak_mem_gib": summary.peak_mem_gib,
        "mfu": summary.mfu,
        "planner_ms": summary.planner_ms,
        "lower_bound_s": summary.lower_bound_s,
        "planner_clock": ctx.planner_clock if ctx else None,
        "offline_tune_total_s": planning.offline_tune_total_s if planning else None,
        "retunes": planning.retunes if planning else None,
        "planner_max_ms": planning.planner_max_ms if planning else None,
        "planner_over_budget_steps": planning.planner_over_budget_steps if planning else None,
        "lower_bound_physical_s": outcome.lower_bound_physical_s if outcome else None,
        "n_steps": summary.n_steps,
        "unit": "epoch" if epochs else "step",
        "epochs": epochs.epochs_done if epochs else None,
        # the epoch's accounting (paper mode: dataset / trained / dropped samples, the
        # reference profile's per-bucket settings), JSON; "" when the run has none
        "epoch_info": json.dumps(list(epochs.epoch_info), sort_keys=True, default=str)
        if epochs and epochs.epoch_info
        else "",
        "cost_source": summary.cost_source,
        "cost_desc": json.dumps(cost.as_flat() if cost else {}, sort_keys=True, default=str),
        "hardware": summary.hardware,
        "error": summary.error,
    }


def _step_rows(summary: RunSummary, steps: list[StepRecord]) -> list[dict[str, Any]]:
    """A run's rows of `Campaign.steps`: its measured (non-warm-up) steps."""
    out: list[dict[str, Any]] = []
    for st in steps:
        if st.warmup:
            continue
        ex = st.extra or {}
        out.append(
            {
                "run_id": summary.run_id,
                "config_hash": current_cell(summary.config_hash),
                "step": st.step,
                "step_time_s": st.step_time_s,
                "lower_bound_s": st.lower_bound_s,
                "tokens": st.tokens,
                "samples": st.samples,
                "planner_ms": st.planner_ms,
                "peak_mem_gib": st.peak_mem_gib,
                "peak_mem_per_rank_gib": st.peak_mem_per_rank_gib,
                "mem_cap_gib": ex.get("mem_cap_gib"),
                "loss": st.loss,
                "imbalance": st.imbalance,
                # measured steps: the machine's 1-minute load average after the step
                "load_1m": ex.get("load_avg_1m"),
                "sp_samples": ex.get("sp_samples") or {},
                "ckpt_samples": ex.get("ckpt_samples") or {},
                "sp_tokens": ex.get("sp_tokens") or {},
                "ckpt_tokens": ex.get("ckpt_tokens") or {},
                **{k: ex.get(k) for k in STEP_PARTS},
                **{k: ex.get(k) for k in ex.get("added_parts") or {}},
            }
        )
    return out


def load_campaign(
    root: str | os.PathLike[str], campaign: str, baselines: list[str] | None = None
) -> Campaign:
    """Read a campaign's run records. ``baselines`` names the methods treated as baselines; by
    default a method is a baseline when its class lives in the ``baselines`` package. A record
    that cannot be read is skipped and listed in ``Campaign.skipped``, never fatal."""
    rows: list[dict[str, Any]] = []
    step_rows: list[dict[str, Any]] = []
    envs: dict[str, dict[str, Any]] = {}
    incomplete: list[str] = []
    cut_by_budget: list[str] = []
    skipped: list[tuple[str, str]] = []
    workloads: dict[str, dict[str, Any]] = {}
    added_parts: dict[str, str] = {}
    for run_dir in iter_run_dirs(root, campaign):
        try:
            read = _read_run(run_dir)
        except BadRecord as exc:
            skipped.append((run_dir.name, str(exc)))
            continue
        if read is None:
            incomplete.append(run_dir.name)
            continue
        summary, cfg, steps = read
        if summary.cut_by_budget:
            cut_by_budget.append(run_dir.name)
            continue
        rows.append(_run_row(summary, cfg, baselines))
        documented = summary.context.workload if summary.context else None
        if documented is not None and summary.workload not in workloads:
            workloads[summary.workload] = dataclasses.asdict(documented)
        env_path = run_dir / "env.json"
        if env_path.exists() and not envs:
            # the system description is context, not a number: a damaged one is left out
            with contextlib.suppress(OSError, ValueError):
                envs[summary.run_id] = json.loads(env_path.read_text())
        added_parts.update(
            part
            for st in steps
            if not st.warmup
            for part in ((st.extra or {}).get("added_parts") or {}).items()
        )
        step_rows += _step_rows(summary, steps)
    runs = pd.DataFrame(rows)
    if not runs.empty:
        runs["label"] = distinct_labels(runs)
    return Campaign(
        campaign,
        runs,
        pd.DataFrame(step_rows),
        envs,
        incomplete,
        skipped,
        workloads,
        cut_by_budget,
        added_parts,
    )


PAPER_SUFFIX = " (paper mode)"


def _split_paper(label: str) -> tuple[str, str]:
    """(method, its paper-mode suffix): `` (paper mode)`` or a qualified one such as
    `` (paper mode, per step)``."""
    i = label.find(PAPER_SUFFIX[:-1])
    return (label[:i], label[i:]) if i >= 0 else (label, "")


def with_overrides(label: str, overrides: list[str]) -> str:
    """A method's label with the method settings its run overrode on the command line
    (``megatron_hybrid_cp(recompute=selective)``), so a reader sees a baseline off its defaults."""
    shown = []
    for ov in overrides:
        key, sep, value = str(ov).partition("=")
        key = key.lstrip("+~")
        if (
            sep
            and key.startswith("method.")
            and key[len("method.") :] not in ("mode", "name", "_target_")
        ):
            shown.append(f"{key[len('method.') :]}={value}")
    if not shown:
        return label
    base, paper = _split_paper(label)
    return f"{base}({', '.join(shown)}){paper}"


def distinct_labels(runs: pd.DataFrame) -> list[str]:
    """Each run's method label, with the parameters that tell apart configurations sharing a
    label in this campaign (``megatron_hybrid_cp(recompute=full)`` beside
    ``megatron_hybrid_cp(recompute=none)``), so tables, figures and colours never merge two."""
    params_of: dict[str, set[str]] = {}
    for label, params in zip(runs["label"], runs["params"]):
        params_of.setdefault(str(label), set()).add(str(params))
    out = []
    for label, params in zip(runs["label"], runs["params"]):
        label = str(label)
        variants = params_of[label]
        if len(variants) < 2:
            out.append(label)
            continue
        decoded = [json.loads(v) for v in sorted(variants)]
        keys = sorted(
            {
                k
                for d in decoded
                for k in d
                if len({json.dumps(x.get(k), default=str) for x in decoded}) > 1
            }
        )
        mine = json.loads(str(params))
        shown = ", ".join(f"{k}={'default' if mine.get(k) is None else mine.get(k)}" for k in keys)
        base, paper = _split_paper(label)
        out.append(f"{base}({shown}){paper}")
    return out


def _first(df: pd.DataFrame, col: str) -> Any:
    return df[col].iloc[0] if len(df) else None


def _num(x: Any) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return math.nan
    return v


def cell_table(c: Campaign) -> pd.DataFrame:
    """One row per cell: repeat statistics of step time, throughput, imbalance, memory, MFU."""
    if c.runs.empty:
        return pd.DataFrame()
    out = []
    for cell, df in c.runs.groupby("config_hash", sort=False):
        st = c.steps[c.steps["config_hash"] == cell] if not c.steps.empty else c.steps
        per_run = [None if s != "ok" else _num(t) for s, t in zip(df["status"], df["step_time_s"])]
        stats = cell_stats(per_run, list(st["step_time_s"]) if len(st) else None)
        thr = [(_num(x) if s == "ok" else 0.0) for s, x in zip(df["status"], df["tokens_per_s"])]
        cap = _num(st["mem_cap_gib"].max()) if len(st) else math.nan
        out.append(
            {
                "config_hash": cell,
                "context_hash": _first(df, "context_hash"),
                "sweep": _first(df, "sweep"),
                "workload": _first(df, "workload"),
                "cluster": _first(df, "cluster"),
                "gpu": _first(df, "gpu"),
                "world_size": _first(df, "world_size"),
                "model": _first(df, "model"),
                "method": _first(df, "method"),
                "label": _first(df, "label"),
                "mode": _first(df, "mode"),
                "params": _first(df, "params"),
                "target": _first(df, "target"),
                "scales": _first(df, "scales"),
                "mem_cap_fraction": _first(df, "mem_cap_fraction"),
                "is_baseline": bool(_first(df, "is_baseline")),
                "executor": _first(df, "executor"),
                "cost_source": _first(df, "cost_source"),
                "repeats": stats.repeats,
                "failures": stats.failures,
                "statuses": ",".join(sorted(set(df["status"]))),
                "median_s": stats.median,
                "olympic_mean_s": stats.olympic_mean,
                "cv": stats.cv,
                "p5_s": stats.p5,
                "p95_s": stats.p95,
                "tokens_per_s": float(np.median(thr)) if thr else math.nan,
                "imbalance": float(np.nanmedian(df["imbalance"].astype(float)))
                if df["imbalance"].notna().any()
                else math.nan,
                "peak_mem_gib": _num(df["peak_mem_gib"].max()),
                "mem_cap_gib": cap,
                "mfu": float(np.nanmedian(df["mfu"].astype(float)))
                if df["mfu"].notna().any()
                else math.nan,
                "planner_ms": float(np.nanmedian(df["planner_ms"].astype(float)))
                if df["planner_ms"].notna().any()
                else math.nan,
                "flags": "; ".join(stats.flags),
                "first_error": next(
                    (str(e) for e, st in zip(df["error"], df["status"]) if st != "ok" and e), ""
                ),
            }
        )
    return pd.DataFrame(out)


def _per_seed(df: pd.DataFrame, col: str, fail: float | None) -> dict[int, float | None]:
    return {
        int(s): (_num(v) if st == "ok" else fail)
        for s, v, st in zip(df["seed"], df[col], df["status"])
    }


def cell_seeds(c: Campaign, cell: str) -> set[int]:
    return {int(s) for s in c.runs.loc[c.runs["config_hash"] == cell, "seed"]}


def speedup_between(
    c: Campaign,
    baseline_cell: str,
    method_cell: str,
    n_boot: int = 2000,
    seeds: set[int] | None = None,
) -> dict[str, Any]:
    """Speedup of one cell over another (same context), paired by seed (only ``seeds`` when
    given). Step-time ratio in fair mode; throughput (tokens/s) ratio when either side runs in
    paper mode, because paper mode changes how many samples a step trains."""
    b = c.runs[c.runs["config_hash"] == baseline_cell]
    m = c.runs[c.runs["config_hash"] == method_cell]
    if seeds is not None:
        b = b[b["seed"].isin(seeds)]
        m = m[m["seed"].isin(seeds)]
    paper = "paper" in set(b["mode"]) | set(m["mode"])
    if paper:
        sp = paired_speedup(
            _per_seed(b, "tokens_per_s", 0.0),
            _per_seed(m, "tokens_per_s", 0.0),
            metric="throughput",
            n_boot=n_boot,
        )
    else:
        sp = paired_speedup(
            _per_seed(b, "step_time_s", None),
            _per_seed(m, "step_time_s", None),
            metric="step_time",
            n_boot=n_boot,
        )
    return sp.to_dict()


def speedup_table(
    c: Campaign,
    cells: pd.DataFrame,
    keep: Callable[[pd.Series], bool] | None = None,
    n_boot: int = 2000,
) -> pd.DataFrame:
    """Every method over every baseline within each context."""
    rows = []
    if cells.empty:
        return pd.DataFrame()
    for _, ctx in cells.groupby("context_hash", sort=False):
        bases = ctx[ctx["is_baseline"]]
        for _, b in bases.iterrows():
            for _, m in ctx.iterrows():
                if m["config_hash"] == b["config_hash"]:
                    continue
                if keep is not None and not keep(m):
                    continue
                sp = speedup_between(c, b["config_hash"], m["config_hash"], n_boot=n_boot)
                rows.append(
                    {
                        "workload": m["workload"],
                        "cluster": m["cluster"],
                        "world_size": m["world_size"],
                        "model": m["model"],
                        "sweep": m["sweep"],
                        "scales": m["scales"],
                        "mem_cap_fraction": m["mem_cap_fraction"],
                        "method": m["label"],
                        "method_params": m["params"],
                        "baseline": b["label"],
                        "baseline_params": b["params"],
                        "speedup": sp["value"],
                        "ci_low": sp["ci_low"],
                        "ci_high": sp["ci_high"],
                        "pairs": sp["pairs"],
                        "metric": sp["metric"],
                        "method_cell": m["config_hash"],
                        "baseline_cell": b["config_hash"],
                        "context_hash": m["context_hash"],
                    }
                )
    return pd.DataFrame(rows)


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def comparison_flags(speedup: float, ci_low: float, ci_high: float, pairs: int) -> list[str]:
    """What a reader must know before trusting a speedup: too few paired repeats for a
    bootstrap (< 5), or a degenerate confidence interval (missing, of zero width, or with a
    bound on the estimate itself: the resamples could not move the median)."""
    flags = []
    if pairs < 5:
        flags.append(f"{pairs} paired repeats (< 5)")
    finite = all(math.isfinite(x) for x in (speedup, ci_low, ci_high))
    if finite and (_close(ci_low, ci_high) or _close(ci_low, speedup) or _close(ci_high, speedup)):
        flags.append("CI degenerate (a bound equals the estimate)")
    elif math.isfinite(speedup) and not (math.isfinite(ci_low) and math.isfinite(ci_high)):
        flags.append("CI unbounded (failed repeats in the resamples)")
    return flags


def comparison_outcome(
    speedup: float, ci_low: float, ci_high: float, method: pd.Series, baseline: pd.Series
) -> str:
    """The comparison in words: a side that failed in every repeat is named as failed (never a
    speedup of 0 or inf); otherwise faster, slower or no clear difference by the 95% CI."""
    m_failed = int(method["failures"]) >= int(method["repeats"])
    b_failed = int(baseline["failures"]) >= int(baseline["repeats"])
    if m_failed and b_failed:
        return "both failed"
    if m_failed:
        return f"method failed ({_failure_kind(method)})"
    if b_failed:
        return f"baseline failed ({_failure_kind(baseline)})"
    if not math.isfinite(speedup) or speedup == 0:
        # failures in most repeats of a side make its median infinitely slow
        if speedup == 0 or (
            math.isnan(speedup) and int(method["failures"]) > int(baseline["failures"])
        ):
            return (
                f"method failed in {int(method['failures'])}/{int(method['repeats'])} repeats "
                f"({_failure_kind(method)})"
            )
        return (
            f"baseline failed in {int(baseline['failures'])}/{int(baseline['repeats'])} repeats "
            f"({_failure_kind(baseline)})"
        )
    if math.isfinite(ci_low) and ci_low > 1:
        return "faster"
    if math.isfinite(ci_high) and ci_high < 1:
        return "slower"
    return "no clear difference (CI includes 1)"


def _failure_kind(cell: pd.Series) -> str:
    """The statuses of a failed cell and the kind of its first error (``error:
    InfeasibleError``)."""
    kind = str(cell.get("first_error") or "").split(":", 1)[0].strip()
    statuses = ",".join(x for x in str(cell["statuses"]).split(",") if x != "ok") or "error"
    return f"{statuses}: {kind}" if kind and " " not in kind else statuses


def comparison_table(
    speedups: pd.DataFrame, cells: pd.DataFrame, baseline_pairs: bool = False
) -> pd.DataFrame:
    """The campaign's own comparisons: every method over every baseline of its context
    (``speedups`` from `speedup_table`), with the outcome in words and flags. Baseline-over-
    baseline rows only with ``baseline_pairs``."""
    if speedups.empty or cells.empty:
        return pd.DataFrame()
    by_cell = cells.set_index("config_hash")
    rows = []
    for _, r in speedups.iterrows():
        m, b = by_cell.loc[r["method_cell"]], by_cell.loc[r["baseline_cell"]]
        if bool(m["is_baseline"]) and not baseline_pairs:
            continue
        sp, lo, hi, pairs = (
            float(r["speedup"]),
            float(r["ci_low"]),
            float(r["ci_high"]),
            int(r["pairs"]),
        )
        outcome = comparison_outcome(sp, lo, hi, m, b)
        flags = comparison_flags(sp, lo, hi, pairs) if "failed" not in outcome else []
        if 0 < int(m["failures"]) < int(m["repeats"]) or 0 < int(b["failures"]) < int(b["repeats"]):
            flags.append(
                f"failed repeats: method {int(m['failures'])}/{int(m['repeats'])}, "
                f"baseline {int(b['failures'])}/{int(b['repeats'])}"
            )
        rows.append(
            {
                "workload": r["workload"],
                "cluster": r["cluster"],
                "model": r["model"],
                "executor": m["executor"],
                "method": r["method"],
                "baseline": r["baseline"],
                "speedup": sp,
                "ci_low": lo,
                "ci_high": hi,
                "pairs": pairs,
                "metric": r["metric"],
                "outcome": outcome,
                "flags": "; ".join(flags),
                "method_is_baseline": bool(m["is_baseline"]),
                "method_cell": r["method_cell"],
                "baseline_cell": r["baseline_cell"],
                "context_hash": r["context_hash"],
            }
        )
    return pd.DataFrame(rows)


def write_csv(df: pd.DataFrame, path: Path) -> None:

    atomic_write_text(path, df.to_csv(index=False, float_format="%.6g"))
