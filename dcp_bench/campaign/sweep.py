"""Sweeps: methods x workloads x clusters x models x repeats, simulated or real,
each run through the one run path (`dcp_bench.run`) and written as run records.

A sweep is a list of hydra-style overrides where a value may list alternatives separated by
commas (``method=dcp,bucket_static cluster=h200x8,h200x32``): the grid is their product, and
every grid point (a *cell*) runs ``run.repeats`` times with seeds ``seed, seed+1, ...``. The same
seed gives the same global batches to every method, so repeats pair across methods.

Resumable: a run's id is a pure function of its cell's config hash and its seed, and a run folder
is complete once ``run.json`` exists (written last, atomically) and the record reads back
consistent (`dcp_bench.records.check_run`). A rerun of the same sweep skips complete runs, redoes
incomplete ones (a killed run leaves a folder without ``run.json``) and damaged ones (an
unreadable or inconsistent record, named in a warning), and keeps failed runs (status other than
``ok``) as recorded unless asked to retry them (``retry_failed``); every sweep lists its failed
runs, kept or new.

Isolation: a simulated run executes in a forked process, killed at its hard limit
(``run.timeout_s`` plus grace) and then recorded as ``timeout``, so one stuck step cannot stall a
sweep; a real run executes under torchrun, whose launcher kills every process of the run at the
same limit (`dcp_bench.run.torch_run`). A deadline bounds running runs too: each run's limit is
cut to the time the deadline leaves, and a run killed by it is recorded as ``timeout`` naming the
budget.

Concurrency: one process at a time executes a run id (`dcp_bench.records.try_lock_run`). A run
another process is executing is taken up once that process lets it go: if it then holds a record
finished after this sweep started, that record is kept (counted as already complete, named in a
message), otherwise this sweep runs it. The same grid point given twice is one run.
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing as mp
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from dcp_bench.config import RUN_DEFAULTS, load_config, to_container
from dcp_bench.envinfo import collect_env
from dcp_bench.errors import ConfigError, OutputError
from dcp_bench.files import check_output
from dcp_bench.records import (
    RecordError,
    RunState,
    RunSummary,
    check_run,
    read_steps,
    read_summary,
    try_lock_run,
    unlock_run,
)
from dcp_bench.run.assemble import Assemble, assemble
from dcp_bench.run.loop import record_unfinished
from dcp_bench.run.simulated import run_simulated
from dcp_bench.run.spec import RunSpec, parse_run_spec
from dcp_bench.run.torch_run import check_local_ranks, launch_torch_run
from dcp_bench.run_ids import earlier_run_ids

# The name a deadline's cut gives in records and messages ("run exceeded the time budget ...").
BUDGET = "the time budget"

# --------------------------------------------------------------------------------------------
# The grid


def split_alternatives(value: str) -> list[str]:
    """Split ``a,b,c`` on commas outside brackets and quotes (``[1,2]`` stays one value)."""
    out: list[str] = []
    cur: list[str] = []
    depth, quote = 0, ""
    for ch in value:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
            continue
        cur.append(ch)
    out.append("".join(cur))
    return [v.strip() for v in out]


def expand_grid(overrides: Sequence[str]) -> list[list[str]]:
    """The product of the alternatives of every override, in the order given."""
    axes: list[list[str]] = []
    for ov in overrides:
        if "=" not in ov:
            raise ConfigError(
                f"bad override {ov!r}: expected key=value (e.g. method=dcp,bucket_static)"
            )
        key, value = ov.split("=", 1)
        axes.append([f"{key}={v}" for v in split_alternatives(value)])
    return [list(p) for p in itertools.product(*axes)]


# Repeats of one grid point: far above what a comparison needs (its CI converges in tens), and
# low enough that `run.repeats=1e9` is refused at once instead of planning for ever.
MAX_REPEATS = 1_000


def plan_sweep(
    overrides: Sequence[str],
    repeats: int | None = None,
    sweep: str = "",
    compose: Callable[[Sequence[str]], Any] = load_config,
) -> list[RunSpec]:
    """Every run of the grid the overrides describe, in a stable order (cells, then seeds)."""
    specs: list[RunSpec] = []
    for cell in expand_grid(overrides):
        cfg = to_container(compose(cell))
        run_node = cfg.get("run") or {}
        n = repeats if repeats is not None else run_node.get("repeats", RUN_DEFAULTS["repeats"])
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_REPEATS:
            raise ConfigError(
                f"run.repeats (repeats)={n!r}: expected an integer >= 1 and at most {MAX_REPEATS:,}"
            )
        first = parse_run_spec(cfg, sweep=sweep, overrides=cell)
        specs.append(first)
        specs += [
            parse_run_spec(cfg, seed=first.seed + r, sweep=sweep, overrides=cell)
            for r in range(1, n)
        ]
    return unique_runs(specs)


def unique_runs(specs: Sequence[RunSpec]) -> list[RunSpec]:
    """The specs with each run (root, campaign, run id) once, first occurrence kept: a grid value
    given twice (``method=dcp,dcp``) names the same runs twice."""
    seen: set[tuple[str, str, str]] = set()
    out: list[RunSpec] = []
    for spec in specs:
        key = (str(spec.root), spec.campaign, spec.run_id)
        if key not in seen:
            seen.add(key)
            out.append(spec)
    return out


# --------------------------------------------------------------------------------------------
# Running a sweep


@dataclass
class SweepResult:
    ran: list[RunSummary] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # complete records kept (failed ones included)
    kept_failed: list[RunSummary] = field(default_factory=list)  # recorded failures not retried
    damaged: list[tuple[str, str]] = field(default_factory=list)  # (run id, problem): redone
    unrun: list[str] = field(default_factory=list)  # left out by the deadline

    @property
    def failed(self) -> list[RunSummary]:
        """Runs of this sweep that ended other than ``ok``."""
        return [s for s in self.ran if s.status != "ok"]

    @property
    def all_failed(self) -> list[RunSummary]:
        """Every failed record of the sweep's runs: new failures and those kept from before."""
        return [*self.kept_failed, *self.failed]


