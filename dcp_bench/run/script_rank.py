"""One rank of a user's own training script under `dcp-bench launch`
(`dcp_bench.run.script_launch`): ``python -m dcp_bench.run.script_rank SCRIPT [ARGS...]`` runs
SCRIPT as ``__main__`` with ARGS as its ``sys.argv``; an exception it raises is written as the
benchmark's own ranks write theirs (`write_rank_error`: the traceback, then one marked line) and
the rank exits 1, so the launcher can show one line for the whole job."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

from dcp_bench.run.torch_run import write_rank_error


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        sys.stderr.write("usage: python -m dcp_bench.run.script_rank SCRIPT [ARGS...]\n")
        return 2
    script = args[0]
    sys.argv = args
    sys.path.insert(0, str(Path(script).resolve().parent))  # as `python SCRIPT` does
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except Exception as exc:
        write_rank_error(exc)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
