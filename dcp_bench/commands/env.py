"""`dcp-bench env`: print the system description as one JSON object."""

from __future__ import annotations

import argparse
import json

NAME = "env"
HELP = "print the system description (software versions, accelerators, CPU, memory, git) as JSON"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    del parser


def run(args: argparse.Namespace) -> int:
    from dcp_bench.envinfo import collect_env

    print(json.dumps(collect_env(), indent=2, sort_keys=True))
    return 0
