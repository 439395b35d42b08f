"""`dcp-bench workloads`: list the workloads, show one's statistics, or print a global batch.

    dcp-bench workloads list [extra_conf=DIR] [--json]
    dcp-bench workloads show NAME [key=value ...] [--json] [--plot PATH]
    dcp-bench workloads batch NAME [key=value ...] [--step N] [--world-size N] [--max-seq-len N]

NAME is a workload config (packaged, or a user's in ``extra_conf=DIR`` / ``$DCP_BENCH_CONF_PATH``);
``key=value`` are config overrides spelled as in every other command
(``workload.lengths_file=PATH``, ``workload.length_scale=64``, ``seed=1``, ``extra_conf=DIR``).

The command parses its arguments, calls `dcp_bench.workloads.catalog` (``list_workloads``,
``load_named_workload``, ``batch_document``) and prints; the figure is
`dcp_bench.report.workload_figure.write_length_histogram`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from dcp_bench.errors import ConfigError

NAME = "workloads"
HELP = (
    "list workloads, show a workload's length statistics (--json, --plot), or print a global batch"
)

STAT_KEYS = (
    "n", "mean", "p10", "p25", "p50", "p75", "p90", "p99", "max",
    "token_share_gt_8k", "token_share_gt_32k", "token_share_gt_128k",
    "attn_share_gt_8k", "attn_share_gt_32k", "attn_share_gt_128k",
)  # fmt: skip


# The figure formats `--plot` takes, by file name suffix (matplotlib's, without optional extras).
PLOT_FORMATS = ("png", "pdf", "svg", "jpg", "jpeg", "eps", "ps", "tif", "tiff")


def plot_format_problem(path: Path) -> str | None:
    """Why ``path``'s name does not say a figure format this command writes, or None."""
    suffix = path.suffix.lower().lstrip(".")
    if suffix in PLOT_FORMATS:
        return None
    said = f"ends in {path.suffix!r}" if path.suffix else "has no suffix"
    return f"{said}; expected a name ending in " + ", ".join(f".{f}" for f in PLOT_FORMATS)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True
    p_list = sub.add_parser("list", help="the workload configs (packaged and the user's)")
    p_list.add_argument(
        "overrides", nargs="*", metavar="extra_conf=DIR", help="user config folders"
    )
    p_list.add_argument("--json", action="store_true", help="print JSON")
    p_show = sub.add_parser("show", help="statistics of a workload's length distribution")
    p_show.add_argument("name")
    p_show.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="config overrides (workload.KEY=VALUE, seed=, extra_conf=)",
    )
    p_show.add_argument("--json", action="store_true", help="print the statistics as JSON")
    p_show.add_argument(
        "--plot", type=Path, default=None, metavar="PATH", help="write a histogram figure"
    )
    p_batch = sub.add_parser("batch", help="the global batch of one step (sample ids and sizes)")
    p_batch.add_argument("name")
    p_batch.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="config overrides (workload.KEY=VALUE, seed=, extra_conf=)",
    )
    p_batch.add_argument("--step", type=int, default=0)
    p_batch.add_argument("--world-size", type=int, default=32)
    p_batch.add_argument("--max-seq-len", type=int, default=None)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) < 1 else f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def run(args: argparse.Namespace) -> int:
    from dcp_bench.workloads.catalog import batch_document, list_workloads, load_named_workload

    if args.action == "list":
        rows = list_workloads(list(args.overrides))
        if args.json:
            print(json.dumps(rows, indent=2))
        else:
            width = max(len(r["name"]) for r in rows)
            for r in rows:
                print(
                    f"{r['name']:<{width}}  {r['kind']:<9}  {r['default_model']:<10}  "
                    f"v{r['version']}  {r['description']}"
                )
        return 0

    if getattr(args, "plot", None) is not None:
        from dcp_bench.files import check_output

        check_output(args.plot, "--plot", folder=False)
        problem = plot_format_problem(args.plot)
        if problem is not None:
            raise ConfigError(f"--plot {str(args.plot)!r}: {problem}")
    workload = load_named_workload(args.name, list(args.overrides))
    if args.action == "batch":
        batch = workload.global_batch(args.step, args.world_size, args.max_seq_len)
        print(json.dumps(batch_document(args.name, batch, args.world_size), indent=None))
        return 0

    stats = workload.stats()
    if args.plot is not None:
        from dcp_bench.report.workload_figure import write_length_histogram

        write_length_histogram(workload, args.plot)
    if args.json:
        print(json.dumps(stats, indent=2))
    else:
        loader = f", loader {workload.name}" if workload.name != args.name else ""
        print(
            f"{args.name} (v{workload.version}, {workload.kind}{loader}, default model "
            f"{workload.default_model})"
        )
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
