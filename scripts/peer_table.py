#!/usr/bin/env python
"""The peer table: every method's simulated step time over the lower bound, per shipped workload
and GPU count, with OOM / infeasible / timeout counts, from run records.

Runs the sweep through the one run path (`dcp_bench.campaign.sweep.plan_sweep` / `run_sweep`: text
workloads on llama3_8b, video on stdit3_xl2, every method, each GPU count), resumable, into
``<root>/<campaign>/``; then reads the records (`dcp_bench.report.tables.load_campaign`) and prints
the table `dcp_bench.report.peers.peer_section` puts in reports. Simulated on the clusters' cost
model (the analytical model for the H200 clusters), not measured.

    python scripts/peer_table.py                                   # all methods, 8/32/64 H200s
    python scripts/peer_table.py --methods dcp static_tuned --workloads prolong --clusters h200x8
    python scripts/peer_table.py --no-run --csv peers.csv          # print from existing records

The same sweep as two commands (then ``--no-run`` prints the table):

    dcp-bench sweep
    workload=debian_docs,prolong,sharegpt,wikipedia,synthetic_fixed,synthetic_uniform,synthetic_lognormal
    \\
        model=llama3_8b cluster=h200x8,h200x32,h200x64 method=dcp,dcp_inter_pac,... \\
        run.steps=2 run.warmup_steps=1 run.repeats=1 run.timeout_s=900 run.campaign=peers
    dcp-bench sweep workload=videosys_zipf,videosys_balanced,videosys_long,opensora_v12_stage1
    model=stdit3_xl2 ...
"""

from __future__ import annotations

import argparse
import sys
import time
from types import SimpleNamespace

from dcp_bench.campaign.sweep import plan_sweep, run_sweep
from dcp_bench.config import group_choices
from dcp_bench.report.document import Document
from dcp_bench.report.peers import peer_section, peer_table
from dcp_bench.report.tables import load_campaign
from dcp_bench.workloads import load_workload

MODEL_FOR_KIND = {"text": "llama3_8b", "video": "stdit3_xl2"}
METHODS = [
    "dcp",
    "dcp_inter_pac",
    "dcp_inter",
    "dcp_intra",
    "bucket_static",
    "static_tuned",
    "packed_static",
    "megatron_hybrid_cp",
    "flexsp_milp",
    "wlb_llm",
]


def grids(args: argparse.Namespace) -> list[list[str]]:
    """One sweep grid per model: the workloads of its kind x clusters x methods."""
    by_model: dict[str, list[str]] = {}
    for w in args.workloads:
        by_model.setdefault(MODEL_FOR_KIND.get(load_workload(w).kind, "llama3_8b"), []).append(w)
    common = [
        f"run.steps={args.steps}",
        f"run.warmup_steps={args.warmup}",
        f"run.campaign={args.campaign}",
        f"run.root={args.root}",
        f"run.timeout_s={args.timeout}",
        f"cluster={','.join(args.clusters)}",
        f"method={','.join(args.methods)}",
    ]
    return [
        [f"workload={','.join(ws)}", f"model={model}", *common] for model, ws in by_model.items()
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    shipped = [w for w in group_choices("workload") if w != "lengths_file"]
    ap.add_argument(
        "--methods", nargs="+", default=[m for m in METHODS if m in group_choices("method")]
    )
    ap.add_argument("--workloads", nargs="+", default=shipped)
    ap.add_argument("--clusters", nargs="+", default=["h200x8", "h200x32", "h200x64"])
    ap.add_argument("--steps", type=int, default=2, help="measured steps per run")
    ap.add_argument(
        "--warmup", type=int, default=1, help="warm-up steps per run (recorded, not measured)"
    )
    ap.add_argument("--repeats", type=int, default=1, help="seeds per cell (paired across methods)")
    ap.add_argument("--timeout", type=float, default=900.0, help="run.timeout_s of every run")
    ap.add_argument("--jobs", type=int, default=1, help="simulated runs in parallel")
    ap.add_argument("--campaign", default="peers")
    ap.add_argument("--root", default="runs")
    ap.add_argument(
        "--no-run", action="store_true", help="print the table from existing records only"
    )
    ap.add_argument("--csv", default=None, help="also write the long table (one row per cell)")
    args = ap.parse_args(argv)

    if not args.no_run:
        specs = [s for g in grids(args) for s in plan_sweep(g, repeats=args.repeats, sweep="peers")]
        t0 = time.time()
        res = run_sweep(specs, resume=True, jobs=args.jobs, progress=sys.stderr.isatty())
        print(
            f"{len(res.ran)} run(s) done, {len(res.skipped)} already complete, {len(res.failed)} "
            f"failed ({time.time() - t0:.0f} s); records in {args.root}/{args.campaign}",
            file=sys.stderr,
        )
    campaign = load_campaign(args.root, args.campaign)
    doc = Document(f"Peer table: campaign {args.campaign}")
    peer_section(doc, SimpleNamespace(campaign=campaign))
    print(doc.to_markdown())
    if args.csv:
        peer_table(campaign.runs, campaign.steps).to_csv(args.csv, index=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
