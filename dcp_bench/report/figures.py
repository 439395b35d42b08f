"""The report's figures (seaborn on matplotlib's Agg backend), each returned as PNG bytes so the
HTML report can embed them and the Markdown report can link them."""

from __future__ import annotations

import io
import json
import math
from typing import Any

import numpy as np
import pandas as pd

from dcp_bench.cost.base import DEFAULT_MEM_CAP_FRACTION


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _sns() -> Any:
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="paper")
    return sns


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    _plt().close(fig)
    return buf.getvalue()


def speedup_bars(sp: pd.DataFrame, title: str) -> bytes | None:
    """Speedup with its 95% CI per workload (x) and method (hue)."""
    sp = sp[np.isfinite(sp["speedup"].astype(float))]
    if sp.empty:
        return None
    plt, _ = _plt(), _sns()
    workloads = list(dict.fromkeys(sp["workload"]))
    methods = list(dict.fromkeys(sp["method"]))
    fig, ax = plt.subplots(figsize=(max(5, 1.3 * len(workloads) * max(1, len(methods)) ** 0.5), 3.6))
    width = 0.8 / max(1, len(methods))
    palette = _sns().color_palette("tab10", len(methods))
    for j, m in enumerate(methods):
        sub = sp[sp["method"] == m].set_index("workload")
        xs, ys, lo, hi = [], [], [], []
        for i, w in enumerate(workloads):
            if w in sub.index:
                r = sub.loc[w] if isinstance(sub.loc[w], pd.Series) else sub.loc[w].iloc[0]
                xs.append(i + (j - (len(methods) - 1) / 2) * width)
                ys.append(float(r["speedup"]))
                lo.append(max(0.0, float(r["speedup"]) - float(r["ci_low"])))
                hi.append(max(0.0, float(r["ci_high"]) - float(r["speedup"])))
        ax.bar(xs, ys, width=width, color=palette[j], label=m, yerr=[lo, hi], capsize=2)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(range(len(workloads)), workloads, rotation=20, ha="right")
    ax.set_ylabel("speedup (x), 95% CI")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    return _png(fig)


def step_time_distributions(steps: pd.DataFrame, cells: pd.DataFrame, title: str) -> bytes | None:
    if steps.empty or cells.empty:
        return None
    plt, sns = _plt(), _sns()
    df = steps.merge(cells[["config_hash", "label", "workload"]], on="config_hash")
    if df.empty:
        return None
    fig, ax = plt.subplots(figsize=(7, 0.35 * df["label"].nunique() + 1.5))
    sns.boxplot(data=df, y="label", x="step_time_s", hue="workload", ax=ax, fliersize=1, linewidth=0.7)
    ax.set_xscale("log")
    ax.set_xlabel("step time (s), measured steps of all repeats")
    ax.set_ylabel("")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    return _png(fig)


def peak_memory_per_rank(steps: pd.DataFrame, cells: pd.DataFrame, title: str) -> bytes | None:
    if steps.empty:
        return None
    plt, _ = _plt(), _sns()
    fig, ax = plt.subplots(figsize=(7, 3.2))
    cap = math.nan
    for _, cell in cells.iterrows():
        st = steps[steps["config_hash"] == cell["config_hash"]]
        per = [np.asarray(x, dtype=float) for x in st["peak_mem_per_rank_gib"] if x is not None]
        if not per or len({len(p) for p in per}) != 1:
            continue
        ax.plot(np.arange(len(per[0])), np.max(np.vstack(per), axis=0), marker=".", lw=1, label=cell["label"])
        cap = float(st["mem_cap_gib"].max()) if st["mem_cap_gib"].notna().any() else cap
    if not ax.lines:
        _plt().close(fig)
        return None
    if math.isfinite(cap):
        ax.axhline(cap, color="r", ls="--", lw=1, label="memory cap")
    ax.set_xlabel("rank")
    ax.set_ylabel("peak memory (GiB), max over steps")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    return _png(fig)


def _hist_table(steps: pd.DataFrame, cells: pd.DataFrame, column: str) -> pd.DataFrame:
    rows = []
    for _, cell in cells.iterrows():
        st = steps[steps["config_hash"] == cell["config_hash"]]
        total: dict[str, int] = {}
        for h in st[column]:
            for k, v in (h or {}).items():
                total[str(k)] = total.get(str(k), 0) + int(v)
        n = sum(total.values())
        for k, v in total.items():
            rows.append({"method": cell["label"], "bin": k, "share": v / n if n else 0.0})
    return pd.DataFrame(rows)


def share_histogram(steps: pd.DataFrame, cells: pd.DataFrame, column: str, xlabel: str, title: str) -> bytes | None:
    """Stacked share (of samples or tokens, by ``column``) per bin (SP degree, or checkpointed
    share of layers) per method."""
    if steps.empty:
        return None
    df = _hist_table(steps, cells, column)
    if df.empty:
        return None
    plt, sns = _plt(), _sns()
    table = df.pivot_table(index="method", columns="bin", values="share", aggfunc="sum").fillna(0.0)
    table = table[sorted(table.columns, key=lambda s: float(s))]
    fig, ax = plt.subplots(figsize=(7, 0.35 * len(table) + 1.4))
    left = np.zeros(len(table))
    colors = sns.color_palette("viridis", len(table.columns))
    for color, col in zip(colors, table.columns):
        ax.barh(table.index, table[col], left=left, color=color, label=str(col))
        left += table[col].to_numpy()
    ax.set_xlabel("share")
    ax.set_title(title, fontsize=9)
    ax.legend(title=xlabel, fontsize=7, ncol=min(8, len(table.columns)), loc="upper center",
              bbox_to_anchor=(0.5, -0.12 - 0.6 / max(1, len(table))))
    return _png(fig)


