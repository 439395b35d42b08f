"""The `dcp-bench` command. Subcommands take hydra-style ``key=value`` overrides composed from the
packaged config root (``dcp_bench/conf``).

Exit status: 0 done; 2 bad input (one line naming the bad value and what was expected); 3 a run
did not finish ``ok`` (``train``, ``sweep``; its record is kept); 4 an incomplete reproduction
(``reproduce``: a section cut by its time budget; the report is written beside ``out``); 130
interrupted (Ctrl-C); 143
terminated (SIGTERM). An interrupt or SIGTERM stops every process the command started before it
exits (they see it as an exception and clean up on the way out)."""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import threading
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from dcp_bench.commands import COMMANDS
from dcp_bench.errors import ConfigError, DcpBenchError


class _Parser(argparse.ArgumentParser):
    """Errors are one line (naming the valid choices where argparse knows them), exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)


def _load_commands() -> list[ModuleType]:
    return list(COMMANDS)


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


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the command is, so it unwinds like an interrupt: launchers stop the
    runs they started and forked runs are killed before the command exits."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Terminated(f"signal {signum}")


def parse_anywhere(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None
) -> argparse.Namespace:
    """Parse with flags anywhere on the line: ``--record root=R campaign=C`` as well as
    ``root=R --record campaign=C`` (argparse alone takes one run of positional ``key=value``)."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        stray = [e for e in extra if e.startswith("-") or "=" not in e]
        if stray or not isinstance(getattr(args, "overrides", None), list):
            parser.error(f"unrecognized arguments: {' '.join(stray or extra)}")
        args.overrides = [*args.overrides, *extra]
    return args


# `1_000` (which hydra and Python read as 1000) in a value or in one of a sweep's alternatives.
_DIGIT_GROUPS = re.compile(r"[+-]?[0-9]+(_[0-9]+)+")


def check_overrides_text(overrides: Sequence[str]) -> None:
    """What the command line's ``key=value`` text must be before any of it is read: each key once
    (``steps=2 steps=3`` or ``steps=2 run.steps=3``; ``extra_conf`` lists folders and may repeat),
    digits ASCII (``steps=١٠٠`` is refused, not read as 100), and no ``_`` digit groups
    (``1_000``). A `ConfigError` naming the override and what was expected."""
    from dcp_bench.config import SHORTCUTS  # hydra: `dcp-bench --help` answers without it

    seen: dict[str, str] = {}
    for ov in overrides:
        key, sep, value = ov.partition("=")
        if not sep:
            continue
        bare = key.lstrip("+~")
        name = SHORTCUTS.get(bare, bare)
        if name in seen and bare != "extra_conf":
            raise ConfigError(
                f"{ov}: the key {bare} is given twice ({seen[name]} and {ov}); expected each key "
                "once"
            )
        seen[name] = ov
        odd = next((c for c in value if c.isdigit() and not c.isascii()), None)
        if odd is not None:
            raise ConfigError(
                f"{ov}: {odd!r} (U+{ord(odd):04X}) is not an ASCII digit; expected numbers "
                "written with the digits 0-9"
            )
        for part in value.strip("[]").split(","):
            if _DIGIT_GROUPS.fullmatch(part.strip()):
                raise ConfigError(
                    f"{ov}: {part.strip()!r} groups digits with '_'; expected "
                    f"{part.strip().replace('_', '')} (or a quoted '{part.strip()}' for a name)"
                )


def main(argv: Sequence[str] | None = None) -> int:
    parser, modules = build_parser()
    args = parse_anywhere(parser, argv)
    if not args.command:
        parser.print_help()
        return 2
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        overrides = getattr(args, "overrides", None)
        if isinstance(overrides, list):
            check_overrides_text(overrides)
        code = int(modules[args.command].run(args) or 0)
        if argv is None and getattr(args, "end_process", False):
            # The command is this process and asked to end with its last line (a time budget
            # that covers the exit too): the interpreter's teardown of torch, pandas and
            # matplotlib takes seconds on a loaded machine. Everything is written and flushed.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        return code
    except DcpBenchError as exc:
        sys.stderr.write(f"dcp-bench {args.command}: error: {exc}\n")
        return 2
    except KeyboardInterrupt as exc:
        terminated = isinstance(exc, Terminated)
        sys.stderr.write(f"dcp-bench: {'terminated' if terminated else 'interrupted'}\n")
        return 143 if terminated else 130
    except BrokenPipeError:
        # The reader went away (`dcp-bench ... | head`): stop quietly, as Unix tools do, and keep
        # Python from complaining about the closed stdout at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    raise SystemExit(main())
