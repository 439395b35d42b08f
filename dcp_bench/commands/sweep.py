"""`dcp-bench sweep`: methods x workloads x clusters x models x repeats, simulated or real,
written as run records; resumable."""

from __future__ import annotations

import argparse
import sys

NAME = "sweep"
HELP = (
    "run a grid of configs, each repeated run.repeats times: `dcp-bench sweep method=dcp,bucket_static "
    "workload=videosys_zipf cluster=h200x8,h200x32 run.repeats=5 run.campaign=NAME` (comma = "
    "alternatives; run.executor=sim|torch); completed runs are skipped on a rerun"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("overrides", nargs="*", help="key=value overrides; a,b,c lists alternatives (the grid)")
    parser.add_argument("--jobs", type=int, default=1, help="simulated runs in parallel processes (default 1)")
    parser.add_argument("--no-resume", action="store_true", help="rerun complete runs too")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--dry-run", action="store_true", help="list the runs (id, done or not) and stop")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from dcp_bench.records import is_complete
    from dcp_bench.runner import plan_sweep, run_sweep, run_torch

    specs = plan_sweep(list(args.overrides))
    if not specs:
        print("no runs in this grid")
        return 0
    run_cfg = specs[0].config.get("run") or {}
    root, campaign = str(run_cfg.get("root", "runs")), str(run_cfg.get("campaign", "default"))
    executors = {str((s.config.get("run") or {}).get("executor", "sim")) for s in specs}
    if args.dry_run:
        for s in specs:
            done = is_complete(Path(root) / campaign / s.run_id)
            print(f"{'done' if done else 'todo'}  {s.run_id}")
        return 0
    summaries = []
    skipped = 0
    for executor in sorted(executors):
        part = [s for s in specs if str((s.config.get("run") or {}).get("executor", "sim")) == executor]
        res = run_sweep(
            part, root, campaign, resume=not args.no_resume, jobs=args.jobs if executor == "sim" else 1,
            progress=not args.no_progress and sys.stderr.isatty(),
            executor=run_torch if executor == "torch" else None,
        )
        summaries += res.ran
        skipped += len(res.skipped)
    failed = [s for s in summaries if s.status != "ok"]
    print(f"{len(summaries)} run(s) done, {skipped} already complete, {len(failed)} failed; records in "
          f"{Path(root) / campaign}; report: dcp-bench report campaign={campaign} root={root}")
    for bad in failed:
        print(f"  {bad.status}: {bad.run_id}: {bad.error}")
    return 0
