"""A real run: torchrun underneath (gloo on CPU, NCCL on CUDA), the one step loop on every rank.

`launch_torch_run` (what ``dcp-bench train`` and torch sweeps call) writes the run's config to a
file and starts ``python -m torch.distributed.run --nproc-per-node N ... -m
dcp_bench.run.torch_run`` in a process session of its own; it waits at most the run's hard limit
(``run.timeout_s`` plus grace), and on a timeout, an interrupt or any error it kills the whole
session (torchrun and every rank) and waits for it, so nothing it started outlives it. Every
rank runs `worker_main`: it initialises the process group (with ``train.pg_timeout_s``), parses
the same `RunSpec`, assembles the same parts, builds the runtime's `TorchExecutor` (model,
optimizer, process-group pool) and runs `execute_run`; rank 0 writes the records.

A rank that raises exits non-zero; torchrun then stops the other ranks (no restarts), and ranks
blocked in a collective fail at the process-group timeout, so a crash never hangs. Multi-node:
``torchrun_args`` carry ``--nnodes``/``--rdzv-endpoint`` (docs/runtime.md).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

from dcp_bench.envinfo import collect_env
from dcp_bench.errors import DcpBenchError
from dcp_bench.records import RunSummary, RunWriter, read_steps, read_summary
from dcp_bench.run.assemble import assemble
from dcp_bench.run.loop import described, execute_run, record_unfinished, summarise
from dcp_bench.run.spec import RunSpec, parse_run_spec

# A rank's failure is summarised on one stderr line after this mark, for the launcher's message.
RANK_ERROR_MARK = "dcp-bench rank failure:"

# Signs that torchrun's launch failed before any rank trained (a rendezvous that did not form, or
# a port taken between torchrun choosing it and a rank binding it). Such a launch is retried
# once; a failure inside a rank's training (marked with RANK_ERROR_MARK) never is.
LAUNCH_FAILURE_SIGNS = (
    "DistNetworkError",
    "EADDRINUSE",
    "Address already in use",
    "RendezvousError",
    "RendezvousConnectionError",
    "Connection refused",
    "Connection reset by peer",
)


class TrainError(DcpBenchError):
    """A training run that failed to start or to report (its ranks crashed before a summary)."""


def _spec_payload(spec: RunSpec) -> dict[str, Any]:
    return {"config": dict(spec.config), "seed": spec.seed, "sweep": spec.sweep, "overrides": list(spec.overrides),
            "timeout_s": spec.timeout_s}


def _spec_from_payload(data: dict[str, Any]) -> RunSpec:
    spec = parse_run_spec(data["config"], seed=data["seed"], sweep=data.get("sweep", ""),
                          overrides=data.get("overrides", ()))
    return spec.with_timeout(data.get("timeout_s"))


# ------------------------------------------------------------------------------------------------
# One rank


def worker_main(spec: RunSpec) -> int:
    """One rank of a real run (started by torchrun: RANK, WORLD_SIZE, LOCAL_RANK set)."""
    import torch
    import torch.distributed as dist

    from dcp_bench.runtime.device import backend_for, pick_device
    from dcp_bench.runtime.executor import TorchExecutor
    from dcp_bench.runtime.groups import ProcessGroupPool
    from dcp_bench.runtime.training import build_training_state

    torch.set_num_threads(spec.train.threads)
    device = pick_device(spec.train.device)
    backend = backend_for(spec.train.backend, device)
    dist.init_process_group(backend, timeout=timedelta(seconds=spec.train.pg_timeout_s))
    started = time.time()
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        if world != spec.world_size:
            raise TrainError(f"{world} ranks launched for a run of {spec.world_size} (cluster {spec.cluster.name})")
        writer = RunWriter(spec.root, spec.campaign, spec.run_id, dict(spec.config),
                           env=collect_env() if rank == 0 else None, enabled=rank == 0)
        pool = ProcessGroupPool(timeout_s=spec.train.pg_timeout_s)
        # The ZeRO stage the cost model prices (cost.zero_stage; None: the policy's default).
        state = build_training_state(spec.model, spec.seed, device, spec.train.lr, zero_stage=spec.cost.zero_stage)
        executor = TorchExecutor(state, None, pool, seed=spec.seed, grad_clip=spec.train.grad_clip,
                                 fail_rank=spec.train.fail_rank, fail_step=spec.train.fail_step, backend=backend)
        executor.info.update({"lr": spec.train.lr})
        summary = execute_run(spec, assemble(spec), executor, writer, started)
        return 0 if summary.status == "ok" else 3
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="one rank of a dcp-bench real run (started by torchrun)")
    parser.add_argument("--spec", required=True)
    args = parser.parse_args(argv)
    try:
        return worker_main(_spec_from_payload(json.loads(Path(args.spec).read_text())))
    except Exception as exc:
        rank = os.environ.get("RANK", "?")
        sys.stderr.write(f"{traceback.format_exc()}{RANK_ERROR_MARK} rank {rank}: {type(exc).__name__}: {exc}\n")
        return 1


# ------------------------------------------------------------------------------------------------
# The launcher


def torchrun_command(spec: RunSpec, spec_path: str) -> list[str]:
    """The torchrun command line of a run (standalone rendezvous unless ``torchrun_args`` say
    otherwise)."""
    return [
        sys.executable, "-m", "torch.distributed.run", *spec.train.torchrun_args,
        "--nproc-per-node", str(spec.world_size // spec.train.nnodes), "--max-restarts", "0",
        "-m", "dcp_bench.run.torch_run", "--spec", spec_path,
    ]  # fmt: skip


def kill_session(proc: subprocess.Popen[Any], grace_s: float = 5.0) -> None:
    """Stop a process started in its own session and everything it started: SIGTERM to the
    whole process group, then SIGKILL after ``grace_s``; waits until the leader is reaped."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait)
            if sig == signal.SIGTERM:
                # The leader is gone; its children may linger a moment in the group.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            break
        except subprocess.TimeoutExpired:
            continue
    proc.wait()


