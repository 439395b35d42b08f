"""The report's figures (seaborn on matplotlib's Agg backend), each returned as PNG bytes so the
HTML report can embed them and the Markdown report can link them.

Every figure that shows methods takes ``colors`` (`method_colors`: one colour per method label for
the whole report), draws a method that failed as a hatched, labelled mark rather than leaving it
out, and gets its title from the caller, which says whether its numbers are simulated or
measured. Lines join points of one series only: the same workload, method, model and GPU kind."""

from __future__ import annotations

import io
import json
import math
import re
from collections.abc import Iterable, Mapping
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


Colors = Mapping[str, Any]
FAILED_HATCH = "///"


def method_family(label: str) -> str:
    """The method a label is a variant of: the name before its parameters and mode
    (``dcp_inter_pac(eject=false) (paper mode)`` -> ``dcp_inter_pac``)."""
    return re.split(r"[ (]", str(label), maxsplit=1)[0]


def method_colors(labels: Iterable[str]) -> dict[str, Any]:
    """One colour per method label, fixed for a whole report: one hue per method family
    (`method_family`; families sorted, so the same set of methods always gets the same hues),
    and the variants of a family shades of its hue, darker and lighter around it, the family's
    plain label (the shortest) at the hue itself."""
    names = sorted({str(x) for x in labels})
    families: dict[str, list[str]] = {}
    for name in names:
        families.setdefault(method_family(name), []).append(name)
    sns = _sns()
    hues = [*sns.color_palette("tab10", 10), *sns.color_palette("Dark2", 8)]
    if len(families) > len(hues):
        hues = list(sns.color_palette("husl", len(families)))
    out: dict[str, Any] = {}
    for hue, (_family, members) in zip(hues, sorted(families.items())):
        members = sorted(members, key=lambda m: (len(m), m))
        for name, amount in zip(members, _shade_steps(len(members))):
            out[name] = _shade(hue, amount)
    return out


def _shade_steps(n: int) -> list[float]:
    """0 for the first, then alternately darker (< 0) and lighter (> 0), evenly up to +-0.6."""
    if n <= 1:
        return [0.0] * n
    k = n // 2  # steps on the larger side
    step = 0.6 / k
    out = [0.0]
    for i in range(1, n):
        j = (i + 1) // 2
        out.append(-j * step if i % 2 else j * step)
    return out


def _shade(rgb: Any, amount: float) -> tuple[float, float, float]:
    """``rgb`` mixed with black (amount < 0) or white (amount > 0) by |amount|."""
    r, g, b = (float(x) for x in rgb[:3])
    if amount < 0:
        return (r * (1 + amount), g * (1 + amount), b * (1 + amount))
    return (r + (1 - r) * amount, g + (1 - g) * amount, b + (1 - b) * amount)


def _color(colors: Colors, label: str) -> Any:
    return colors.get(label, "0.5")


def _failed(cell: Mapping[str, Any]) -> bool:
    return int(cell.get("failures", 0) or 0) >= int(cell.get("repeats", 1) or 1)


def _failed_text(cell: Mapping[str, Any]) -> str:
    return f"failed ({cell.get('statuses') or 'error'}, {int(cell['failures'])}/{int(cell['repeats'])} repeats)"


def _png(fig: Any) -> bytes:
    """The figure as PNG at `DPI`. A figure whose tight bounding box would still come out wider
    than `MAX_WIDTH_PX` (the drawers size figures under `MAX_WIDTH_IN`, so this is a backstop)
    is saved at a lower resolution so that it fits."""
    fig.canvas.draw()
    width_in = fig.get_tightbbox().width
    dpi = DPI if width_in * DPI <= MAX_WIDTH_PX else MAX_WIDTH_PX / width_in
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    _plt().close(fig)
    return buf.getvalue()


def speedup_bars(sp: pd.DataFrame, title: str, colors: Colors) -> bytes | None:
    """`draw_speedup_bars` as PNG bytes (None without data)."""
    fig = draw_speedup_bars(sp, title, colors)
    return None if fig is None else _png(fig)


