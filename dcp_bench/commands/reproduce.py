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
import time

from dcp_bench.campaign.reproduce_config import OVERRIDE_KEYS

NAME = "reproduce"
HELP = (
    "reproduce the DCP claim: simulated sweeps (all methods, workloads, 8-64 GPUs, repeats, "
    "sensitivity) + a real CPU gloo run, then reports/reproduce/ with summary.json; "
    "no time limit by default (progress and an estimate of what is left on stderr); "
    "`dcp-bench reproduce [budget_s=600] [jobs=2] [repeats=5] [real=false] [sections=a,b] "
    "[retry_failed=true] [config=PATH]`"
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


def run(args: argparse.Namespace) -> int:
    started = time.time()  # a budget counts from here: loading and planning are inside it
    from dcp_bench.campaign.reproduce_config import find_claims, load_reproduce_config

    # the command line's keys and values and the claims file first (a light module): a bad one
    # is refused before the report's libraries load
    find_claims(load_reproduce_config(list(args.overrides)).claims)
    from dcp_bench.campaign.reproduce import reproduce

    return reproduce(list(args.overrides), progress=not args.no_progress, t_start=started)