def _run_session(cmd: list[str], env: dict[str, str], limit_s: float | None) -> tuple[int | None, str]:
    """Run ``cmd`` in a session of its own; (exit code or None when killed at ``limit_s``, stderr)."""
    with tempfile.TemporaryFile(mode="w+") as err:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
        try:
            code: int | None = proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            code = None
        except BaseException:
            kill_session(proc)
            raise
        if code is None:
            kill_session(proc)
        else:
            # torchrun is done; a rank it failed to reap must not outlive it either.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        err.seek(0)
        return code, err.read()


def launch_torch_run(spec: RunSpec, attempts: int = 2) -> RunSummary:
    """Run ``spec`` for real and return its summary (also in ``<root>/<campaign>/<run_id>/``).
    A run killed at its time limit is recorded as ``timeout``; ranks that crash before writing a
    summary are recorded as ``error`` with the most telling line of their output."""
    started = time.time()
    run_dir = Path(spec.root) / spec.campaign / spec.run_id
    with tempfile.TemporaryDirectory(prefix="dcp-bench-run-") as tmp:
        spec_path = str(Path(tmp) / "spec.json")
        Path(spec_path).write_text(json.dumps(_spec_payload(spec), default=str))
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", str(spec.train.threads))
        limit = spec.hard_limit_s()
        code, stderr = None, ""
        for attempt in range(attempts):
            remaining = None if limit is None else max(1.0, limit - (time.time() - started))
            code, stderr = _run_session(torchrun_command(spec, spec_path), env, remaining)
            if code not in (None, 0) and attempt + 1 < attempts and read_summary(run_dir) is None \
                    and _is_launch_failure(stderr):
                continue  # the launch itself failed (no rank trained): start it once more
            break
    summary = read_summary(run_dir) if run_dir.exists() else None
    fresh = summary is not None and (summary.started_at or 0.0) >= started - 1.0
    if summary is not None and fresh and (code == 0 or summary.status != "ok"):
        return summary
    if code == 0 and summary is None and spec.train.nnodes > 1:
        # This node's ranks finished cleanly; rank 0 ran on another node and wrote the records there.
        note = summarise(spec, [], "ok", None, described(spec), None, started)
        return dataclasses.replace(note, status="ok", error=None,
                                   extra={**note.extra, "note": "rank 0 ran on another node, which holds the records"})
    if code is None:
        steps = len(read_steps(run_dir)) if run_dir.exists() else 0
        return record_unfinished(spec, "timeout", f"killed after {limit:.0f} s (run.timeout_s plus grace); "
                               f"{steps} step(s) recorded", started)
    return record_unfinished(spec, "error", f"training failed (torchrun exit {code}): {_error_tail(stderr)}", started)


def _is_launch_failure(stderr: str) -> bool:
    return RANK_ERROR_MARK not in stderr and any(sign in stderr for sign in LAUNCH_FAILURE_SIGNS)


def _error_tail(stderr: str) -> str:
    """The most telling line of the ranks' stderr: a rank's marked failure, else the last
    exception line that says more than torchrun's own "ChildFailedError"."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    marked = [ln[len(RANK_ERROR_MARK) :].strip() for ln in lines if ln.startswith(RANK_ERROR_MARK)]
    if marked:
        return marked[0][:500]
    for ln in reversed(lines):
        if "Error" in ln and not ln.startswith(("File ", "[")) and not ln.endswith("ChildFailedError:"):
            return ln[:500]
    return lines[-1][:500] if lines else "no output"


if __name__ == "__main__":
    raise SystemExit(main())
