"""A real run: torchrun underneath (gloo on CPU, NCCL on CUDA), the one step loop on every rank.

`launch_torch_run` (what ``dcp-bench train`` and torch sweeps call) checks that this machine can
run the ranks it asks for (`check_local_ranks`), claims the run folder (`dcp_bench.records`
ownership), writes the run's config to a file and starts ``python -m torch.distributed.run
--nproc-per-node N ... -m dcp_bench.run.torch_rank`` in a process session of its own. Every process
of the run (torchrun and every rank, which torchrun starts in sessions of their own) carries a
mark in its environment; on a timeout (``run.timeout_s`` plus grace), an interrupt, any error,
and after a normal exit, the launcher signals every process that carries the mark and waits until
none is alive (`kill_run_tree`), so nothing it started outlives it. It then takes the run folder
over, so no late writer can change the record it returns.

Every rank runs `dcp_bench.run.torch_rank.worker_main` (the one module of a real run that
imports torch; this one never does, so the sweep (campaign.sweep) can import it for simulated runs
too).

A rank that raises exits non-zero; torchrun then stops the other ranks (no restarts), and ranks
blocked in a collective fail at the process-group timeout, so a crash never hangs. Multi-node:
``torchrun_args`` carry ``--nnodes``/``--rdzv-endpoint`` (docs/runtime.md).
"""

from __future__ import annotations

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
import uuid
from pathlib import Path
from typing import Any

from dcp_bench.errors import ConfigError, DcpBenchError
from dcp_bench.files import atomic_write_text
from dcp_bench.records import RunSummary, RunWriter, claim_run, read_steps, read_summary, take_over
from dcp_bench.run.loop import described, record_unfinished, summarise
from dcp_bench.run.spec import RunSpec, parse_run_spec

# A rank's failure is summarised on one stderr line after this mark, for the launcher's message.
RANK_ERROR_MARK = "dcp-bench rank failure:"

# A run whose torchrun fails without any rank's marked exception (a rendezvous that did not form,
# a port taken between torchrun choosing it and a rank binding it, a rank killed by a signal or
# crashed below Python) is started once more, fresh, and its record names the first attempt
# (``extra.previous_attempt``, ``stderr.attempt1.log``); a failure a rank raised (marked with
# RANK_ERROR_MARK) never is.

# Every process of a run carries ``RUN_MARK_ENV=<the run's mark>`` in its environment (children
# inherit it, whatever session or parent they end up with), which is how the launcher finds them.
RUN_MARK_ENV = "DCP_BENCH_RUN_MARK"

# Ranks one node may start per usable CPU core when running on the CPU: gloo ranks on an
# oversubscribed CPU still make progress at a few per core (the reproduction runs 4 on 2 cores),
# while tens per core exhaust memory and time out. The environment variable overrides the limit
# (it describes the machine, not the run, so it stays out of the config and the run's identity).
RANKS_PER_CORE = 4
MAX_LOCAL_RANKS_ENV = "DCP_BENCH_MAX_LOCAL_RANKS"


class TrainError(DcpBenchError):
    """A training run that failed to start or to report (its ranks crashed before a summary)."""


def spec_payload(spec: RunSpec, owner: str | None) -> dict[str, Any]:
    """What the launcher hands every rank (as JSON in a file): the run's spec and the owner
    token."""
    return {
        "config": dict(spec.config),
        "seed": spec.seed,
        "sweep": spec.sweep,
        "overrides": list(spec.overrides),
        "timeout_s": spec.timeout_s,
        "limit_source": spec.limit_source,
        "kill_grace_s": spec.kill_grace_s,
        "owner": owner,
    }


def spec_from_payload(data: dict[str, Any]) -> RunSpec:
    """The `RunSpec` a rank parses from `spec_payload`'s dict (the same spec the launcher ran)."""
    spec = parse_run_spec(
        data["config"],
        seed=data["seed"],
        sweep=data.get("sweep", ""),
        overrides=data.get("overrides", ()),
    )
    return spec.with_timeout(
        data.get("timeout_s"), data.get("limit_source", ""), data.get("kill_grace_s")
    )


# ------------------------------------------------------------------------------------------------
# What this machine can run


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def local_rank_limit(spec: RunSpec) -> tuple[int, str]:
    """The most ranks one node may start for ``spec`` and why: ``$DCP_BENCH_MAX_LOCAL_RANKS`` when
    set; on CUDA one rank per visible GPU; on the CPU `RANKS_PER_CORE` per usable core."""
    override = os.environ.get(MAX_LOCAL_RANKS_ENV, "").strip()
    if override:
        if not override.isdigit() or int(override) < 1:
            raise ConfigError(f"{MAX_LOCAL_RANKS_ENV}={override!r}: expected an integer >= 1")
        return int(override), MAX_LOCAL_RANKS_ENV
    device = spec.train.device
    if device in ("auto", "cuda"):
        # lazy: this module stays free of torch (see the module docstring)
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if gpus or device == "cuda":
            return gpus, f"one rank per GPU; {gpus} visible"
    cores = usable_cores()
    return RANKS_PER_CORE * cores, f"{RANKS_PER_CORE} ranks per CPU core; {cores} usable"


