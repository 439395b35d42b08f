"""`dcp-bench memory`: activation memory counted from the runtime's models beside the cost model's.

Counts, per unit, what autograd keeps for the backward in STDiT3-XL/2 and Llama-3-8B at full
width (`dcp_bench.runtime.memory_count`: fake tensors, no data, seconds on a CPU), with and without
checkpointing, and writes ``table.csv``, ``table.md`` and ``summary.json`` to ``--out`` (default
``results/memory``): every unit's counted bytes, the analytical cost model's bytes and their
relative error (`dcp_bench.runtime.memory_table.write_activation_table`, which the command
calls after checking its flags). Exits 1 when any unit is more than ``--tolerance`` (default 5%)
off.
"""

from __future__ import annotations

import argparse
from pathlib import Path

NAME = "memory"
HELP = (
    "count the activation bytes the runtime's models keep (full width, per unit, with and without "
    "checkpointing) beside the cost model's: `dcp-bench memory [--out results/memory] [--layers 2]`"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out", default="results/memory", help="folder for table.csv, table.md, summary.json"
    )
    parser.add_argument(
        "--layers", type=int, default=2, help="full-width layers to build and count (default 2)"
    )
    parser.add_argument(
        "--cluster", default="h200x32", help="cluster config of the cost model (default h200x32)"
    )
    parser.add_argument(
        "--tolerance",
        type=float,
        default=0.05,
        help="largest |relative error| accepted (default 0.05)",
    )


def run(args: argparse.Namespace) -> int:
    from dcp_bench.errors import ConfigError
    from dcp_bench.runtime.memory_table import write_activation_table

    if args.layers < 1:
        raise ConfigError(f"--layers {args.layers}: expected an integer >= 1")
    if not args.tolerance > 0:
        raise ConfigError(f"--tolerance {args.tolerance}: expected a positive fraction, e.g. 0.05")
    table = write_activation_table(args.out, args.layers, args.cluster, args.tolerance)
    out, worst = Path(args.out), table.worst
    print(
        f"dcp-bench memory: {len(table.rows)} rows, largest |error| {worst:.2%}; wrote "
        f"{out}/table.md, table.csv, summary.json"
    )
    return 0 if worst <= args.tolerance else 1
