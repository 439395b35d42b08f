"""Your own training script on the ranks of this machine, with failures on one line.

Under a bare ``torchrun``, a refusal raised on every rank reaches the console as every rank's
traceback plus torchrun's own report (80-190 lines for one ``ConfigError``). `launch_script` runs
``python -m torch.distributed.run --nproc-per-node N -m dcp_bench.run.script_rank SCRIPT ARGS``
as `dcp_bench.run.torch_run` runs the benchmark's ranks (a session of its own, every process
marked and reaped); the ranks' stdout is shown, their stderr (tracebacks, warnings, log lines)
goes to a log file, and a failure comes back as one line: rank 0's exception (`error_tail`)."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from dcp_bench.files import atomic_write_text
from dcp_bench.run.torch_run import error_tail, run_session


@dataclass(frozen=True)
class ScriptOutcome:
    """How a launched script ended: torchrun's exit code (None: killed at the time limit), the
    one-line error (None when it succeeded) and the log holding the ranks' stderr."""

    code: int | None
    error: str | None
    log: Path


def launch_script(
    script: str, args: list[str], nproc: int, log: Path, limit_s: float | None = None
) -> ScriptOutcome:
    """Run ``script`` with ``args`` on ``nproc`` local ranks (see the module docstring)."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
        "--max-restarts", "0", "-m", "dcp_bench.run.script_rank", script, *args,
    ]  # fmt: skip
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    code, stderr, survivors = run_session(cmd, env, limit_s, show_stdout=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(log, stderr)
    if survivors:
        error: str | None = f"{len(survivors)} process(es) could not be stopped: {survivors[:8]}"
    elif code is None:
        error = f"killed after {limit_s:.0f} s"
    else:
        error = None if code == 0 else error_tail(stderr)
    return ScriptOutcome(code, error, log)