def run_one(
    spec: RunSpec, build: Assemble = assemble, env: dict[str, Any] | None = None
) -> RunSummary:
    """One run on its executor (simulated in this process; real under torchrun)."""
    if spec.executor == "torch":
        return launch_torch_run(spec)
    return run_simulated(spec, build=build, env=env)


def _child(
    spec: RunSpec, build: Assemble, env: dict[str, Any] | None, foreign_locks: Sequence[int] = ()
) -> None:
    # Other runs' locks came with the fork: let them go with their runs, not with this one.
    for fd in foreign_locks:
        with contextlib.suppress(OSError):
            os.close(fd)
    # Pin threads in workers so parallel runs do not oversubscribe the cores.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        with contextlib.suppress(KeyboardInterrupt):
            run_simulated(spec, build=build, env=env)
    except OutputError:
        # Records that cannot be written (a full disk): the parent records the run as unfinished,
        # and that write says why on one line; no traceback from this process.
        raise SystemExit(1) from None


# A run the deadline cuts is killed at most this long after it: its last step may be stuck.
BUDGET_KILL_GRACE_S = 5.0


def _bounded(spec: RunSpec, deadline: float | None) -> RunSpec:
    """The run with its time limit cut to what the deadline leaves (a budget bounds running runs,
    not only the start of new ones), naming the budget as what limits it."""
    if deadline is None:
        return spec
    left = max(1.0, deadline - time.time())
    if spec.timeout_s is not None and spec.timeout_s <= left:
        return spec
    own_grace = spec.hard_limit_s()
    grace = (
        BUDGET_KILL_GRACE_S
        if own_grace is None
        else min(BUDGET_KILL_GRACE_S, own_grace - (spec.timeout_s or 0.0))
    )
    return spec.with_timeout(left, BUDGET, kill_grace_s=grace)


SUPERSEDED_DIR = ".superseded"


