"""`dcp-bench launch`: your own DCP training script on N ranks of this machine (torchrun
underneath), a failure reported on one line (`dcp_bench.run.script_launch`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

NAME = "launch"
HELP = (
    "run your own training script under torchrun: `dcp-bench launch --nproc 2 SCRIPT [ARGS]`; "
    "ranks' stdout shown, their stderr in --log, a failure shown as rank 0's error on one line"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nproc", type=int, default=2, help="ranks to start (default 2)")
    parser.add_argument(
        "--log",
        default="dcp-bench-launch.log",
        help="file for the ranks' stderr: tracebacks, warnings, log lines",
    )
    parser.add_argument("--timeout-s", type=float, default=None, help="stop the job after this")
    parser.add_argument("script", help="the training script (runs as __main__ on every rank)")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")


def run(args: argparse.Namespace) -> int:
    from dcp_bench.run.script_launch import launch_script

    out = launch_script(args.script, list(args.args), args.nproc, Path(args.log), args.timeout_s)
    if out.error is None:
        return 0
    sys.stderr.write(f"dcp-bench launch: {out.error} (the ranks' stderr: {out.log})\n")
    return 1 if out.code in (None, 0) else int(out.code)