def draw_speedup_bars(sp: pd.DataFrame, title: str, colors: Colors) -> Any:
    """Speedup over each baseline (one panel per baseline) with its 95% CI, per workload (x) and
    method (colour). A comparison with a side that failed in every repeat is a hatched bar
    labelled with what failed, not a bar of 0 or infinity."""
    if sp.empty:
        return None
    plt, _ = _plt(), _sns()
    baselines = list(dict.fromkeys(sp["baseline"]))
    workloads = list(dict.fromkeys(sp["workload"]))
    methods = list(dict.fromkeys(sp["method"]))
    ok = sp[np.isfinite(sp["speedup"].astype(float)) & ~sp["outcome"].str.contains("failed")]
    tops = [float(x) for x in ok["ci_high"].astype(float) if math.isfinite(x)] + [float(x) for x in ok["speedup"]]
    top = 1.15 * max([1.2, *tops])
    width_in = max(4.5, 1.1 * len(workloads) * max(1, len(methods)) ** 0.6)
    fig, axes = plt.subplots(1, len(baselines), figsize=(width_in * len(baselines), 3.6), squeeze=False, sharey=True)
    width = 0.8 / max(1, len(methods))
    for ax, base in zip(axes[0], baselines):
        sub = sp[sp["baseline"] == base]
        for j, m in enumerate(methods):
            for i, w in enumerate(workloads):
                r = sub[(sub["method"] == m) & (sub["workload"] == w)]
                if r.empty:
                    continue
                row = r.iloc[0]
                x = i + (j - (len(methods) - 1) / 2) * width
                v = float(row["speedup"])
                if "failed" in str(row["outcome"]) or not math.isfinite(v):
                    ax.bar(x, 0.12 * top, width=width, facecolor="none", edgecolor=_color(colors, m), hatch=FAILED_HATCH)
                    ax.text(x, 0.13 * top, str(row["outcome"]).split(" (")[0], rotation=90, ha="center", va="bottom",
                            fontsize=7)
                    continue
                lo, hi = float(row["ci_low"]), float(row["ci_high"])
                err = [[max(0.0, v - lo) if math.isfinite(lo) else 0.0], [max(0.0, hi - v) if math.isfinite(hi) else 0.0]]
                ax.bar(x, v, width=width, color=_color(colors, m), yerr=err, capsize=2)
                if row.get("flags"):
                    ax.text(x, min(top * 0.97, (hi if math.isfinite(hi) else v) + 0.02 * top), "!", ha="center",
                            va="bottom", fontsize=7, color="red")
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_ylim(0, top)
        ax.set_xticks(range(len(workloads)), workloads, rotation=20, ha="right")
        ax.set_title(f"over {base}", fontsize=8)
    axes[0][0].set_ylabel("speedup (x), 95% CI")
    handles = [plt.Rectangle((0, 0), 1, 1, color=_color(colors, m)) for m in methods]
    handles.append(plt.Rectangle((0, 0), 1, 1, facecolor="none", edgecolor="k", hatch=FAILED_HATCH))
    axes[0][-1].legend(handles, [*methods, "failed"], fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    flagged = ok["flags"].astype(bool).any() if "flags" in ok else False
    fig.suptitle(title + ("; ! = flagged (few repeats or degenerate CI)" if flagged else ""), fontsize=9)
    return fig


def _horizontal(ax: Any) -> dict[str, Any]:
    # matplotlib 3.10 renamed boxplot's vert=False to orientation="horizontal" (and deprecated vert)
    import inspect

    return {"orientation": "horizontal"} if "orientation" in inspect.signature(ax.boxplot).parameters else {"vert": False}


def _workload_panels(cells: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(cells["workload"])) if not cells.empty else []


def step_time_distributions(steps: pd.DataFrame, cells: pd.DataFrame, title: str, colors: Colors) -> bytes | None:
    """`draw_step_time_distributions` as PNG bytes (None without data)."""
    fig = draw_step_time_distributions(steps, cells, title, colors)
    return None if fig is None else _png(fig)


def draw_step_time_distributions(steps: pd.DataFrame, cells: pd.DataFrame, title: str, colors: Colors) -> Any:
    """Step times of every measured step of every repeat, one box per method, one panel per
    workload; a method that failed in every repeat has no box but a label saying so."""
    if cells.empty:
        return None
    plt, _ = _plt(), _sns()
    panels = _workload_panels(cells)
    heights = [0.32 * cells[cells["workload"] == w]["label"].nunique() + 0.9 for w in panels]
    fig, axes = plt.subplots(len(panels), 1, figsize=(7, sum(heights) + 0.5), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    drawn = False
    for ax, w in zip(axes[:, 0], panels):
        sub = cells[cells["workload"] == w]
        labels = list(dict.fromkeys(sub["label"]))
        for y, label in enumerate(labels):
            cell = sub[sub["label"] == label].iloc[0]
            st = steps[steps["config_hash"] == cell["config_hash"]] if not steps.empty else steps
            vals = st["step_time_s"].astype(float).dropna().to_numpy() if len(st) else np.array([])
            if _failed(cell) or vals.size == 0:
                ax.text(0.01, y, _failed_text(cell) if _failed(cell) else "no measured steps", transform=ax.get_yaxis_transform(),
                        va="center", fontsize=7, color=_color(colors, label))
                continue
            box = ax.boxplot(vals, positions=[y], widths=0.6, patch_artist=True, showfliers=True,
                             flierprops={"markersize": 2}, **_horizontal(ax))
            for patch in box["boxes"]:
                patch.set_facecolor(_color(colors, label))
            if int(cell["failures"]):
                ax.text(0.99, y, f"+ {int(cell['failures'])}/{int(cell['repeats'])} repeats failed",
                        transform=ax.get_yaxis_transform(), ha="right", va="center", fontsize=7, color="red")
            drawn = True
        ax.set_yticks(range(len(labels)), labels, fontsize=7)
        ax.set_ylim(-0.7, len(labels) - 0.3)
        ax.set_xscale("log")
        ax.set_title(w, fontsize=8)
    if not drawn:
        plt.close(fig)
        return None
    axes[-1, 0].set_xlabel("step time (s), measured steps of all repeats")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


def peak_memory_per_rank(steps: pd.DataFrame, cells: pd.DataFrame, title: str, colors: Colors) -> bytes | None:
    """Peak memory of each rank (max over steps and repeats) per method, against the cap; one
    line style per workload; failed methods listed on the figure."""
    if steps.empty or cells.empty:
        return None
    plt, _ = _plt(), _sns()
    fig, ax = plt.subplots(figsize=(7, 3.2))
    cap = math.nan
    styles = ["-", "--", ":", "-."]
    workloads = _workload_panels(cells)
    failed = []
    for _, cell in cells.iterrows():
        if _failed(cell):
            failed.append((cell["label"], f"{cell['label']} ({cell['workload']}): {_failed_text(cell)}"))
            continue
        st = steps[steps["config_hash"] == cell["config_hash"]]
        per = [np.asarray(x, dtype=float) for x in st["peak_mem_per_rank_gib"] if x is not None]
        if not per or len({len(p) for p in per}) != 1:
            continue
        style = styles[workloads.index(cell["workload"]) % len(styles)]
        name = cell["label"] if len(workloads) == 1 else f"{cell['label']} ({cell['workload']})"
        ax.plot(np.arange(len(per[0])), np.max(np.vstack(per), axis=0), marker=".", lw=1, ls=style,
                color=_color(colors, cell["label"]), label=name)
        cap = float(st["mem_cap_gib"].max()) if st["mem_cap_gib"].notna().any() else cap
    if not ax.lines:
        plt.close(fig)
        return None
    if math.isfinite(cap):
        ax.axhline(cap, color="r", ls="--", lw=1, label="memory cap")
    for label, text in failed:  # legend entries: a failed method has no peak to draw
        ax.plot([], [], ls="none", marker="x", color=_color(colors, label), label=text)
    ax.set_xlabel("rank")
    ax.set_ylabel("peak memory (GiB), max over steps")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    return _png(fig)


def _hist_table(steps: pd.DataFrame, cells: pd.DataFrame, column: str) -> pd.DataFrame:
    rows = []
    several = cells["workload"].nunique() > 1
    for _, cell in cells.iterrows():
        name = f"{cell['label']} ({cell['workload']})" if several else str(cell["label"])
        if _failed(cell):
            rows.append({"method": name, "bin": None, "share": 0.0, "failed": _failed_text(cell)})
            continue
        st = steps[steps["config_hash"] == cell["config_hash"]] if not steps.empty else steps
        total: dict[str, int] = {}
        for h in (st[column] if len(st) else []):
            for k, v in (h or {}).items():
                total[str(k)] = total.get(str(k), 0) + int(v)
        n = sum(total.values())
        for k, v in total.items():
            rows.append({"method": name, "bin": k, "share": v / n if n else 0.0, "failed": ""})
    return pd.DataFrame(rows)


def share_histogram(steps: pd.DataFrame, cells: pd.DataFrame, column: str, xlabel: str, title: str) -> bytes | None:
    """Stacked share (of samples or tokens, by ``column``) per bin (SP degree, or checkpointed
    share of layers) per method; a method that failed has a row saying so."""
    if cells.empty:
        return None
    df = _hist_table(steps, cells, column)
    if df.empty or df["bin"].isna().all():
        return None
    plt, sns = _plt(), _sns()
    order = list(dict.fromkeys(df["method"]))
    ok = df[df["bin"].notna()]
    table = ok.pivot_table(index="method", columns="bin", values="share", aggfunc="sum").fillna(0.0)
    table = table.reindex(order).fillna(0.0)
    table = table[sorted(table.columns, key=lambda s: float(s))]
    fig, ax = plt.subplots(figsize=(7, 0.35 * len(table) + 1.4))
    left = np.zeros(len(table))
    colors = sns.color_palette("viridis", len(table.columns))
    ys = np.arange(len(table))
    for color, col in zip(colors, table.columns):
        ax.barh(ys, table[col], left=left, color=color, label=str(col))
        left += table[col].to_numpy()
    for y, name in enumerate(table.index):
        why = df[(df["method"] == name) & (df["failed"] != "")]
        if len(why):
            ax.barh(y, 1.0, facecolor="none", edgecolor="0.4", hatch=FAILED_HATCH)
            ax.text(0.02, y, why["failed"].iloc[0], va="center", fontsize=7)
    ax.set_yticks(ys, list(table.index), fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("share")
    ax.set_title(title, fontsize=9)
    ax.legend(title=xlabel, fontsize=7, ncol=min(8, len(table.columns)), loc="upper center",
              bbox_to_anchor=(0.5, -0.12 - 0.6 / max(1, len(table))))
    return _png(fig)


def _mostly_failed(cells: pd.DataFrame) -> pd.Series:
    """Cells whose median repeat failed (their statistics are those of an infinitely slow run)."""
    if "failures" not in cells or "repeats" not in cells:
        return pd.Series(False, index=cells.index)
    return 2 * cells["failures"].astype(int) > cells["repeats"].astype(int)


def scaling_series(cells: pd.DataFrame, column: str) -> pd.DataFrame:
    """The cells of every series run at two or more GPU counts; a series is one workload,
    method, model, GPU kind and executor, so no line ever joins different models or machines.
    Cells that mostly failed stay in (drawn as failed points)."""
    if cells.empty:
        return cells
    df = cells.dropna(subset=["world_size"])
    df = df[np.isfinite(df[column].astype(float)) | _mostly_failed(df)]
    if df.empty:
        return df
    keys = ["workload", "label", "model", "gpu", "executor"]
    counts = df.groupby(keys)["world_size"].transform("nunique")
    return df[counts >= 2]


def versus_gpus(cells: pd.DataFrame, column: str, ylabel: str, title: str, colors: Colors, log: bool = False) -> bytes | None:
    """`draw_versus_gpus` as PNG bytes (None without a series of two GPU counts)."""
    fig = draw_versus_gpus(cells, column, ylabel, title, colors, log)
    return None if fig is None else _png(fig)


def draw_versus_gpus(cells: pd.DataFrame, column: str, ylabel: str, title: str, colors: Colors, log: bool = False) -> Any:
    """``column`` against the GPU count: one panel per (model, GPU kind), one line per workload
    and method (colour = method, line style = workload); a failed cell is an x labelled failed."""
    df = scaling_series(cells, column)
    if df.empty:
        return None
    plt, _ = _plt(), _sns()
    from matplotlib.transforms import blended_transform_factory
    panels = list(dict.fromkeys(zip(df["model"], df["gpu"])))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 3.4), squeeze=False)
    styles = ["-", "--", ":", "-."]
    workloads = list(dict.fromkeys(df["workload"]))
    for ax, (model, gpu) in zip(axes[0], panels):
        sub = df[(df["model"] == model) & (df["gpu"] == gpu)]
        bottom = blended_transform_factory(ax.transData, ax.transAxes)
        for (w, label, executor), s in sub.groupby(["workload", "label", "executor"], sort=False):
            s = s.sort_values("world_size")
            failed = _mostly_failed(s)
            name = f"{label} ({w})" if len(workloads) > 1 else str(label)
            ok = s[~failed]
            ax.plot(ok["world_size"].astype(float), ok[column].astype(float), marker="o" if executor == "sim" else "s",
                    color=_color(colors, label), ls=styles[workloads.index(w) % len(styles)],
                    label=name if executor == "sim" else f"{name}, measured")
            for x in s.loc[failed, "world_size"].astype(float):  # a failed point: an x on the floor, labelled
                ax.plot([x], [0.03], marker="x", color=_color(colors, label), ls="none", transform=bottom)
                ax.text(x, 0.06, "failed", transform=bottom, fontsize=6, ha="center", color=_color(colors, label))
        ax.set_xscale("log", base=2)
        ticks = sorted(sub["world_size"].astype(int).unique())
        ax.set_xticks(ticks, [str(t) for t in ticks])
        if log:
            ax.set_yscale("log")
        ax.set_xlabel(f"GPUs ({gpu})")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{model} on {gpu}", fontsize=8)
        ax.legend(fontsize=6, loc="best")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


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


def sim_vs_measured(df: pd.DataFrame, title: str, colors: Colors | None = None) -> bytes | None:
    df = df[np.isfinite(df["measured_s"].astype(float)) & np.isfinite(df["simulated_s"].astype(float))] if not df.empty else df
    if df.empty:
        return None
    plt, sns = _plt(), _sns()
    fig, ax = plt.subplots(figsize=(4.2, 4))
    palette = {m: _color(colors or {}, m) for m in df["method"]} if colors else None
    sns.scatterplot(data=df, x="measured_s", y="simulated_s", hue="method", style="workload", ax=ax, palette=palette)
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


# --------------------------------------------------------------------------------------------
# Size policy: every figure fits the page (the HTML page is 1100 px wide; figures are drawn at
# `DPI`, so `MAX_WIDTH_IN` inches is the widest a figure may be), facets wrap at `MAX_FACET_COLUMNS`,
# and an axis shows at most `MAX_SERIES` coloured series (more go to small multiples or a table).
DPI = 110
MAX_WIDTH_IN = 10.0
MAX_WIDTH_PX = 1200  # the backstop in `_png`: tight bounding boxes add a little to MAX_WIDTH_IN
MAX_FACET_COLUMNS = 3
MAX_SERIES = 12


def forest_plot(rows: pd.DataFrame, title: str, colors: Colors) -> bytes | None:
    """`draw_forest_plot` as PNG bytes (None without a finite row)."""
    fig = draw_forest_plot(rows, title, colors)
    return None if fig is None else _png(fig)


def draw_forest_plot(rows: pd.DataFrame, title: str, colors: Colors) -> Any:
    """Every headline comparison on one axis: one row per comparison (``label``), grouped
    under ``group`` headings in the order given; the point is the speedup (colour of
    ``method``), the whiskers its 95% CI, a wide pale bar the model band where the row has one
    (``model_band_low`` / ``model_band_high``), a shaded band the claimed value's tolerance band
    over the rows that carry one (``band_low`` / ``band_high``), and a vertical line at 1x. The
    value and CI are printed at the right of each row; a row without a number says why."""
    if rows.empty:
        return None
    plt, _ = _plt(), _sns()
    groups = list(dict.fromkeys(rows["group"]))
    y_of: list[tuple[float, pd.Series]] = []
    headers: list[tuple[float, str]] = []
    y = 0.0
    for g in groups:
        headers.append((y, str(g)))
        y += 1.0
        for _, r in rows[rows["group"] == g].iterrows():
            y_of.append((y, r))
            y += 1.0
        y += 0.3
    finite = [float(v) for _, r in y_of for v in (r["speedup"], r.get("ci_low"), r.get("ci_high"),
                                                    r.get("model_band_low"), r.get("model_band_high"),
                                                    r.get("band_low"), r.get("band_high"))
              if v is not None and isinstance(v, (int, float)) and math.isfinite(float(v))]
    if not finite:
        return None
    lo, hi = min([1.0, *finite]), max([1.0, *finite])
    pad = 0.06 * (hi - lo)
    height = min(8.0, 0.21 * y + 1.0)
    fig, ax = plt.subplots(figsize=(MAX_WIDTH_IN * 0.95, height))
    ax.set_xlim(lo - pad, hi + pad)
    ax.set_ylim(y - 0.3, -0.7)
    ax.axvline(1.0, color="k", lw=0.9, zorder=1)
    band_drawn = model_drawn = False
    for g in groups:  # the tolerance band, over the rows of a group that carry one
        ys = [yy for yy, r in y_of if r["group"] == g and _finite(r.get("band_low"))]
        if ys:
            r0 = next(r for yy, r in y_of if yy == ys[0])
            ax.fill_betweenx([min(ys) - 0.5, max(ys) + 0.5], float(r0["band_low"]), float(r0["band_high"]),
                             color="tab:green", alpha=0.15, lw=0, zorder=0,
                             label=None if band_drawn else "claimed value's tolerance band")
            band_drawn = True
    value_x = ax.get_yaxis_transform()
    for yy, r in y_of:
        color = _color(colors, str(r["method"]))
        v = float(r["speedup"]) if _finite(r["speedup"]) else math.nan
        if _finite(r.get("model_band_low")) and _finite(r.get("model_band_high")):
            ax.barh(yy, float(r["model_band_high"]) - float(r["model_band_low"]), left=float(r["model_band_low"]),
                    height=0.55, color=color, alpha=0.25, lw=0, zorder=2,
                    label=None if model_drawn else "model band (cost-model uncertainty)")
            model_drawn = True
        if math.isnan(v):
            ax.text(1.0, yy, "  " + str(r.get("why") or "no data"), va="center", fontsize=7, color="0.35")
            continue
        lo_ci, hi_ci = r.get("ci_low"), r.get("ci_high")
        if _finite(lo_ci) and _finite(hi_ci):
            ax.plot([float(lo_ci), float(hi_ci)], [yy, yy], color=color, lw=1.6, zorder=3)
        ax.plot([v], [yy], marker="o", ms=5, color=color, zorder=4)
        ci = f" [{float(lo_ci):.2f}, {float(hi_ci):.2f}]" if _finite(lo_ci) and _finite(hi_ci) else ""
        ax.text(1.01, yy, f"{v:.2f}x{ci}", transform=value_x, va="center", fontsize=7)
    ax.set_yticks([yy for yy, _ in y_of], [str(r["label"]) for _, r in y_of], fontsize=7)
    for yy, text in headers:
        ax.text(0.0, yy, text, transform=value_x, ha="left", va="center", fontsize=8, fontweight="bold")
    ax.tick_params(axis="y", length=0)
    ax.grid(axis="y", visible=False)
    ax.set_xlabel("speedup (x): point = median of paired per-seed ratios, whiskers = 95% CI over seeds; 1x = no gain",
                  fontsize=7)
    ax.tick_params(axis="x", labelsize=7)
    if band_drawn or model_drawn:
        ax.legend(fontsize=7, loc="lower right", framealpha=0.9)
    ax.set_title(title, fontsize=9)
    return fig


def _finite(x: Any) -> bool:
    try:
        return x is not None and math.isfinite(float(x))
    except (TypeError, ValueError):
        return False