def record_state(spec: RunSpec) -> tuple[Path, RunState]:
    """The run's record: under its id, or, when there is no folder of that id, under an earlier
    id of the committed campaigns (`dcp_bench.run_ids`) checked against that id's cell hash."""
    run_dir = Path(spec.root) / spec.campaign / spec.run_id
    if not run_dir.exists():
        for earlier, cell in earlier_run_ids(spec.run_id, spec.config_hash):
            old_dir = run_dir.parent / earlier
            if old_dir.is_dir():
                return old_dir, check_run(old_dir, config_hash=cell, seed=spec.seed)
    return run_dir, check_run(run_dir, config_hash=spec.config_hash, seed=spec.seed)


def _supersede(spec: RunSpec, record: Path) -> None:
    """An earlier-id record the run is redone over, moved out of the campaign (into
    ``<campaign>/.superseded/``) so the redone run under the current id is the cell's only one."""
    if record.name != spec.run_id and record.exists():
        target = record.parent / SUPERSEDED_DIR / record.name
        target.parent.mkdir(exist_ok=True)
        shutil.rmtree(target, ignore_errors=True)
        os.replace(record, target)


def _resume_state(spec: RunSpec, retry_failed: bool) -> tuple[str, RunSummary | None, str | None]:
    """("skip" | "retry" | "run" | "damaged", the kept summary, the damage) for one run."""
    record, state = record_state(spec)
    what: tuple[str, RunSummary | None, str | None] = ("skip", state.summary, None)
    if state.state == "damaged":
        what = ("damaged", None, state.problem)
    elif state.state == "incomplete":
        what = ("run", None, None)
    elif state.summary is not None and state.summary.cut_by_budget:
        what = ("run", None, None)  # cut by an earlier sweep's deadline, not failed on its own
    elif state.failed and retry_failed:
        what = ("retry", state.summary, None)
    if what[0] != "skip":
        _supersede(spec, record)
    return what


class Progress:
    """Progress of a sweep: a bar on a terminal (``"bar"``), one line per finished run on stderr
    otherwise (``"lines"``: logs and pipes see progress as it happens), or nothing (``"none"``)."""

    def __init__(self, mode: str, total: int) -> None:
        self.mode, self.total, self.count = mode, total, 0
        self.bar = tqdm(total=total, desc="runs", unit="run", disable=mode != "bar", leave=False)

    def done(self, summary: RunSummary) -> None:
        self.count += 1
        if self.mode == "bar":
            self.bar.set_postfix_str(f"{summary.method}: {summary.status}", refresh=False)
            self.bar.update(1)
        elif self.mode == "lines":
            took = (summary.finished_at or 0.0) - (summary.started_at or 0.0)
            width = len(str(self.total))
            sys.stderr.write(
                f"[{self.count:>{width}}/{self.total}] {summary.status:<9} {took:6.1f} s  "
                f"{summary.run_id}\n"
            )
            sys.stderr.flush()

    def close(self) -> None:
        self.bar.close()


def progress_mode(progress: bool | str) -> str:
    """``True``: a bar on a terminal, lines otherwise; ``False``: none; or a mode by name."""
    if isinstance(progress, str):
        if progress not in ("bar", "lines", "none"):
            raise ValueError(f"progress={progress!r}; expected bar, lines or none")
        return progress
    if not progress:
        return "none"
    return "bar" if sys.stderr.isatty() else "lines"


def _warn(message: str) -> None:
    sys.stderr.write(f"dcp-bench: warning: {message}\n")
    sys.stderr.flush()


def pending(
    specs: Sequence[RunSpec], resume: bool, retry_failed: bool, warn: Callable[[str], None] = _warn
) -> tuple[list[RunSpec], SweepResult]:
    """The runs a sweep must (re)do, by the local sweep's rules, and the result so far (complete
    records kept, failures kept, damaged records named)."""
    result = SweepResult()
    todo: list[RunSpec] = []
    for spec in specs:
        if not resume:
            todo.append(spec)
            continue
        what, summary, problem = _resume_state(spec, retry_failed)
        if what == "damaged":
            warn(f"run {spec.run_id}: damaged record, redoing it ({problem})")
            result.damaged.append((spec.run_id, str(problem)))
            todo.append(spec)
        elif what in ("run", "retry"):
            todo.append(spec)
        else:
            result.skipped.append(spec.run_id)
            if summary is not None and summary.status != "ok":
                result.kept_failed.append(summary)
    return todo, result


