"""CLI subcommands: one module each, exposing ``NAME``, ``HELP``, ``add_arguments(parser)`` and
``run(args) -> int``. Register a new one in ``dcp_bench.cli.COMMAND_MODULES``."""
