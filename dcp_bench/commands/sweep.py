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
    from dcp_bench.runner import plan_sweep, run_sweep

    specs = plan_sweep(list(args.overrides))
    if not specs:
        print("no runs in this grid")
        return 0
    if args.dry_run:
        for s in specs:
            done = is_complete(Path(s.root) / s.campaign / s.run_id)
            print(f"{'done' if done else 'todo'}  {s.run_id}")
        return 0
    res = run_sweep(specs, resume=not args.no_resume, jobs=args.jobs,
                    progress=not args.no_progress and sys.stderr.isatty())
    places = sorted({f"{s.root}/{s.campaign}" for s in specs})
    campaign, root = specs[0].campaign, specs[0].root
    print(f"{len(res.ran)} run(s) done, {len(res.skipped)} already complete, {len(res.failed)} failed; records in "
          f"{', '.join(places)}; report: dcp-bench report campaign={campaign} root={root}")
    for bad in res.failed:
        print(f"  {bad.status}: {bad.run_id}: {bad.error}")
    return 0