def check_run_places(specs: Sequence[RunSpec]) -> None:
    """Every run's ``<root>/<campaign>/`` can receive records (`dcp_bench.files.check_output`),
    checked before any run starts: one `ConfigError` naming the key otherwise."""
    for root, campaign in dict.fromkeys((str(s.root), s.campaign) for s in specs):
        check_output(root, "run.root")
        check_output(Path(root) / campaign, "run.campaign", value=campaign)


# What `_claim` answers for a run another process finished while this sweep waited for it.
FINISHED_ELSEWHERE = -1


def _claim(
    spec: RunSpec,
    since: float,
    result: SweepResult,
    warn: Callable[[str], None],
    wait: bool,
    announced: set[str],
) -> int | None:
    """Take ``spec``'s execution lock: its descriptor (run it), None (another process is running
    it; with ``wait`` this blocks instead), or `FINISHED_ELSEWHERE` (the lock was free or freed,
    and the folder now holds a complete record finished after ``since``: kept and counted as
    complete; the lock is released)."""
    run_dir = Path(spec.root) / spec.campaign / spec.run_id
    shared = (
        spec.train.nnodes > 1
    )  # the nodes of a multi-node run hold it together (`try_lock_run`)
    fd = try_lock_run(run_dir, shared=shared)
    if fd is None:
        if spec.run_id not in announced:
            announced.add(spec.run_id)
            warn(f"run {spec.run_id}: another process is running it; taken up once it ends")
        if not wait:
            return None
        fd = try_lock_run(run_dir, wait=True, shared=shared)
    state = check_run(run_dir, config_hash=spec.config_hash, seed=spec.seed, restore=False)
    if (
        state.state == "complete"
        and state.summary is not None
        and (state.summary.finished_at or 0.0) >= since
    ):
        unlock_run(fd)
        if spec.run_id in announced:
            warn(
                f"run {spec.run_id}: finished by another process ({state.summary.status}); its "
                "record is kept"
            )
        result.skipped.append(spec.run_id)
        if state.summary.status != "ok":
            result.kept_failed.append(state.summary)
        return FINISHED_ELSEWHERE
    return fd


def run_sweep(
    specs: Sequence[RunSpec],
    resume: bool = True,
    jobs: int = 1,
    progress: bool | str = True,
    env: dict[str, Any] | None = None,
    build: Assemble = assemble,
    deadline: float | None = None,
    isolate: bool = True,
    retry_failed: bool = False,
    warn: Callable[[str], None] = _warn,
    on_run: Callable[[RunSummary], None] | None = None,
) -> SweepResult:
    """Run every spec whose run folder does not hold a complete record (all of them with
    ``resume=False``): incomplete and damaged records are redone (a damaged one with a warning
    naming it), failed records are kept unless ``retry_failed``.

    Simulated runs execute in forked processes (``isolate``; up to ``jobs`` at a time), killed
    when they overrun their hard limit and then recorded as ``timeout``; real runs execute one at
    a time (their own launcher isolates them); before any run starts, every real run is checked
    against what this machine can run (`check_local_ranks`). ``deadline`` (a `time.time()`
    value): runs not started by then are left out and listed in ``SweepResult.unrun``, and
    running runs get at most the time left as their limit (recorded as ``timeout`` naming the
    budget when it cuts them). Runs start seed by seed (every cell's first repeat, then every
    cell's second ...), so a deadline leaves the cells with balanced, paired repeats. ``build``
    replaces the assembly of simulated runs (tests bind small stand-ins). ``progress``: see
    `progress_mode`. ``on_run`` is called with every run's summary as it finishes.
    """
    if jobs < 1:
        raise ConfigError(f"jobs={jobs}: expected an integer >= 1")
    since = time.time()
    check_run_places(specs)
    todo, result = pending(unique_runs(specs), resume, retry_failed, warn)
    for spec in todo:
        if spec.executor == "torch":
            check_local_ranks(spec)
    env = collect_env() if env is None else env
    order = {s.run_id: i for i, s in enumerate(todo)}
    rank = {sd: i for i, sd in enumerate(sorted({s.seed for s in todo}))}
    todo.sort(key=lambda s: (rank[s.seed], order[s.run_id]))
    bar = Progress(progress_mode(progress), len(todo))

    def late() -> bool:
        return deadline is not None and time.time() > deadline

    def done(summary: RunSummary) -> None:
        result.ran.append(summary)
        bar.done(summary)
        if on_run is not None:
            on_run(summary)

    announced: set[str] = set()

    def claim(spec: RunSpec, wait: bool) -> int | None:
        return _claim(spec, since, result, warn, wait, announced)

    try:
        sims = [s for s in todo if s.executor == "sim"]
        serial = [s for s in todo if s.executor == "torch"] + ([] if isolate else sims)
        for spec in serial:
            if late():
                result.unrun.append(spec.run_id)
                continue
            fd = claim(spec, wait=True)
            if fd == FINISHED_ELSEWHERE:
                continue
            try:
                if spec.executor == "torch":
                    done(launch_torch_run(_bounded(spec, deadline)))
                else:
                    done(run_simulated(_bounded(spec, deadline), build=build, env=env))
            finally:
                unlock_run(fd)
        if isolate:
            _run_forked(sims, jobs, build, env, deadline, late, done, result, claim)
    finally:
        bar.close()
    return result