def check_local_ranks(spec: RunSpec) -> None:
    """Refuse, before anything starts, a run that asks one node for more ranks than it can run."""
    local = spec.world_size // spec.train.nnodes
    limit, why = local_rank_limit(spec)
    if local > limit:
        key = "run.nproc (nproc)" if spec.train.nnodes == 1 else "ranks per node (nproc / nnodes)"
        raise ConfigError(
            f"{key}={local}: this machine can run at most {limit} ranks ({why}); lower nproc, "
            f"or set {MAX_LOCAL_RANKS_ENV}=N to allow more"
        )


# ------------------------------------------------------------------------------------------------
# The launcher


def torchrun_command(spec: RunSpec, spec_path: str) -> list[str]:
    """The torchrun command line of a run (standalone rendezvous unless ``torchrun_args`` say
    otherwise)."""
    return [
        sys.executable, "-m", "torch.distributed.run", *spec.train.torchrun_args,
        "--nproc-per-node", str(spec.world_size // spec.train.nnodes), "--max-restarts", "0",
        "-m", "dcp_bench.run.torch_rank", "--spec", spec_path,
    ]  # fmt: skip


def marked_processes(mark: str) -> list[int]:
    """Pids of the live processes (zombies excluded) whose environment carries ``mark`` (Linux
    ``/proc``; an empty list where it does not exist)."""
    needle = f"{RUN_MARK_ENV}={mark}".encode()
    me = os.getpid()
    out: list[int] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    for name in entries:
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                env = fh.read()
            with open(f"/proc/{name}/stat", "rb") as fh:
                state = fh.read().rsplit(b")", 1)[-1].split()[0]
        except (OSError, IndexError):
            continue  # gone, or not ours to read
        if state not in (b"Z", b"X") and needle in env.split(b"\0"):
            out.append(int(name))
    return out


def _signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def kill_run_tree(
    proc: subprocess.Popen[Any], mark: str, grace_s: float = 5.0, wait_s: float = 60.0
) -> list[int]:
    """Stop ``proc`` (started in its own session) and every process carrying ``mark``: SIGTERM to
    all of them (torchrun forwards it to its ranks), SIGKILL to whatever is left after
    ``grace_s``, then wait until none is alive (at most ``wait_s``). Returns the pids still alive
    after that (none, unless the kernel could not end them)."""

    def group(sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)

    if proc.poll() is None or marked_processes(mark):
        group(signal.SIGTERM)
        _signal_all(marked_processes(mark), signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
    deadline = time.monotonic() + wait_s
    while True:
        left = marked_processes(mark)
        if proc.poll() is None:
            group(signal.SIGKILL)
        elif not left:
            break
        if time.monotonic() > deadline:
            break
        _signal_all(left, signal.SIGKILL)
        time.sleep(0.05)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=max(0.1, deadline - time.monotonic()))
    return marked_processes(mark)


def run_session(
    cmd: list[str], env: dict[str, str], limit_s: float | None, show_stdout: bool = False
) -> tuple[int | None, str, list[int]]:
    """Run ``cmd`` in a session of its own, every process of it marked; returns (exit code, or
    None when killed at ``limit_s``; stderr; pids that survived the cleanup). Its stdout is
    discarded, or shared with this process when ``show_stdout``. Whatever happens, the whole tree
    is gone (or reported) when this returns."""
    mark = uuid.uuid4().hex
    env = {**env, RUN_MARK_ENV: mark}
    stdout = None if show_stdout else subprocess.DEVNULL
    with tempfile.TemporaryFile(mode="w+") as err:
        proc = subprocess.Popen(cmd, env=env, stdout=stdout, stderr=err, start_new_session=True)
        try:
            code: int | None = proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            code = None
        except BaseException:
            kill_run_tree(proc, mark)
            raise
        # After a timeout: stop everything. After an exit: torchrun is done, and a rank it failed
        # to reap must not outlive it either.
        survivors = kill_run_tree(proc, mark)
        err.seek(0)
        return code, err.read(), survivors


def launch_torch_run(spec: RunSpec, attempts: int = 2) -> RunSummary:
    """Run ``spec`` for real and return its summary (also in ``<root>/<campaign>/<run_id>/``).
    A run killed at its time limit is recorded as ``timeout``; ranks that crash before writing a
    summary are recorded as ``error`` with the most telling line of their output. Raises
    `ConfigError` before starting anything when this node cannot run the ranks asked for."""
    check_local_ranks(spec)
    started = time.time()
    run_dir = Path(spec.root) / spec.campaign / spec.run_id
    owner = _claim_fresh_run_dir(spec, run_dir)
    code, stderr, survivors = _run_attempts(spec, run_dir, owner, started, attempts)
    if owner is not None and run_dir.exists():
        take_over(run_dir)  # the ranks are gone; no late writer may change what is recorded now
    return _outcome(spec, run_dir, started, code, stderr, survivors)


def _claim_fresh_run_dir(spec: RunSpec, run_dir: Path) -> str | None:
    """The owner token of the run folder this node claims, or None when several nodes run it.
    One node claims the folder for the rank 0 it starts; with several nodes rank 0 may start on
    any of them, and its writer claims the folder itself."""
    if spec.train.nnodes != 1:
        return None
    owner = claim_run(run_dir)
    # A fresh folder (config, no steps, no summary): what an earlier run of this id left is
    # gone even if no rank ever starts.
    RunWriter(spec.root, spec.campaign, spec.run_id, dict(spec.config), enabled=True, owner=owner)
    # An earlier failure's output is not this run's.
    for name in (STDERR_LOG, STDERR_FIRST_ATTEMPT_LOG):
        (run_dir / name).unlink(missing_ok=True)
    return owner


def _run_attempts(
    spec: RunSpec, run_dir: Path, owner: str | None, started: float, attempts: int
) -> tuple[int | None, str, list[int]]:
    """Start torchrun, once more when the first launch failed in a way worth retrying; return
    its exit code (None: killed at the time limit), the ranks' output and the pids that could
    not be stopped."""
    with tempfile.TemporaryDirectory(prefix="dcp-bench-run-") as tmp:
        spec_path = str(Path(tmp) / "spec.json")
        payload = spec_payload(spec, owner)
        Path(spec_path).write_text(json.dumps(payload, default=str))
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", str(spec.train.threads))
        limit = spec.hard_limit_s()
        code: int | None = None
        stderr = ""
        survivors: list[int] = []
        for attempt in range(attempts):
            remaining = None if limit is None else max(1.0, limit - (time.time() - started))
            try:
                code, stderr, survivors = run_session(
                    torchrun_command(spec, spec_path), env, remaining
                )
            except KeyboardInterrupt as exc:
                # Ctrl-C or SIGTERM: the ranks are stopped; say so in the record.
                if owner is not None or run_dir.exists():
                    _record_stopped(spec, run_dir, started, exc)
                raise
            if (
                code not in (None, 0)
                and attempt + 1 < attempts
                and not survivors
                and _not_summarised(run_dir, started)
                and _retryable(stderr)
            ):
                # The launch failed, or a rank died without an exception of its own (a signal,
                # a crash below Python): start the run once more, fresh, and say so in its record.
                _keep_stderr(run_dir, stderr, STDERR_FIRST_ATTEMPT_LOG)
                payload["previous_attempt"] = (
                    f"attempt {attempt + 1} failed (torchrun exit {code}): "
                    f"{error_tail(stderr)}; its output: {STDERR_FIRST_ATTEMPT_LOG}"
                )
                Path(spec_path).write_text(json.dumps(payload, default=str))
                continue
            break
    return code, stderr, survivors


def _outcome(
    spec: RunSpec,
    run_dir: Path,
    started: float,
    code: int | None,
    stderr: str,
    survivors: list[int],
) -> RunSummary:
    """The run's summary once its ranks are gone: rank 0's own record when it is this run's and
    tells the story, else a record of why the run did not finish."""
    summary = read_summary(run_dir) if run_dir.exists() else None
    fresh = summary is not None and (summary.started_at or 0.0) >= started - 1.0
    if survivors:
        return record_unfinished(
            spec,
            "error",
            f"{len(survivors)} process(es) of the run could not be stopped "
            f"(pids {', '.join(map(str, survivors[:8]))})",
            started,
        )
    if summary is not None and fresh and (code == 0 or summary.status != "ok"):
        return summary
    if summary is not None and fresh and code is not None and _retryable(stderr):
        # Rank 0 finished the run and wrote its final record; a rank died afterwards, in the
        # teardown, without an exception of its own (a signal, an abort below Python). The
        # record stands as written; the ranks' output is kept beside it.
        _keep_stderr(run_dir, stderr)
        return summary
    if code == 0 and summary is None and spec.train.nnodes > 1:
        # This node's ranks finished cleanly; rank 0 ran on another node and wrote the records
        # there.
        note = summarise(spec, [], "ok", None, described(spec), None, started)
        return dataclasses.replace(
            note,
            status="ok",
            error=None,
            notes={**note.notes, "note": "rank 0 ran on another node, which holds the records"},
        )
    if code is None:
        limit = spec.hard_limit_s()
        steps = len(read_steps(run_dir)) if run_dir.exists() else 0
        return record_unfinished(
            spec,
            "timeout",
            f"killed after {limit:.0f} s ({spec.limit_text()} plus grace); "
            f"{steps} step(s) recorded",
            started,
        )
    _keep_stderr(run_dir, stderr)
    return record_unfinished(
        spec,
        "error",
        f"training failed (torchrun exit {code}): {error_tail(stderr)} "
        f"(ranks' output: {STDERR_LOG})",
        started,
    )


def _record_stopped(spec: RunSpec, run_dir: Path, started: float, exc: BaseException) -> None:
    """The record of a run its command was stopped in (SIGTERM arrives as an exception whose
    text is ``signal N``; Ctrl-C as a bare KeyboardInterrupt): status error, naming the signal."""
    text = str(exc)
    signum = (
        int(text.split()[-1])
        if text.startswith("signal ") and text.split()[-1].isdigit()
        else signal.SIGINT
    )
    name = signal.Signals(signum).name
    steps = len(read_steps(run_dir)) if run_dir.exists() else 0
    with contextlib.suppress(Exception):  # the stop goes on whatever the record does
        record_unfinished(
            spec,
            "error",
            f"stopped by {name} (signal {int(signum)}) after {steps} step(s) recorded",
            started,
            notes={"signal": int(signum), "signal_name": name},
        )


STDERR_LOG = (
    "stderr.log"  # beside the records of a failed run: the tail of torchrun's and the ranks' stderr
)
STDERR_FIRST_ATTEMPT_LOG = "stderr.attempt1.log"  # the same for a first attempt that was retried
STDERR_KEEP_LINES = 400


def _keep_stderr(run_dir: Path, stderr: str, name: str = STDERR_LOG) -> None:
    """Keep the last lines of the ranks' stderr beside the failed run's records, so the cause
    is there to read after the temporary files are gone."""
    if run_dir.exists():
        lines = stderr.splitlines()[-STDERR_KEEP_LINES:]
        atomic_write_text(run_dir / name, "\n".join(lines) + "\n")


def _retryable(stderr: str) -> bool:
    """A failure worth one more attempt: no rank raised an exception of its own (a rank's own
    failure, an injected one included, is marked and never retried)."""
    return RANK_ERROR_MARK not in stderr


def _not_summarised(run_dir: Path, started: float) -> bool:
    summary = read_summary(run_dir) if run_dir.exists() else None
    return summary is None or (summary.started_at or 0.0) < started - 1.0


def write_rank_error(exc: BaseException) -> None:
    """A rank's failure on its stderr: the traceback, then one line after `RANK_ERROR_MARK` that
    the launcher reads back as the run's error (`error_tail`)."""
    rank = os.environ.get("RANK", "?")
    message = " ".join(str(exc).split())  # one line, whatever the exception's text holds
    sys.stderr.write(
        f"{traceback.format_exc()}{RANK_ERROR_MARK} rank {rank}: {type(exc).__name__}: {message}\n"
    )


def error_tail(stderr: str) -> str:
    """The most telling line of the ranks' stderr: the first rank's marked failure (rank 0's
    when it failed the same way: a refusal is raised on every rank alike), else the last
    exception line that says more than torchrun's own "ChildFailedError", else the signal or exit
    code torchrun reports for a rank, else the last line that is not torchrun's frame."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    marked = [ln[len(RANK_ERROR_MARK) :].strip() for ln in lines if ln.startswith(RANK_ERROR_MARK)]
    if marked:

        def body(m: str) -> str:  # the failure without its "rank N:" prefix
            return m.split(":", 1)[1].strip() if m.startswith("rank ") else m

        same_on_rank0 = [
            m for m in marked if m.startswith("rank 0:") and body(m) == body(marked[0])
        ]
        return (same_on_rank0 or marked)[0][:500]
    own = [
        ln
        for ln in lines
        if not ln.startswith(("File ", "[", "raise ", "Traceback", "=", "-"))
        and not ln.endswith("ChildFailedError:")
    ]
    for signs in (("Error",), ("Signal", "exitcode")):
        for ln in reversed(own):
            if any(sign in ln for sign in signs):
                return ln[:500]
    return (own or lines or ["no output"])[-1][:500]
