"""`dcp-bench sweep`: methods x workloads x clusters x models x repeats, simulated or real,
written as run records; resumable. The command parses its arguments and calls
`dcp_bench.campaign.launch.launch_sweep`.

Exit status: 0 when every run of the grid holds an ``ok`` record, 3 when any run failed (its
record kept; all failed runs are listed at the end), 2 for bad input, 130 when interrupted."""

from __future__ import annotations

import argparse

NAME = "sweep"
HELP = (
    "run a grid of configs, each repeated run.repeats times: `dcp-bench sweep "
    "method=dcp,bucket_static workload=videosys_zipf cluster=h200x8,h200x32 run.repeats=5 "
    "run.campaign=NAME` (comma = alternatives; run.executor=sim|torch); a rerun skips complete "
    "runs, redoes incomplete and damaged ones, and keeps failed ones unless --retry-failed; exit "
    "status 3 when any run failed; launcher=slurm [slurm.partition=P slurm.timeout_min=N "
    "slurm.executor=slurm|local ...] submits the runs as a Slurm job array through submitit (same "
    "records, resumable)"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "overrides", nargs="*", help="key=value overrides; a,b,c lists alternatives (the grid)"
    )
    parser.add_argument(
        "--jobs", type=int, default=1, help="simulated runs in parallel processes (default 1)"
    )
    parser.add_argument("--no-resume", action="store_true", help="rerun complete runs too")
    parser.add_argument(
        "--retry-failed",
        action="store_true",
        help="redo runs whose record is a failure (oom, timeout, nonfinite, error); kept otherwise",
    )
    parser.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress (default: a bar on a terminal, one line per finished run otherwise)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="list the runs (state and id) and stop"
    )


def run(args: argparse.Namespace) -> int:
    from dcp_bench.campaign.launch import launch_sweep
    from dcp_bench.errors import ConfigError

    if args.jobs < 1:
        raise ConfigError(f"--jobs {args.jobs}: expected an integer >= 1")
    return launch_sweep(
        list(args.overrides),
        jobs=args.jobs,
        resume=not args.no_resume,
        retry_failed=args.retry_failed,
        progress=not args.no_progress,
        dry_run=args.dry_run,
    )
