"""The report's figures (seaborn on matplotlib's Agg backend), each returned as PNG bytes so the
HTML report can embed them and the Markdown report can link them.

Every figure that shows methods takes ``colors`` (`method_colors`: one colour per method label for
the whole report), draws a method that failed as a hatched, labelled mark rather than leaving it
out, and gets its title from the caller, which says whether its numbers are simulated or
measured. Lines join points of one series only: the same workload, method, model and GPU kind."""

from __future__ import annotations

import inspect
import io
import json
import math
import re
import textwrap
from collections.abc import Iterable, Mapping
from typing import Any

import matplotlib
import numpy as np
import pandas as pd
from matplotlib import ticker
from matplotlib.transforms import blended_transform_factory

from dcp_bench.cost.base import DEFAULT_MEM_CAP_FRACTION
from dcp_bench.report.claims import tolerance_band

# pyplot and seaborn (which imports pyplot) load when a figure is drawn, after the Agg backend is
# chosen: importing the report must not switch the plotting backend of a process that embeds it.


def _plt() -> Any:
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: after the backend is chosen (above)

    return plt


def _sns() -> Any:
    import seaborn as sns  # lazy: imports pyplot (above)

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
    return (
        f"failed ({cell.get('statuses') or 'error'}, "
        f"{int(cell['failures'])}/{int(cell['repeats'])} repeats)"
    )


def _png(fig: Any) -> bytes:
    """The figure as PNG at `DPI`. A figure whose tight bounding box would still come out wider
    than `MAX_WIDTH_PX` (the drawers size figures under `MAX_WIDTH_IN`, so this is a backstop)
    is saved at a lower resolution so that it fits."""
    fig.canvas.draw()
    width_in = fig.get_tightbbox().width
    pad_in = 0.2  # savefig's bbox_inches="tight" pads 0.1 in on each side
    dpi = DPI if (width_in + pad_in) * DPI <= MAX_WIDTH_PX else MAX_WIDTH_PX / (width_in + pad_in)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    _plt().close(fig)
    return buf.getvalue()


def speedup_bars(sp: pd.DataFrame, title: str, colors: Colors) -> bytes | None:
    """`draw_speedup_bars` as PNG bytes (None without data)."""
    fig = draw_speedup_bars(sp, title, colors)
    return None if fig is None else _png(fig)


def _mode(label: str) -> str:
    return "paper" if "(paper mode" in str(label) else "fair"


def _wrap(label: str, width: int = 36) -> str:
    return "\n".join(
        textwrap.wrap(str(label), width, break_long_words=False, break_on_hyphens=False)
    ) or str(label)


