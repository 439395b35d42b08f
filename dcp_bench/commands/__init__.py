"""CLI subcommands: one module each, exposing ``NAME``, ``HELP``, ``add_arguments(parser)`` and
``run(args) -> int``. Register a new one in `COMMANDS` below (a plain import, so the
import-direction test sees every command's dependencies).

A subcommand imports the library inside ``run``: the CLI loads every subcommand to build its
help, and ``dcp-bench --help`` or a bad argument should answer without importing torch, hydra or
pandas."""

from __future__ import annotations

from dcp_bench.commands import (
    claims,
    env,
    launch,
    memory,
    plan,
    profile,
    report,
    reproduce,
    simulate,
    slurm,
    sweep,
    train,
    validate,
    workloads,
)

# In the order `--help` lists them.
COMMANDS = (
    env,
    workloads,
    plan,
    simulate,
    profile,
    validate,
    memory,
    train,
    launch,
    slurm,
    sweep,
    report,
    reproduce,
    claims,
)
