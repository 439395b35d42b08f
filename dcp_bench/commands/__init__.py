"""CLI subcommands: one module each, exposing ``NAME``, ``HELP``, ``add_arguments(parser)`` and
``run(args) -> int``. Register a new one in ``dcp_bench.cli.COMMAND_MODULES``.

A subcommand imports the library inside ``run``: the CLI loads every subcommand to build its
help, and ``dcp-bench --help`` or a bad argument should answer without importing torch, hydra or
pandas."""