def versus_gpus(cells: pd.DataFrame, column: str, ylabel: str, title: str, log: bool = False) -> bytes | None:
    df = cells.dropna(subset=["world_size"])
    df = df[np.isfinite(df[column].astype(float))]
    # Only the (workload, method) series measured at several GPU counts: a line needs two points.
    counts = df.groupby(["workload", "label"])["world_size"].transform("nunique")
    df = df[counts >= 2]
    if df.empty:
        return None
    plt, sns = _plt(), _sns()
    fig, ax = plt.subplots(figsize=(6, 3.4))
    sns.lineplot(data=df, x="world_size", y=column, hue="label", style="workload", marker="o", ax=ax)
    ax.set_xscale("log", base=2)
    ticks = sorted(df["world_size"].astype(int).unique())
    ax.set_xticks(ticks, [str(t) for t in ticks])
    if log:
        ax.set_yscale("log")
    ax.set_xlabel("GPUs")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    return _png(fig)


def tornado(sens: pd.DataFrame, comparison: str, claimed: float | None, tolerance: float | None, title: str) -> bytes | None:
    sub = sens[(sens["comparison"] == comparison) & np.isfinite(sens["speedup"].astype(float))]
    if sub.empty:
        return None
    plt, _ = _plt(), _sns()
    ref = float(sub["reference_speedup"].iloc[0])
    consts = list(dict.fromkeys(sub["constant"]))
    spans = []
    for cst in consts:
        s = sub[sub["constant"] == cst]
        spans.append((cst, s))
    spans.sort(key=lambda t: -(t[1]["speedup"].max() - t[1]["speedup"].min()))
    fig, ax = plt.subplots(figsize=(6.5, 0.45 * len(spans) + 1.4))
    for i, (_cst, s) in enumerate(spans):
        for _, r in s.iterrows():
            color = "tab:blue" if r["factor"] < 1 else "tab:orange"
            r_ref = float(r["reference_speedup"])  # default constants, same seeds as this variant
            ax.barh(i, float(r["speedup"]) - r_ref, left=r_ref, color=color, alpha=0.8,
                    label=f"x{r['factor']:g}" if i == 0 else None)
            ax.plot([r["ci_low"], r["ci_high"]], [i, i], color="k", lw=0.8)
    if claimed is not None:
        band = (claimed / (1 + (tolerance or 0)), claimed * (1 + (tolerance or 0)))
        ax.axvspan(*band, color="green", alpha=0.12, label="claimed value +/- tolerance")
    ax.axvline(ref, color="k", lw=1, label="default constants")
    ax.set_yticks(range(len(spans)), [c for c, _ in spans])
    ax.set_xlabel("speedup (x); bar = constant halved (blue) / doubled (orange); line = 95% CI")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    return _png(fig)


def decomposition_bars(dec: pd.DataFrame, title: str) -> bytes | None:
    if dec is None or dec.empty:
        return None
    plt, _ = _plt(), _sns()
    fig, ax = plt.subplots(figsize=(7, 0.35 * len(dec) + 1.2))
    colors = ["tab:green" if v >= 0 else "tab:red" for v in dec["log_share"]]
    ax.barh(dec["factor"], dec["factor_x"] - 1.0, left=1.0, color=colors)
    ax.axvline(1.0, color="k", lw=0.8)
    for y, v in enumerate(dec["factor_x"]):
        ax.annotate(f"x{v:.2f}", (float(v), y), xytext=(3 if v >= 1 else -3, 0), textcoords="offset points",
                    ha="left" if v >= 1 else "right", va="center", fontsize=7)
    lo, hi = float(dec["factor_x"].min()), float(dec["factor_x"].max())
    ax.set_xlim(min(lo, 1.0) - 0.15, max(hi, 1.0) + 0.25)
    ax.set_xlabel("multiplicative factor of the speedup (product = headline speedup)")
    ax.set_title(title, fontsize=9)
    ax.invert_yaxis()
    return _png(fig)


def sim_vs_measured(df: pd.DataFrame, title: str) -> bytes | None:
    df = df[np.isfinite(df["measured_s"].astype(float)) & np.isfinite(df["simulated_s"].astype(float))] if not df.empty else df
    if df.empty:
        return None
    plt, sns = _plt(), _sns()
    fig, ax = plt.subplots(figsize=(4.2, 4))
    sns.scatterplot(data=df, x="measured_s", y="simulated_s", hue="method", style="workload", ax=ax)
    lim = [0, 1.1 * float(max(df["measured_s"].max(), df["simulated_s"].max()))]
    ax.plot(lim, lim, "k-", lw=0.8)
    ax.fill_between(lim, [x * 0.85 for x in lim], [x * 1.15 for x in lim], color="green", alpha=0.1, label="+/-15%")
    ax.set_xlim(lim)
    ax.set_ylim(lim)
    ax.set_xlabel("measured median step time (s)")
    ax.set_ylabel("simulated median step time (s)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=6)
    return _png(fig)


def scales_label(scales_json: str, mem_cap: Any) -> str:
    s = json.loads(scales_json or "{}")
    parts = [f"{k} x{v:g}" for k, v in s.items()]
    if mem_cap is not None and not math.isclose(float(mem_cap), DEFAULT_MEM_CAP_FRACTION):
        parts.append(f"mem cap {float(mem_cap):g}")
    return ", ".join(parts) or "default"
