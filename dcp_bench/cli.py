"""The `dcp-bench` command. Subcommands take hydra-style ``key=value`` overrides composed from the
packaged config root (``dcp_bench/conf``)."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType

from dcp_bench.errors import DcpBenchError

# One module per subcommand, in the order `--help` lists them.
COMMAND_MODULES = [
    "dcp_bench.commands.env",
    "dcp_bench.commands.workloads",
    "dcp_bench.commands.plan",
    "dcp_bench.commands.simulate",
    "dcp_bench.commands.profile",
    "dcp_bench.commands.validate",
    "dcp_bench.commands.train",
    "dcp_bench.commands.sweep",
    "dcp_bench.commands.report",
    "dcp_bench.commands.reproduce",
]


class _Parser(argparse.ArgumentParser):
    """Errors are one line (naming the valid choices where argparse knows them), exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)


def _load_commands() -> list[ModuleType]:
    return [importlib.import_module(name) for name in COMMAND_MODULES]


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, ModuleType]]:
    parser = _Parser(
        prog="dcp-bench",
        description="Benchmark and reproducibility suite for Data-Centric Parallel (DCP) training "
        "of variable-length long sequences. Subcommands take key=value overrides, e.g. "
        "`dcp-bench simulate workload=prolong method=dcp cluster=h200x32 model=llama3_8b`.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    modules: dict[str, ModuleType] = {}
    for mod in _load_commands():
        p = sub.add_parser(mod.NAME, help=mod.HELP, description=mod.HELP)
        mod.add_arguments(p)
        modules[mod.NAME] = mod
    return parser, modules


def main(argv: Sequence[str] | None = None) -> int:
    parser, modules = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    try:
        return int(modules[args.command].run(args) or 0)
    except DcpBenchError as exc:
        sys.stderr.write(f"dcp-bench {args.command}: error: {exc}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("dcp-bench: interrupted\n")
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
