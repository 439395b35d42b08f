"""`dcp-bench reproduce` (= `make reproduce`): the claim reproduction on its embedded defaults
(``dcp_bench/conf/reproduce/default.yaml``), then the report in ``reports/reproduce/``.

The command parses its arguments and calls `dcp_bench.campaign.reproduce.reproduce`, which
runs the sections (to their end by default, or under a ``budget_s``) and writes the report (its
docstring says how budgets, progress, resume, partial reports and the exit status 4,
`EXIT_INCOMPLETE`, work); the config is
`dcp_bench.campaign.reproduce_config`.
"""

from __future__ import annotations

import argparse
import os
import time

from dcp_bench.campaign.reproduce_config import OVERRIDE_KEYS

NAME = "reproduce"
HELP = (
    "reproduce the DCP claim: simulated sweeps (all methods, workloads, 8-64 GPUs, repeats, "
    "sensitivity) + a real CPU gloo run, then reports/reproduce/ with summary.json; "
    "no time limit by default (progress and an estimate of what is left on stderr); "
    "`dcp-bench reproduce [claim=dcp|flexsp] [budget_s=600] [jobs=2] [repeats=5] [real=false] "
    "[sections=a,b] [steps=N] [retry_failed=true] [config=PATH]`"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "overrides",
        nargs="*",
        help=f"key=value; keys: {', '.join(OVERRIDE_KEYS)} (sections=a,b runs only those)",
    )
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress bars or progress lines"
    )


def process_started() -> float:
    """When this process started (`time.time()` scale): Linux's ``/proc/self/stat`` start time
    after boot; now where that cannot be read."""
    try:
        with open("/proc/self/stat", "rb") as fh:
            ticks = int(fh.read().rsplit(b")", 1)[1].split()[19])
        with open("/proc/stat", "rb") as fh:
            boot = next(int(ln.split()[1]) for ln in fh if ln.startswith(b"btime "))
        started = boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()
    # btime has whole seconds: never later than now, never more than a minute before it
    now = time.time()
    return min(now, max(started, now - 60.0))


def run(args: argparse.Namespace) -> int:
    started = process_started()  # a budget counts from here: start-up and planning are inside it
    from dcp_bench.campaign.reproduce_config import find_claims, load_reproduce_config

    # the command line's keys and values and the claims file first (a light module): a bad one
    # is refused before the report's libraries load
    cfg = load_reproduce_config(list(args.overrides))
    find_claims(cfg.claims)
    from dcp_bench.campaign.reproduce import reproduce

    # under a budget the process ends with its last line (`dcp_bench.cli.main`): the budget
    # covers the exit too
    args.end_process = cfg.budget_s is not None
    return reproduce(list(args.overrides), progress=not args.no_progress, t_start=started)
