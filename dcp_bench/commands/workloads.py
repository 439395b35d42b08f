"""`dcp-bench workloads`: list the workloads, show one's statistics, or print a global batch.

    dcp-bench workloads list [extra_conf=DIR] [--json]
    dcp-bench workloads show NAME [key=value ...] [--json] [--plot PATH]
    dcp-bench workloads batch NAME [key=value ...] [--step N] [--world-size N] [--max-seq-len N]

NAME is a workload config (packaged, or a user's in ``extra_conf=DIR`` / ``$DCP_BENCH_CONF_PATH``);
``key=value`` are config overrides spelled as in every other command (``workload.lengths_file=PATH``,
``workload.length_scale=64``, ``seed=1``, ``extra_conf=DIR``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from dcp_bench.errors import ConfigError

NAME = "workloads"
HELP = "list workloads, show a workload's length statistics (--json, --plot), or print a global batch"

STAT_KEYS = (
    "n", "mean", "p10", "p25", "p50", "p75", "p90", "p99", "max",
    "token_share_gt_8k", "token_share_gt_32k", "token_share_gt_128k",
    "attn_share_gt_8k", "attn_share_gt_32k", "attn_share_gt_128k",
)  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True
    p_list = sub.add_parser("list", help="the workload configs (packaged and the user's)")
    p_list.add_argument("overrides", nargs="*", metavar="extra_conf=DIR", help="user config folders")
    p_list.add_argument("--json", action="store_true", help="print JSON")
    p_show = sub.add_parser("show", help="statistics of a workload's length distribution")
    p_show.add_argument("name")
    p_show.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides (workload.KEY=VALUE, seed=, extra_conf=)")
    p_show.add_argument("--json", action="store_true", help="print the statistics as JSON")
    p_show.add_argument("--plot", type=Path, default=None, metavar="PATH", help="write a histogram figure")
    p_batch = sub.add_parser("batch", help="the global batch of one step (sample ids and sizes)")
    p_batch.add_argument("name")
    p_batch.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides (workload.KEY=VALUE, seed=, extra_conf=)")
    p_batch.add_argument("--step", type=int, default=0)
    p_batch.add_argument("--world-size", type=int, default=32)
    p_batch.add_argument("--max-seq-len", type=int, default=None)


def _config_overrides(items: list[str]) -> list[str]:
    """Overrides as every command spells them; a bare workload parameter gets the one spelling."""
    out = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"bad override {item!r}: expected key=value (e.g. workload.length_scale=8)")
        bare = key.lstrip("+~")
        if "." not in bare and bare not in ("seed", "extra_conf", "lengths_file"):
            raise ConfigError(f"{item}: workload parameters are spelled workload.{bare}={value} (the same key as "
                              "in simulate, sweep and train)")
        out.append(item)
    return out


def load_named_workload(name: str, overrides: list[str]) -> Any:
    """The workload config ``name`` with overrides, built with the run's seed, as every command does."""
    from dcp_bench.config import load_config, to_container
    from dcp_bench.workloads import make_workload

    cfg = to_container(load_config([f"workload={name}", *_config_overrides(overrides)]))
    return make_workload(cfg["workload"], seed=int(cfg.get("seed", 0)))


def list_workloads(overrides: list[str]) -> list[dict[str, Any]]:
    """One row per workload config: its name, kind, default model, version and description."""
    from dcp_bench.config import EXTRA_CONF_KEY, group_choices, load_config, to_container
    from dcp_bench.workloads import WORKLOADS

    dirs = [ov.split("=", 1)[1] for ov in overrides if ov.split("=", 1)[0] == EXTRA_CONF_KEY]
    bad = [ov for ov in overrides if ov.split("=", 1)[0] != EXTRA_CONF_KEY]
    if bad:
        raise ConfigError(f"workloads list takes extra_conf=DIR only; got {bad[0]!r}")
    rows = []
    for name in group_choices("workload", dirs):
        node = to_container(load_config([*overrides, f"workload={name}"]))["workload"]
        entry = WORKLOADS.get(str(node.get("name")))
        rows.append({
            "name": name,
            "kind": node.get("kind") or (entry.kind if entry else "?"),
            "default_model": entry.default_model if entry else "-",
            "version": str(node.get("version") or (entry.version if entry else "1")),
            "description": node.get("description") or (entry.description if entry else ""),
        })
    return rows


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) < 1 else f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def run(args: argparse.Namespace) -> int:
    if args.action == "list":
        rows = list_workloads(list(args.overrides))
        if args.json:
            print(json.dumps(rows, indent=2))
        else:
            width = max(len(r["name"]) for r in rows)
            for r in rows:
                print(f"{r['name']:<{width}}  {r['kind']:<9}  {r['default_model']:<10}  v{r['version']}  {r['description']}")
        return 0

    if getattr(args, "plot", None) is not None:
        from dcp_bench.files import check_output

        check_output(args.plot, "--plot", folder=False)
    workload = load_named_workload(args.name, list(args.overrides))
    if args.action == "batch":
        batch = workload.global_batch(args.step, args.world_size, args.max_seq_len)
        print(json.dumps({
            "workload": args.name, "step": batch.step, "world_size": args.world_size,
            "n": batch.n, "total_tokens": batch.total_tokens, "truncated": batch.truncated,
            "dropped": batch.dropped, "info": batch.info,
            "sample_ids": batch.sample_ids.tolist(), "tokens": batch.tokens.tolist(),
            "frames": batch.frames.tolist(),
        }, indent=None))  # fmt: skip
        return 0

    stats = workload.stats()
    if args.plot is not None:
        write_plot(workload, args.plot)
    if args.json:
        print(json.dumps(stats, indent=2))
    else:
        loader = f", loader {workload.name}" if workload.name != args.name else ""
        print(f"{args.name} (v{workload.version}, {workload.kind}{loader}, default model {workload.default_model})")
        print(f"  {workload.description}")
        for key in STAT_KEYS:
            print(f"  {key:<20} {_fmt(stats[key])}")
        print(f"  {'stats_method':<20} {stats['stats_method']}")
        for key, value in workload.provenance.items():
            if key != "reference":
                print(f"  provenance.{key}: {value}")
        if args.plot is not None:
            print(f"  plot: {args.plot}")
    return 0


def write_plot(workload: Any, path: Path) -> None:
    """A log-x histogram of the share of samples and the share of tokens per length bin."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    lengths, probs, method = workload.length_distribution()
    lo, hi = max(1.0, float(lengths.min())), float(lengths.max())
    bins = np.geomspace(lo, hi * 1.0001, 60) if hi > lo else np.array([lo * 0.9, lo * 1.1])
    samples, _ = np.histogram(lengths, bins=bins, weights=probs)
    tokens, _ = np.histogram(lengths, bins=bins, weights=probs * lengths)
    tokens = tokens / tokens.sum()
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.stairs(samples, bins, label="share of samples", fill=True, alpha=0.5)
    ax.stairs(tokens, bins, label="share of tokens", linewidth=1.5)
    ax.set_xscale("log")
    ax.set_xlabel("sequence length (tokens)")
    ax.set_ylabel("share")
    ax.set_title(f"{workload.name} (v{workload.version}); {method}", fontsize=9)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
