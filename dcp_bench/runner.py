"""The runner: sweeps of methods x workloads x clusters x models x repeats, simulated or real,
each run through the one run path (`dcp_bench.run`) and written as run records.

A sweep is a list of hydra-style overrides where a value may list alternatives separated by
commas (``method=dcp,bucket_static cluster=h200x8,h200x32``): the grid is their product, and
every grid point (a *cell*) runs ``run.repeats`` times with seeds ``seed, seed+1, ...``. The same
seed gives the same global batches to every method, so repeats pair across methods.

Resumable: a run's id is a pure function of its cell's config hash and its seed, and a run folder
is complete once ``run.json`` exists (written last, atomically). A rerun of the same sweep skips
complete runs and redoes incomplete ones (a killed run leaves a folder without ``run.json``).

Isolation: a simulated run executes in a forked process, killed at its hard limit
(``run.timeout_s`` plus grace) and then recorded as ``timeout``, so one stuck step cannot stall a
sweep; a real run executes under torchrun in a process session of its own, which the launcher
kills whole at the same limit (`dcp_bench.run.torch_run`).
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing as mp
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dcp_bench.config import load_config, to_container
from dcp_bench.envinfo import collect_env
from dcp_bench.errors import ConfigError
from dcp_bench.records import RunSummary, is_complete, read_steps, read_summary
from dcp_bench.run.assemble import Assemble, assemble
from dcp_bench.run.loop import record_unfinished
from dcp_bench.run.simulated import run_simulated
from dcp_bench.run.spec import RunSpec, parse_run_spec
from dcp_bench.run.torch_run import launch_torch_run

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
            raise ConfigError(f"bad override {ov!r}: expected key=value (e.g. method=dcp,bucket_static)")
        key, value = ov.split("=", 1)
        axes.append([f"{key}={v}" for v in split_alternatives(value)])
    return [list(p) for p in itertools.product(*axes)]


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
        n = repeats if repeats is not None else run_node.get("repeats", 5)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"run.repeats={n!r}: expected an integer >= 1")
        first = parse_run_spec(cfg, sweep=sweep, overrides=cell)
        specs.append(first)
        specs += [parse_run_spec(cfg, seed=first.seed + r, sweep=sweep, overrides=cell) for r in range(1, n)]
    return specs


# --------------------------------------------------------------------------------------------
# Running a sweep


@dataclass
class SweepResult:
    ran: list[RunSummary] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    unrun: list[str] = field(default_factory=list)  # left out by the deadline

    @property
    def failed(self) -> list[RunSummary]:
        return [s for s in self.ran if s.status != "ok"]


def run_one(spec: RunSpec, build: Assemble = assemble, env: dict[str, Any] | None = None) -> RunSummary:
    """One run on its executor (simulated in this process; real under torchrun)."""
    if spec.executor == "torch":
        return launch_torch_run(spec)
    return run_simulated(spec, build=build, env=env)


def _child(spec: RunSpec, build: Assemble, env: dict[str, Any] | None) -> None:
    # Pin threads in workers so parallel runs do not oversubscribe the cores.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with contextlib.suppress(KeyboardInterrupt):
        run_simulated(spec, build=build, env=env)


def _bounded(spec: RunSpec, deadline: float | None) -> RunSpec:
    """The run with its time limit cut to what the deadline leaves (a budget bounds running runs,
    not only the start of new ones)."""
    if deadline is None:
        return spec
    left = max(1.0, deadline - time.time())
    return spec.with_timeout(min(spec.timeout_s, left) if spec.timeout_s is not None else left)


def run_sweep(
    specs: Sequence[RunSpec],
    resume: bool = True,
    jobs: int = 1,
    progress: bool = True,
    env: dict[str, Any] | None = None,
    build: Assemble = assemble,
    deadline: float | None = None,
    isolate: bool = True,
) -> SweepResult:
    """Run every spec whose run folder is not complete (all of them with ``resume=False``).

    Simulated runs execute in forked processes (``isolate``; up to ``jobs`` at a time), killed
    when they overrun their hard limit and then recorded as ``timeout``; real runs execute one at
    a time (their own launcher isolates them). ``deadline`` (a `time.time()` value): runs not
    started by then are left out and listed in ``SweepResult.unrun``, and running runs get at
    most the time left as their limit. Runs start seed by seed (every cell's first repeat, then
    every cell's second ...), so a deadline leaves the cells with balanced, paired repeats.
    ``build`` replaces the assembly of simulated runs (tests bind small stand-ins).
    """
    from tqdm import tqdm

    result = SweepResult()
    todo: list[RunSpec] = []
    for spec in specs:
        if resume and is_complete(Path(spec.root) / spec.campaign / spec.run_id):
            result.skipped.append(spec.run_id)
        else:
            todo.append(spec)
    env = collect_env() if env is None else env
    order = {s.run_id: i for i, s in enumerate(todo)}
    rank = {sd: i for i, sd in enumerate(sorted({s.seed for s in todo}))}
    todo.sort(key=lambda s: (rank[s.seed], order[s.run_id]))
    bar = tqdm(total=len(todo), desc="runs", unit="run", disable=not progress, leave=False)

    def late() -> bool:
        return deadline is not None and time.time() > deadline

    def done(summary: RunSummary) -> None:
        result.ran.append(summary)
        bar.set_postfix_str(f"{summary.method}: {summary.status}", refresh=False)
        bar.update(1)

    try:
        sims = [s for s in todo if s.executor == "sim"]
        for spec in [s for s in todo if s.executor == "torch"]:
            if late():
                result.unrun.append(spec.run_id)
                continue
            done(launch_torch_run(_bounded(spec, deadline)))
        if not isolate:
            for spec in sims:
                if late():
                    result.unrun.append(spec.run_id)
                    continue
                done(run_simulated(_bounded(spec, deadline), build=build, env=env))
        else:
            _run_forked(sims, jobs, build, env, deadline, late, done, result)
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
) -> None:
    ctx = mp.get_context("fork")
    active: dict[str, tuple[Any, RunSpec, float]] = {}
    queue = list(specs)
    try:
        while queue or active:
            while queue and len(active) < max(1, jobs) and not late():
                spec = _bounded(queue.pop(0), deadline)
                proc = ctx.Process(target=_child, args=(spec, build, env), daemon=False)
                proc.start()
                active[spec.run_id] = (proc, spec, time.time())
            if queue and late():
                result.unrun += [s.run_id for s in queue]
                queue = []
            for run_id, (proc, spec, started) in list(active.items()):
                limit = spec.hard_limit_s()
                if proc.is_alive() and limit is not None and time.time() - started > limit:
                    proc.kill()
                    proc.join()
                    active.pop(run_id)
                    n = len(read_steps(Path(spec.root) / spec.campaign / run_id))
                    done(record_unfinished(spec, "timeout", f"killed after {limit:.0f} s (run.timeout_s plus grace) "
                                       f"inside step {n}", started))
                elif not proc.is_alive():
                    proc.join()
                    active.pop(run_id)
                    summary = read_summary(Path(spec.root) / spec.campaign / run_id)
                    if summary is None:  # the child died without a summary (e.g. killed by the OS)
                        summary = record_unfinished(spec, "error", f"run process exited with code {proc.exitcode} "
                                                "before writing its summary", started)
                    done(summary)
            if active:
                time.sleep(0.02)
    finally:
        for proc, _, _ in active.values():  # interrupted: stop our own children, leave runs incomplete
            if proc.is_alive():
                proc.kill()
                proc.join()
