"""`dcp-bench sweep ... launcher=slurm`: a sweep's runs as Slurm jobs, through submitit.

The grid, the resume rules and the records are the local sweep's (`dcp_bench.campaign.sweep`):
the runs whose folder holds no complete record (incomplete and damaged ones, and failed ones with
``--retry-failed``) go out as one job array, one run per array task; each task runs
`dcp_bench.campaign.sweep.run_one` on its node and writes the same run folder a local sweep
writes (``run.root``/``run.campaign``/run id: the root must be a file system the nodes share).
A task that Slurm stops leaves its run incomplete, so the same command again resubmits exactly
the runs that are not done. ``launcher=local`` (the default) keeps every run on this machine.

Settings (``slurm.KEY=VALUE`` beside the grid): ``executor`` (``slurm``, or ``local``: submitit's
local executor, subprocesses on this machine, for trying a campaign out), ``partition``,
``timeout_min`` (per run, default 60), ``cpus_per_task`` (default 2), ``gpus_per_node`` (default 0:
simulated runs need none; a real run asks for its own ranks), ``array_parallelism`` (default
64), ``folder`` (submitit's logs and pickles, default ``<root>/<campaign>/.slurm``), ``wait``
(``true``: wait for the jobs and report them; ``false``: submit and return, rerun the command
later to resume and report).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dcp_bench.campaign.sweep import SweepResult, _warn, pending, run_one
from dcp_bench.errors import ConfigError
from dcp_bench.records import RunSummary
from dcp_bench.run.loop import record_unfinished
from dcp_bench.run.spec import RunSpec

LAUNCHERS = ("local", "slurm")
EXECUTORS = ("slurm", "local")


@dataclass(frozen=True)
class SlurmSettings:
    executor: str = "slurm"
    partition: str | None = None
    timeout_min: int = 60
    cpus_per_task: int = 2
    gpus_per_node: int = 0
    array_parallelism: int = 64
    folder: str | None = None
    wait: bool = True


def _bool(value: str, key: str) -> bool:
    low = value.strip().lower()
    if low in ("true", "1", "yes"):
        return True
    if low in ("false", "0", "no"):
        return False
    raise ConfigError(f"{key}={value}: expected true or false")


def _positive(value: str, key: str, minimum: int = 1) -> int:
    try:
        n = int(value)
    except ValueError:
        raise ConfigError(f"{key}={value}: expected an integer >= {minimum}") from None
    if n < minimum:
        raise ConfigError(f"{key}={value}: expected an integer >= {minimum}")
    return n


def split_launcher(overrides: Sequence[str]) -> tuple[str, SlurmSettings, list[str]]:
    """(launcher, Slurm settings, the other overrides) from a sweep's command line: ``launcher=``
    and ``slurm.*`` keys are the launcher's, every other key is the grid's."""
    launcher = "local"
    fields: dict[str, Any] = {}
    rest: list[str] = []
    for ov in overrides:
        key, sep, value = ov.partition("=")
        if sep and key == "launcher":
            if value not in LAUNCHERS:
                raise ConfigError(f"launcher={value}: expected one of {', '.join(LAUNCHERS)}")
            launcher = value
        elif sep and key.startswith("slurm."):
            name = key[len("slurm.") :]
            if name == "executor":
                if value not in EXECUTORS:
                    raise ConfigError(f"{key}={value}: expected one of {', '.join(EXECUTORS)}")
                fields[name] = value
            elif name in ("partition", "folder"):
                fields[name] = value or None
            elif name in ("timeout_min", "cpus_per_task", "array_parallelism"):
                fields[name] = _positive(value, key)
            elif name == "gpus_per_node":
                fields[name] = _positive(value, key, minimum=0)
            elif name == "wait":
                fields[name] = _bool(value, key)
            else:
                known = (
                    "executor, partition, timeout_min, cpus_per_task, gpus_per_node, "
                    "array_parallelism, folder, wait"
                )
                raise ConfigError(
                    f"{key}: unknown Slurm setting; expected slurm.KEY with KEY one of {known}"
                )
        else:
            rest.append(ov)
    if fields and launcher != "slurm":
        raise ConfigError(f"slurm.{next(iter(fields))}: Slurm settings need launcher=slurm")
    return launcher, SlurmSettings(**fields), rest


def _executor(settings: SlurmSettings, folder: Path, specs: Sequence[RunSpec]) -> Any:
    try:  # an optional dependency (the slurm extra): imported only when a sweep uses it
        import submitit
    except ImportError:
        raise ConfigError(
            "launcher=slurm needs the submitit package: pip install 'dcp-bench[slurm]' "
            "(or pip install submitit)"
        ) from None
    ex = submitit.AutoExecutor(folder=str(folder), cluster=settings.executor)
    gpus = settings.gpus_per_node
    real = [s for s in specs if s.executor == "torch"]
    if real:
        multi = [s for s in real if s.train.nnodes > 1]
        if multi:
            raise ConfigError(
                f"launcher=slurm runs each run as one single-node job; run {multi[0].run_id} asks "
                f"for nnodes={multi[0].train.nnodes}: expected nnodes=1 (use `dcp-bench slurm` "
                "for multi-node training)"
            )
        gpus = max(
            gpus,
            max(s.world_size for s in real) if any(s.train.device != "cpu" for s in real) else 0,
        )
    params: dict[str, Any] = {
        "name": "dcp-bench",
        "timeout_min": settings.timeout_min,
        "cpus_per_task": settings.cpus_per_task,
        "slurm_array_parallelism": settings.array_parallelism,
    }
    if gpus:
        params["gpus_per_node"] = gpus
    if settings.partition:
        params["slurm_partition"] = settings.partition
    ex.update_parameters(**params)
    return ex


def run_sweep_slurm(
    specs: Sequence[RunSpec],
    settings: SlurmSettings,
    resume: bool = True,
    retry_failed: bool = False,
    warn: Callable[[str], None] = _warn,
    out: Callable[[str], None] = print,
) -> SweepResult:
    """Submit the runs not yet done as one job array; with ``settings.wait`` wait for every job
    and return their summaries as `SweepResult.ran` (a job that ended without writing its run's
    summary is recorded as an ``error`` naming the job), else return after submitting, the
    submitted runs listed in `SweepResult.unrun`."""
    todo, result = pending(specs, resume, retry_failed, warn)
    if not todo:
        return result
    first = todo[0]
    folder = (
        Path(settings.folder) if settings.folder else Path(first.root) / first.campaign / ".slurm"
    )
    ex = _executor(settings, folder, todo)
    submitted = time.time()
    jobs = ex.map_array(run_one, list(todo))
    out(
        f"submitted {len(jobs)} run(s) as {settings.executor} job(s) {jobs[0].job_id}"
        + (f" .. {jobs[-1].job_id}" if len(jobs) > 1 else "")
        + f"; logs in {folder}"
    )
    if not settings.wait:
        result.unrun += [s.run_id for s in todo]
        return result
    for spec, job in zip(todo, jobs):
        try:
            summary: RunSummary = job.result()
        except Exception as exc:  # the job ended outside the run loop: time limit, node lost, crash
            text = str(exc).strip()
            status = "timeout" if "TIMEOUT" in text else "error"
            last = (text.splitlines() or [type(exc).__name__])[-1]
            summary = record_unfinished(
                spec,
                status,
                f"{settings.executor} job {job.job_id} ended without the "
                f"run's summary: {last[:300]}",
                submitted,
            )
        result.ran.append(summary)
        sys.stderr.write(
            f"{summary.status:<9} {spec.run_id} ({settings.executor} job {job.job_id})\n"
        )
    return result