def _grid(n: int, columns: int) -> tuple[int, int]:
    cols = max(1, min(columns, n))
    return -(-n // cols), cols


def speedup_panels(sp: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """The panels of the speedup figure: one per baseline, holding the methods run in the
    baseline's mode (fair or paper: a method in the other mode runs a different loop, so that
    pair stays in the table); a baseline with no method of its mode keeps them all."""
    out = []
    for base in dict.fromkeys(sp["baseline"]):
        sub = sp[sp["baseline"] == base]
        same = sub[[_mode(m) == _mode(base) for m in sub["method"]]]
        out.append((str(base), same if len(same) else sub))
    return out


def draw_speedup_bars(sp: pd.DataFrame, title: str, colors: Colors) -> Any:
    """Speedup over each baseline with its 95% CI: small multiples, one panel per baseline
    (`speedup_panels`, wrapped at `MAX_FACET_COLUMNS`), one horizontal bar per method and
    workload (colour = method, grouped under workload headings), so the figure grows downwards
    with the number of variants and never past the page width. A comparison with a side that
    failed in every repeat is a hatched bar labelled with what failed, not a bar of 0 or
    infinity."""
    if sp.empty:
        return None
    plt, _ = _plt(), _sns()
    panels = speedup_panels(sp)
    several = sp["workload"].nunique() > 1
    ok = sp[np.isfinite(sp["speedup"].astype(float)) & ~sp["outcome"].str.contains("failed")]
    tops = [float(x) for x in ok["ci_high"].astype(float) if math.isfinite(x)] + [
        float(x) for x in ok["speedup"]
    ]
    top = 1.12 * max([1.2, *tops])
    long_labels = max(len(str(m)) for m in sp["method"]) > 24
    nrows, ncols = _grid(len(panels), 2 if long_labels else MAX_FACET_COLUMNS)
    layout = _speedup_layout(panels, several)
    heights = [
        max(layout[i][1] for i in range(k * ncols, min(len(panels), (k + 1) * ncols)))
        for k in range(nrows)
    ]
    fig, axes = plt.subplots(
        nrows,
        ncols,
        figsize=(MAX_WIDTH_IN, sum(0.2 * h + 0.8 for h in heights) + 0.4),
        squeeze=False,
        layout="constrained",
        gridspec_kw={"height_ratios": [0.2 * h + 0.8 for h in heights]},
    )
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    for i, (ax, (base, _), (rows, _h)) in enumerate(zip(axes.flat, panels, layout)):
        # one bar thickness in every panel of a grid row
        _draw_speedup_panel(ax, base, rows, heights[i // ncols], top, colors)
    for ax in axes[-1]:
        ax.set_xlabel("speedup (x), 95% CI", fontsize=7)
    flagged = ok["flags"].astype(bool).any() if "flags" in ok else False
    fig.suptitle(
        title + ("; ! = flagged (few repeats or degenerate CI)" if flagged else ""), fontsize=9
    )
    return fig


def _speedup_layout(
    panels: list[tuple[str, pd.DataFrame]], several: bool
) -> list[tuple[list[tuple[float, str, Any]], float]]:
    """Per panel: its (y, kind, payload) rows, kind "head" (a workload heading, when there are
    several workloads) or "bar" (a comparison), and the y below its last row."""
    layout = []
    for _, sub in panels:
        rows: list[tuple[float, str, Any]] = []
        y = 0.0
        for w in dict.fromkeys(sub["workload"]):
            if several:
                rows.append((y, "head", w))
                y += 1
            for _, r in sub[sub["workload"] == w].iterrows():
                lines = _wrap(_short(str(r["method"]), str(r["baseline"]))).count("\n") + 1
                y += 0.3 * (lines - 1)
                rows.append((y, "bar", r))
                y += 1 + 0.3 * (lines - 1)
        layout.append((rows, y))
    return layout


def _draw_speedup_panel(
    ax: Any,
    base: str,
    rows: list[tuple[float, str, Any]],
    height: float,
    top: float,
    colors: Colors,
) -> None:
    """One panel of `draw_speedup_bars`: the speedups over ``base``, bars up to ``top`` on the
    x axis, ``height`` rows tall."""
    text_at = blended_transform_factory(ax.transAxes, ax.transData)
    ticks, labels = [], []
    for y, kind, r in rows:
        if kind == "head":
            ax.text(0.0, y, f" {r}", transform=text_at, va="center", fontsize=7, fontweight="bold")
            continue
        m = str(r["method"])
        ticks.append(y)
        labels.append(_wrap(_short(m, base)))
        v = float(r["speedup"])
        if "failed" in str(r["outcome"]) or not math.isfinite(v):
            ax.barh(
                y,
                0.2 * top,
                height=0.7,
                facecolor="none",
                edgecolor=_color(colors, m),
                hatch=FAILED_HATCH,
            )
            ax.text(0.21 * top, y, str(r["outcome"]).split(" (")[0], va="center", fontsize=7)
            continue
        lo, hi = float(r["ci_low"]), float(r["ci_high"])
        err = [
            [max(0.0, v - lo) if math.isfinite(lo) else 0.0],
            [max(0.0, hi - v) if math.isfinite(hi) else 0.0],
        ]
        ax.barh(
            y, v, height=0.7, color=_color(colors, m), xerr=err, capsize=2, error_kw={"lw": 0.8}
        )
        if r.get("flags"):
            ax.text(
                min(top * 0.98, (hi if math.isfinite(hi) else v) + 0.02 * top),
                y,
                "!",
                va="center",
                fontsize=7,
                color="red",
            )
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_xlim(0, top)
    ax.set_ylim(max(height, 1) - 0.4, -0.6)
    ax.set_yticks(ticks, labels, fontsize=6.5)
    ax.tick_params(axis="x", labelsize=7)
    ax.grid(axis="y", visible=False)
    ax.set_title(
        f"over {_wrap(base, 60)}"
        + (" (labels: paper mode)" if base.endswith("(paper mode)") else ""),
        fontsize=8,
    )


def _short(method: str, baseline: str) -> str:
    """A method's label inside a panel whose baseline runs in paper mode: without the
    " (paper mode)" the panel's title already says."""
    return method.removesuffix(" (paper mode)") if baseline.endswith("(paper mode)") else method


def tick_label(v: float, _pos: Any = None) -> str:
    """A tick value in at most three significant digits, large ones with k / M / G."""
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return f"{v / div:.3g}{suffix}"
    return f"{v:.3g}"


def readable_log_axis(axis: Any, lo: float, hi: float) -> None:
    """Ticks on a log axis that never overlap: 1-2-5 steps per decade (at most ~8 labels), or
    four evenly spaced ticks when the data spans less than a factor of 3; no minor labels."""
    if lo > 0 and hi / lo < 3:
        axis.set_major_locator(ticker.MaxNLocator(4))
    else:
        decades = math.log10(hi / lo) if lo > 0 and hi > lo else 1.0
        subs = (1.0, 2.0, 5.0) if decades <= 2.5 else (1.0,)
        axis.set_major_locator(ticker.LogLocator(base=10, subs=subs, numticks=10))
    axis.set_major_formatter(ticker.FuncFormatter(tick_label))
    axis.set_minor_locator(ticker.NullLocator())
    axis.set_minor_formatter(ticker.NullFormatter())


def _horizontal(ax: Any) -> dict[str, Any]:
    # matplotlib 3.10 renamed boxplot's vert=False to orientation="horizontal" (and deprecated vert)
    return (
        {"orientation": "horizontal"}
        if "orientation" in inspect.signature(ax.boxplot).parameters
        else {"vert": False}
    )


def _workload_panels(cells: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(cells["workload"])) if not cells.empty else []


def step_time_distributions(
    steps: pd.DataFrame, cells: pd.DataFrame, title: str, colors: Colors
) -> bytes | None:
    """`draw_step_time_distributions` as PNG bytes (None without data)."""
    fig = draw_step_time_distributions(steps, cells, title, colors)
    return None if fig is None else _png(fig)


def draw_step_time_distributions(
    steps: pd.DataFrame, cells: pd.DataFrame, title: str, colors: Colors
) -> Any:
    """Step times of every measured step of every repeat, one box per method, one panel per
    workload; a method that failed in every repeat has no box but a label saying so."""
    if cells.empty:
        return None
    plt, _ = _plt(), _sns()
    panels = _workload_panels(cells)
    heights = [0.32 * cells[cells["workload"] == w]["label"].nunique() + 0.9 for w in panels]
    fig, axes = plt.subplots(
        len(panels),
        1,
        figsize=(MAX_WIDTH_IN * 0.8, sum(heights) + 0.5),
        squeeze=False,
        gridspec_kw={"height_ratios": heights},
    )
    drawn = False
    for ax, w in zip(axes[:, 0], panels):
        sub = cells[cells["workload"] == w]
        labels = list(dict.fromkeys(sub["label"]))
        for y, label in enumerate(labels):
            cell = sub[sub["label"] == label].iloc[0]
            st = steps[steps["config_hash"] == cell["config_hash"]] if not steps.empty else steps
            vals = st["step_time_s"].astype(float).dropna().to_numpy() if len(st) else np.array([])
            if _failed(cell) or vals.size == 0:
                ax.text(
                    0.01,
                    y,
                    _failed_text(cell) if _failed(cell) else "no measured steps",
                    transform=ax.get_yaxis_transform(),
                    va="center",
                    fontsize=7,
                    color=_color(colors, label),
                )
                continue
            box = ax.boxplot(
                vals,
                positions=[y],
                widths=0.6,
                patch_artist=True,
                showfliers=True,
                flierprops={"markersize": 2},
                **_horizontal(ax),
            )
            for patch in box["boxes"]:
                patch.set_facecolor(_color(colors, label))
            if int(cell["failures"]):
                ax.text(
                    0.99,
                    y,
                    f"+ {int(cell['failures'])}/{int(cell['repeats'])} repeats failed",
                    transform=ax.get_yaxis_transform(),
                    ha="right",
                    va="center",
                    fontsize=7,
                    color="red",
                )
            drawn = True
        ax.set_yticks(range(len(labels)), [_wrap(lb, 60) for lb in labels], fontsize=7)
        ax.set_ylim(-0.7, len(labels) - 0.3)
        ax.set_xscale("log")
        times = (
            steps.loc[steps["config_hash"].isin(sub["config_hash"]), "step_time_s"].astype(float)
            if len(steps)
            else None
        )
        times = times[np.isfinite(times) & (times > 0)] if times is not None else None
        if times is not None and len(times):
            readable_log_axis(ax.xaxis, float(times.min()), float(times.max()))
        ax.set_title(w, fontsize=8)
    if not drawn:
        plt.close(fig)
        return None
    axes[-1, 0].set_xlabel("step time (s), measured steps of all repeats")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


def peak_memory_per_rank(
    steps: pd.DataFrame, cells: pd.DataFrame, title: str, colors: Colors
) -> bytes | None:
    """Peak memory of each rank (max over steps and repeats) per method, against the cap: one
    panel per workload, one row per method (colour = method) showing every rank's peak as a tick,
    their range as a line and their median as a dot, so any number of variants stays legible;
    a method that failed in every repeat has a row saying so."""
    if steps.empty or cells.empty:
        return None
    plt, _ = _plt(), _sns()
    workloads = _workload_panels(cells)
    panels: list[tuple[str, list[tuple[str, Any]]]] = []
    cap = math.nan
    for w in workloads:
        rows: list[tuple[str, Any]] = []
        for _, cell in cells[cells["workload"] == w].iterrows():
            if _failed(cell):
                rows.append((str(cell["label"]), _failed_text(cell)))
                continue
            st = steps[steps["config_hash"] == cell["config_hash"]]
            per = [np.asarray(x, dtype=float) for x in st["peak_mem_per_rank_gib"] if x is not None]
            if not per or len({len(p) for p in per}) != 1:
                continue
            rows.append((str(cell["label"]), np.max(np.vstack(per), axis=0)))
            if st["mem_cap_gib"].notna().any():
                cap = float(st["mem_cap_gib"].max())
        if rows:
            panels.append((w, rows))
    if not any(isinstance(v, np.ndarray) for _, rows in panels for _, v in rows):
        return None
    heights = [0.26 * len(rows) + 0.7 for _, rows in panels]
    fig, axes = plt.subplots(
        len(panels),
        1,
        figsize=(MAX_WIDTH_IN * 0.8, sum(heights) + 0.4),
        squeeze=False,
        layout="constrained",
        gridspec_kw={"height_ratios": heights},
        sharex=True,
    )
    for ax, (w, rows) in zip(axes[:, 0], panels):
        for y, (label, v) in enumerate(rows):
            color = _color(colors, label)
            if isinstance(v, str):
                ax.text(
                    0.01,
                    y,
                    v,
                    transform=ax.get_yaxis_transform(),
                    va="center",
                    fontsize=7,
                    color=color,
                )
                continue
            ax.plot([v.min(), v.max()], [y, y], color=color, lw=1.2)
            ax.plot(v, np.full(len(v), y), ls="none", marker="|", ms=6, color=color, alpha=0.7)
            ax.plot([float(np.median(v))], [y], marker="o", ms=4, color=color)
        if math.isfinite(cap):
            ax.axvline(cap, color="r", ls="--", lw=1)
        ax.set_yticks(range(len(rows)), [_wrap(lb, 60) for lb, _ in rows], fontsize=6.5)
        ax.set_ylim(len(rows) - 0.4, -0.6)
        ax.grid(axis="y", visible=False)
        ax.set_title(w, fontsize=8)
    axes[-1, 0].set_xlabel(
        "peak memory per rank (GiB), max over steps: ticks = ranks, dot = median rank"
        + ("; red dashed = memory cap" if math.isfinite(cap) else ""),
        fontsize=7,
    )
    fig.suptitle(title, fontsize=9)
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
        for h in st[column] if len(st) else []:
            for k, v in (h or {}).items():
                total[str(k)] = total.get(str(k), 0) + int(v)
        n = sum(total.values())
        for k, v in total.items():
            rows.append({"method": name, "bin": k, "share": v / n if n else 0.0, "failed": ""})
    return pd.DataFrame(rows)


def share_histogram(
    steps: pd.DataFrame, cells: pd.DataFrame, column: str, xlabel: str, title: str
) -> bytes | None:
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
    fig, ax = plt.subplots(figsize=(MAX_WIDTH_IN * 0.8, 0.3 * len(table) + 1.4))
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
    ax.set_yticks(ys, [_wrap(str(m), 60) for m in table.index], fontsize=7)
    ax.set_ylim(len(table) - 0.5, -0.5)
    ax.set_xlabel("share")
    ax.set_title(title, fontsize=9, pad=24)
    ax.legend(
        title=xlabel,
        fontsize=7,
        title_fontsize=7,
        ncol=min(8, len(table.columns)),
        loc="lower center",
        bbox_to_anchor=(0.5, 1.0),
        frameon=False,
    )
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


def versus_gpus(
    cells: pd.DataFrame, column: str, ylabel: str, title: str, colors: Colors, log: bool = False
) -> bytes | None:
    """`draw_versus_gpus` as PNG bytes (None without a series of two GPU counts)."""
    fig = draw_versus_gpus(cells, column, ylabel, title, colors, log)
    return None if fig is None else _png(fig)


def draw_versus_gpus(
    cells: pd.DataFrame, column: str, ylabel: str, title: str, colors: Colors, log: bool = False
) -> Any:
    """``column`` against the GPU count: one panel per (model, GPU kind), one line per workload
    and method (colour = method, line style = workload); a failed cell is an x labelled failed."""
    df = scaling_series(cells, column)
    if df.empty:
        return None
    plt, _ = _plt(), _sns()
    series = df.groupby(["model", "gpu"])[["workload", "label", "executor"]].apply(
        lambda g: len(g.drop_duplicates())
    )
    by_workload = bool(
        (series > MAX_SERIES).any()
    )  # too many lines for one axis: one panel per workload too
    keys = ["model", "gpu", "workload"] if by_workload else ["model", "gpu"]
    panels = list(dict.fromkeys(zip(*(df[k] for k in keys))))
    nrows, ncols = _grid(len(panels), MAX_FACET_COLUMNS)
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(min(MAX_WIDTH_IN, 4.6 * ncols), 3.3 * nrows), squeeze=False
    )
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    styles = ["-", "--", ":", "-."]
    workloads = [None] if by_workload else list(dict.fromkeys(df["workload"]))
    for ax, key in zip(axes.flat, panels):
        model, gpu = key[0], key[1]
        sub = df[(df["model"] == model) & (df["gpu"] == gpu)]
        if by_workload:
            sub = sub[sub["workload"] == key[2]]
        bottom = blended_transform_factory(ax.transData, ax.transAxes)
        for (w, label, executor), s in sub.groupby(["workload", "label", "executor"], sort=False):
            s = s.sort_values("world_size")
            failed = _mostly_failed(s)
            name = f"{label} ({w})" if len(workloads) > 1 else str(label)
            ok = s[~failed]
            ax.plot(
                ok["world_size"].astype(float),
                ok[column].astype(float),
                marker="o" if executor == "sim" else "s",
                color=_color(colors, label),
                ls=styles[workloads.index(w if not by_workload else None) % len(styles)],
                label=name if executor == "sim" else f"{name}, measured",
            )
            for x in s.loc[failed, "world_size"].astype(
                float
            ):  # a failed point: an x on the floor, labelled
                ax.plot(
                    [x],
                    [0.03],
                    marker="x",
                    color=_color(colors, label),
                    ls="none",
                    transform=bottom,
                )
                ax.text(
                    x,
                    0.06,
                    "failed",
                    transform=bottom,
                    fontsize=6,
                    ha="center",
                    color=_color(colors, label),
                )
        ax.set_xscale("log", base=2)
        ticks = sorted(sub["world_size"].astype(int).unique())
        ax.set_xticks(ticks, [str(t) for t in ticks])
        if log:
            ax.set_yscale("log")
            vals = sub[column].astype(float)
            vals = vals[np.isfinite(vals) & (vals > 0)]
            if len(vals):
                readable_log_axis(ax.yaxis, float(vals.min()), float(vals.max()))
        ax.set_xlabel(f"GPUs ({gpu})")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{model} on {gpu}" + (f", {key[2]}" if by_workload else ""), fontsize=8)
        ax.legend(fontsize=6, loc="best")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


def tornado(
    sens: pd.DataFrame, comparison: str, claimed: float | None, tolerance: float | None, title: str
) -> bytes | None:
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
            ax.barh(
                i,
                float(r["speedup"]) - r_ref,
                left=r_ref,
                color=color,
                alpha=0.8,
                label=f"x{r['factor']:g}" if i == 0 else None,
            )
            ax.plot([r["ci_low"], r["ci_high"]], [i, i], color="k", lw=0.8)
    if claimed is not None:
        band = tolerance_band(claimed, tolerance or 0.0)
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
        ax.annotate(
            f"x{v:.2f}",
            (float(v), y),
            xytext=(3 if v >= 1 else -3, 0),
            textcoords="offset points",
            ha="left" if v >= 1 else "right",
            va="center",
            fontsize=7,
        )
    lo, hi = float(dec["factor_x"].min()), float(dec["factor_x"].max())
    ax.set_xlim(min(lo, 1.0) - 0.15, max(hi, 1.0) + 0.25)
    ax.set_xlabel("multiplicative factor of the speedup (product = headline speedup)")
    ax.set_title(title, fontsize=9)
    ax.invert_yaxis()
    return _png(fig)


def sim_vs_measured(df: pd.DataFrame, title: str, colors: Colors | None = None) -> bytes | None:
    df = (
        df[
            np.isfinite(df["measured_s"].astype(float))
            & np.isfinite(df["simulated_s"].astype(float))
        ]
        if not df.empty
        else df
    )
    if df.empty:
        return None
    plt, sns = _plt(), _sns()
    fig, ax = plt.subplots(figsize=(4.2, 4))
    palette = {m: _color(colors or {}, m) for m in df["method"]} if colors else None
    sns.scatterplot(
        data=df,
        x="measured_s",
        y="simulated_s",
        hue="method",
        style="workload",
        ax=ax,
        palette=palette,
    )
    lim = [0, 1.1 * float(max(df["measured_s"].max(), df["simulated_s"].max()))]
    ax.plot(lim, lim, "k-", lw=0.8)
    ax.fill_between(
        lim,
        [x * 0.85 for x in lim],
        [x * 1.15 for x in lim],
        color="green",
        alpha=0.1,
        label="+/-15%",
    )
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
# `DPI`, so `MAX_WIDTH_IN` inches is the widest a figure may be), facets wrap at
# `MAX_FACET_COLUMNS`,
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
    groups, y_of, headers, y = _forest_layout(rows)
    finite = _forest_numbers(y_of)
    if not finite:
        return None
    lo, hi = min([1.0, *finite]), max([1.0, *finite])
    pad = 0.06 * (hi - lo)
    height = min(8.0, 0.24 * y + 1.0)
    fig, ax = plt.subplots(figsize=(MAX_WIDTH_IN * 0.95, height))
    ax.set_xlim(lo - pad, hi + pad)
    ax.set_ylim(y - 0.3, -0.7)
    ax.axvline(1.0, color="k", lw=0.9, zorder=1)
    band_drawn = _draw_tolerance_bands(ax, groups, y_of)
    model_drawn = False
    value_x = ax.get_yaxis_transform()
    for yy, r in y_of:
        model_drawn = _draw_forest_row(
            ax, yy, r, _color(colors, str(r["method"])), value_x, model_drawn
        )
    ax.set_yticks([yy for yy, _ in y_of], [str(r["label"]) for _, r in y_of], fontsize=8)
    for yy, text in headers:
        ax.text(
            0.005,
            yy,
            text,
            transform=value_x,
            ha="left",
            va="center",
            fontsize=8.5,
            fontweight="bold",
        )
    ax.tick_params(axis="y", length=0)
    ax.grid(axis="y", visible=False)
    ax.set_xlabel(
        "speedup (x): point = median of paired per-seed ratios, whiskers = 95% CI over seeds; 1x "
        "= no gain",
        fontsize=7,
    )
    ax.tick_params(axis="x", labelsize=7)
    legend = band_drawn or model_drawn
    if legend:
        ax.legend(fontsize=7.5, loc="lower right", bbox_to_anchor=(1.0, 1.0), frameon=False, ncol=2)
    # the legend sits in a row just above the axes: the title goes above that row, not across it
    ax.set_title(title, fontsize=9, loc="left", pad=20 if legend else 6)
    return fig


def _forest_layout(
    rows: pd.DataFrame,
) -> tuple[list[Any], list[tuple[float, pd.Series]], list[tuple[float, str]], float]:
    """The forest plot's rows top to bottom: the groups in order, each row's y with its data,
    each group heading's y, and the y below the last row."""
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
    return groups, y_of, headers, y


def _forest_numbers(y_of: list[tuple[float, pd.Series]]) -> list[float]:
    """Every finite number the forest plot draws (points, CIs, bands): they set its x range."""
    return [
        float(v)
        for _, r in y_of
        for v in (
            r["speedup"],
            r.get("ci_low"),
            r.get("ci_high"),
            r.get("model_band_low"),
            r.get("model_band_high"),
            r.get("band_low"),
            r.get("band_high"),
        )
        if v is not None and isinstance(v, (int, float)) and math.isfinite(float(v))
    ]


def _draw_tolerance_bands(ax: Any, groups: list[Any], y_of: list[tuple[float, pd.Series]]) -> bool:
    """The claimed value's tolerance band over the rows of each group that carry one; whether
    any was drawn."""
    band_drawn = False
    for g in groups:
        ys = [yy for yy, r in y_of if r["group"] == g and _finite(r.get("band_low"))]
        if ys:
            r0 = next(r for yy, r in y_of if yy == ys[0])
            ax.fill_betweenx(
                [min(ys) - 0.5, max(ys) + 0.5],
                float(r0["band_low"]),
                float(r0["band_high"]),
                color="tab:green",
                alpha=0.15,
                lw=0,
                zorder=0,
                label=None if band_drawn else "claimed value's tolerance band",
            )
            band_drawn = True
    return band_drawn


def _draw_forest_row(
    ax: Any, yy: float, r: pd.Series, color: Any, value_x: Any, model_drawn: bool
) -> bool:
    """One comparison at height ``yy``: its model band, CI, point and printed value (or why it
    has none). Returns whether a model band has been drawn so far (``model_drawn`` on entry)."""
    v = float(r["speedup"]) if _finite(r["speedup"]) else math.nan
    if _finite(r.get("model_band_low")) and _finite(r.get("model_band_high")):
        ax.barh(
            yy,
            float(r["model_band_high"]) - float(r["model_band_low"]),
            left=float(r["model_band_low"]),
            height=0.55,
            color=color,
            alpha=0.25,
            lw=0,
            zorder=2,
            label=None if model_drawn else "model band (cost-model uncertainty)",
        )
        model_drawn = True
    if math.isnan(v):
        ax.text(
            1.0,
            yy,
            "  " + str(r.get("why") or "no data"),
            va="center",
            fontsize=8,
            color="0.35",
        )
        return model_drawn
    lo_ci, hi_ci = r.get("ci_low"), r.get("ci_high")
    if _finite(lo_ci) and _finite(hi_ci):
        ax.plot([float(lo_ci), float(hi_ci)], [yy, yy], color=color, lw=1.6, zorder=3)
    ax.plot([v], [yy], marker="o", ms=5, color=color, zorder=4)
    ci = f" [{float(lo_ci):.2f}, {float(hi_ci):.2f}]" if _finite(lo_ci) and _finite(hi_ci) else ""
    ax.text(1.01, yy, f"{v:.2f}x{ci}", transform=value_x, va="center", fontsize=8)
    return model_drawn


def _finite(x: Any) -> bool:
    try:
        return x is not None and math.isfinite(float(x))
    except (TypeError, ValueError):
        return False
