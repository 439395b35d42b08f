"""`dcp-bench sweep`: methods x workloads x clusters x models x repeats, simulated or real,
written as run records; resumable.

Exit status: 0 when every run of the grid holds an ``ok`` record, 3 when any run failed (its
record kept; all failed runs are listed at the end), 2 for bad input, 130 when interrupted."""

from __future__ import annotations

import argparse

NAME = "sweep"
HELP = (
    "run a grid of configs, each repeated run.repeats times: `dcp-bench sweep method=dcp,bucket_static "
    "workload=videosys_zipf cluster=h200x8,h200x32 run.repeats=5 run.campaign=NAME` (comma = "
    "alternatives; run.executor=sim|torch); a rerun skips complete runs, redoes incomplete and "
    "damaged ones, and keeps failed ones unless --retry-failed; exit status 3 when any run failed; "
    "launcher=slurm [slurm.partition=P slurm.timeout_min=N slurm.executor=slurm|local ...] submits the "
    "runs as a Slurm job array through submitit (same records, resumable)"
)

# Exit status of a sweep (or train) in which a run did not finish ``ok``.
EXIT_RUN_FAILED = 3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("overrides", nargs="*", help="key=value overrides; a,b,c lists alternatives (the grid)")
    parser.add_argument("--jobs", type=int, default=1, help="simulated runs in parallel processes (default 1)")
    parser.add_argument("--no-resume", action="store_true", help="rerun complete runs too")
    parser.add_argument("--retry-failed", action="store_true",
                        help="redo runs whose record is a failure (oom, timeout, nonfinite, error); kept otherwise")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress (default: a bar on a terminal, one line per finished run otherwise)")
    parser.add_argument("--dry-run", action="store_true", help="list the runs (state and id) and stop")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from dcp_bench.campaign.slurm import run_sweep_slurm, split_launcher
    from dcp_bench.campaign.sweep import plan_sweep, run_sweep
    from dcp_bench.errors import ConfigError
    from dcp_bench.records import check_run

    if args.jobs < 1:
        raise ConfigError(f"--jobs {args.jobs}: expected an integer >= 1")
    launcher, slurm, overrides = split_launcher(list(args.overrides))
    specs = plan_sweep(overrides)
    if not specs:
        print("no runs in this grid")
        return 0
    if args.dry_run:
        for s in specs:
            state = check_run(Path(s.root) / s.campaign / s.run_id, config_hash=s.config_hash, seed=s.seed)
            word = {"incomplete": "todo", "damaged": "damaged"}.get(state.state, "done")
            if state.failed and state.summary is not None:
                word = f"failed:{state.summary.status}"
            print(f"{word:<16} {s.run_id}")
        return 0
    if launcher == "slurm":
        res = run_sweep_slurm(specs, slurm, resume=not args.no_resume, retry_failed=args.retry_failed)
        if res.unrun:
            print(f"{len(res.unrun)} run(s) submitted, {len(res.skipped)} already complete; rerun this command to "
                  "resume: it resubmits the runs not done and reports the finished ones")
            return 0
    else:
        res = run_sweep(specs, resume=not args.no_resume, jobs=args.jobs, progress=not args.no_progress,
                        retry_failed=args.retry_failed)
    places = sorted({f"{s.root}/{s.campaign}" for s in specs})
    campaign, root = specs[0].campaign, specs[0].root
    failed = res.all_failed
    print(f"{len(res.ran)} run(s) done, {len(res.skipped)} already complete, {len(res.damaged)} damaged record(s) "
          f"redone, {len(failed)} failed; records in {', '.join(places)}; report: dcp-bench report "
          f"campaign={campaign} root={root}")
    if failed:
        print(f"failed runs ({len(res.failed)} now, {len(res.kept_failed)} kept from before"
              f"{'; rerun with --retry-failed to redo them' if res.kept_failed else ''}):")
        for bad in failed:
            print(f"  {bad.status}: {bad.run_id}: {bad.error}")
        return EXIT_RUN_FAILED
    return 0