def _run_forked(
    specs: list[RunSpec],
    jobs: int,
    build: Assemble,
    env: dict[str, Any],
    deadline: float | None,
    late: Callable[[], bool],
    done: Callable[[RunSummary], None],
    result: SweepResult,
    claim: Callable[[RunSpec, bool], int | None],
) -> None:
    ctx = mp.get_context("fork")
    active: dict[str, tuple[Any, RunSpec, float]] = {}
    locks: dict[str, int] = {}
    queue = list(specs)
    try:
        while queue or active:
            for waiting in list(queue):  # in order; a run another process holds waits its turn
                if len(active) >= max(1, jobs) or late():
                    break
                fd = claim(waiting, False)
                if fd is None:
                    continue
                queue.remove(waiting)
                if fd == FINISHED_ELSEWHERE:
                    continue
                spec = _bounded(waiting, deadline)
                locks[spec.run_id] = fd
                others = [other for rid, other in locks.items() if rid != spec.run_id]
                proc = ctx.Process(target=_child, args=(spec, build, env, others), daemon=False)
                proc.start()
                active[spec.run_id] = (proc, spec, time.time())
            if queue and late():
                result.unrun += [s.run_id for s in queue]
                queue = []
            if queue and not active:
                time.sleep(0.2)  # every run left is another process's: look again shortly
            for run_id, (proc, spec, started) in list(active.items()):
                summary = _finished_child(proc, spec, started)
                if summary is None:
                    continue
                active.pop(run_id)
                done(summary)
                unlock_run(locks.pop(run_id, None))
            if active:
                time.sleep(0.02)
    finally:
        # Interrupted: stop our own children, leave their runs incomplete.
        for proc, _, _ in active.values():
            if proc.is_alive():
                proc.kill()
                proc.join()
        for fd in locks.values():
            unlock_run(fd)


def _finished_child(proc: Any, spec: RunSpec, started: float) -> RunSummary | None:
    """The summary of the run child ``proc`` runs, once it is over (killed here at the run's
    hard limit, or exited); None while it runs."""
    limit = spec.hard_limit_s()
    if proc.is_alive() and limit is not None and time.time() - started > limit:
        proc.kill()
        proc.join()
        n = len(read_steps(Path(spec.root) / spec.campaign / spec.run_id))
        return record_unfinished(
            spec,
            "timeout",
            f"killed after {limit:.0f} s ({spec.limit_text()} plus grace) inside step {n}",
            started,
        )
    if proc.is_alive():
        return None
    proc.join()
    try:
        summary = read_summary(Path(spec.root) / spec.campaign / spec.run_id)
    except RecordError:
        summary = None
    if summary is None or summary.started_at is None or summary.started_at < started - 1.0:
        # the child died without (its own) summary, e.g. killed by the OS
        summary = record_unfinished(
            spec,
            "error",
            f"run process exited with code {proc.exitcode} before writing its summary",
            started,
        )
    return summary
