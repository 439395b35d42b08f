"""Run records -> tables: one row per run, per measured step, per cell, per speedup.

A *cell* is a ``config_hash`` (the run config without its seed); a *context* is a
``context_hash`` (the cell without its method): speedups compare cells of one context, pairing
their repeats by seed.
"""

from __future__ import annotations

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

from dcp_bench.files import atomic_write_text
from dcp_bench.records import iter_run_dirs, read_steps, read_summary
from dcp_bench.report.stats import cell_stats, paired_speedup

STEP_PARTS = ("compute_s", "recompute_s", "comm_s", "sync_s", "idle_s")


@dataclass
class Campaign:
    """Everything the report reads from one campaign's run records."""

    name: str
    runs: pd.DataFrame  # one row per complete run (failed runs included)
    steps: pd.DataFrame  # one row per measured (non-warm-up) step of the ok runs
    envs: dict[str, dict[str, Any]] = field(default_factory=dict)  # run_id -> env.json
    incomplete: list[str] = field(default_factory=list)


def _is_baseline(target: Any) -> bool:
    # Baselines live in the top-level `baselines` package (DESIGN.md section 4): the report tells
    # them apart by where their class lives, never by their name.
    return isinstance(target, str) and target.startswith("baselines.")


def load_campaign(
    root: str | os.PathLike[str], campaign: str, baselines: list[str] | None = None
) -> Campaign:
    """Read a campaign's run records. ``baselines`` names the methods treated as baselines; by
    default a method is a baseline when its class lives in the ``baselines`` package."""
    rows: list[dict[str, Any]] = []
    step_rows: list[dict[str, Any]] = []
    envs: dict[str, dict[str, Any]] = {}
    incomplete: list[str] = []
    for run_dir in iter_run_dirs(root, campaign):
        summary = read_summary(run_dir)
        if summary is None:
            incomplete.append(run_dir.name)
            continue
        extra = summary.extra or {}
        cfg = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
        method_cfg = dict(cfg.get("method") or {})
        params = {k: v for k, v in method_cfg.items() if k not in ("name", "_target_", "mode")}
        row = {
            "run_id": summary.run_id,
            "status": summary.status,
            "executor": summary.executor,
            "method": summary.method,
            "label": extra.get("label", summary.method),
            "mode": extra.get("mode", method_cfg.get("mode", "fair")),
            "params": json.dumps(params, sort_keys=True, default=str),
            "workload": summary.workload,
            "cluster": summary.cluster,
            "model": summary.model,
            "seed": summary.seed,
            "config_hash": summary.config_hash,
            "context_hash": extra.get("context_hash", ""),
            "sweep": extra.get("sweep", ""),
            "world_size": extra.get("world_size"),
            "scales": json.dumps(extra.get("scales") or {}, sort_keys=True),
            "mem_cap_fraction": extra.get("mem_cap_fraction", cfg.get("mem_cap_fraction")),
            "is_baseline": (summary.method in baselines) if baselines is not None
            else _is_baseline(extra.get("target", method_cfg.get("_target_"))),
            "step_time_s": summary.step_time_s,
            "tokens_per_s": summary.tokens_per_s,
            "samples_per_s": extra.get("samples_per_s"),
            "imbalance": summary.imbalance,
            "peak_mem_gib": summary.peak_mem_gib,
            "mfu": summary.mfu,
            "planner_ms": summary.planner_ms,
            "lower_bound_s": summary.lower_bound_s,
            "n_steps": summary.n_steps,
            "cost_source": summary.cost_source,
            "cost_desc": json.dumps(extra.get("cost") or {}, sort_keys=True, default=str),
            "hardware": summary.hardware,
            "error": summary.error,
        }
        rows.append(row)
        env_path = run_dir / "env.json"
        if env_path.exists() and not envs:
            envs[summary.run_id] = json.loads(env_path.read_text())
        if summary.status != "ok":
            continue
        for st in read_steps(run_dir):
            if st.warmup:
                continue
            ex = st.extra or {}
            step_rows.append(
                {
                    "run_id": summary.run_id,
                    "config_hash": summary.config_hash,
                    "step": st.step,
                    "step_time_s": st.step_time_s,
                    "tokens": st.tokens,
                    "samples": st.samples,
                    "planner_ms": st.planner_ms,
                    "peak_mem_gib": st.peak_mem_gib,
                    "peak_mem_per_rank_gib": st.peak_mem_per_rank_gib,
                    "mem_cap_gib": ex.get("mem_cap_gib"),
                    "loss": st.loss,
                    "imbalance": st.imbalance,
                    "sp_samples": ex.get("sp_samples") or {},
                    "ckpt_samples": ex.get("ckpt_samples") or {},
                    "sp_tokens": ex.get("sp_tokens") or {},
                    "ckpt_tokens": ex.get("ckpt_tokens") or {},
                    **{k: ex.get(k) for k in STEP_PARTS},
                }
            )
    return Campaign(campaign, pd.DataFrame(rows), pd.DataFrame(step_rows), envs, incomplete)


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
                "world_size": _first(df, "world_size"),
                "model": _first(df, "model"),
                "method": _first(df, "method"),
                "label": _first(df, "label"),
                "mode": _first(df, "mode"),
                "params": _first(df, "params"),
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
                "imbalance": float(np.nanmedian(df["imbalance"].astype(float))) if df["imbalance"].notna().any() else math.nan,
                "peak_mem_gib": _num(df["peak_mem_gib"].max()),
                "mem_cap_gib": cap,
                "mfu": float(np.nanmedian(df["mfu"].astype(float))) if df["mfu"].notna().any() else math.nan,
                "planner_ms": float(np.nanmedian(df["planner_ms"].astype(float))) if df["planner_ms"].notna().any() else math.nan,
                "flags": "; ".join(stats.flags),
            }
        )
    return pd.DataFrame(out)


def _per_seed(df: pd.DataFrame, col: str, fail: float | None) -> dict[int, float | None]:
    return {int(s): (_num(v) if st == "ok" else fail) for s, v, st in zip(df["seed"], df[col], df["status"])}


def cell_seeds(c: Campaign, cell: str) -> set[int]:
    return {int(s) for s in c.runs.loc[c.runs["config_hash"] == cell, "seed"]}


def speedup_between(
    c: Campaign, baseline_cell: str, method_cell: str, n_boot: int = 2000, seeds: set[int] | None = None
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
        sp = paired_speedup(_per_seed(b, "tokens_per_s", 0.0), _per_seed(m, "tokens_per_s", 0.0),
                            metric="throughput", n_boot=n_boot)
    else:
        sp = paired_speedup(_per_seed(b, "step_time_s", None), _per_seed(m, "step_time_s", None),
                            metric="step_time", n_boot=n_boot)
    return sp.to_dict()


def speedup_table(
    c: Campaign, cells: pd.DataFrame, keep: Callable[[pd.Series], bool] | None = None, n_boot: int = 2000
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


def write_csv(df: pd.DataFrame, path: Path) -> None:

    atomic_write_text(path, df.to_csv(index=False, float_format="%.6g"))
