"""The one step loop: every run, simulated or real, goes through `execute_run`.

For each of ``warmup_steps + steps`` steps: the workload deals the global batch (the same for
every method at a given seed and step), the executor plans it (planning timed) and executes the
plan, and the step becomes a `StepRecord`: the executed time with planning charged by
``run.planner_clock``, per-rank busy / idle time and peak memory, the batch's lower bound, and,
beside measured steps, the cost model's prediction of the same plan. Warm-up steps are recorded and
excluded from the summary. A run ends early with status ``oom`` (a simulated step over the GPU's
memory), ``nonfinite`` (a non-finite loss), ``timeout`` (``run.timeout_s`` passed between steps)
or ``error`` (a planner or input error); every outcome is written, never dropped.
"""

from __future__ import annotations

import dataclasses
import math
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

from dcp_bench.cost.base import CostModel
from dcp_bench.cost.constants import MODEL_VARIANT_OPTIONS
from dcp_bench.errors import DcpBenchError
from dcp_bench.execution import Executor, ExecutorDescription, ExecutorInfo, StepOutcome
from dcp_bench.plan import StepPlan
from dcp_bench.records import (
    RunSummary,
    RunWriter,
    StepRecord,
    read_steps,
    take_over,
    write_summary,
)
from dcp_bench.run.assemble import RunParts
from dcp_bench.run.capabilities import DocumentedWorkload
from dcp_bench.run.deal import deal_steps, latent_token_count
from dcp_bench.run.spec import RunSpec
from dcp_bench.sim import lower_bound, physical_lower_bound, simulate_step
from dcp_bench.summary_schema import (
    CostDescription,
    EpochAccounting,
    NoiseRecord,
    PlanningCost,
    Predictions,
    RunContext,
    RunOutcome,
    TrainingCurves,
    WorkloadRecord,
)


class RunTimeout(DcpBenchError):
    """A run went past ``run.timeout_s``."""


class _StopRun(Exception):
    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status


def charged_planning(wall_s: float, cpu_s: float, what: str) -> float:
    """The planning time the step clock is charged (``run.planner_time``): the planning call's
    process CPU time (``cpu``), its wall-clock time (``wall``: other processes' load included),
    or nothing (``none``: the simulator's default, so a simulated step depends only on its
    inputs, never on the host's load or speed)."""
    if what == "cpu":
        return cpu_s
    if what == "wall":
        return wall_s
    return 0.0


def charge_planner(step_s: float, planner_s: float, clock: str) -> float:
    """The step time with planning charged. ``serial``: the planner runs between steps (step +
    planner). ``overlap``: the next step is planned on the host while this one runs, as data
    loaders do, so planning costs time only when it is slower than the step (max of the two).
    ``off``: planning is free (for studies of the plan alone)."""
    if clock == "serial":
        return step_s + planner_s
    if clock == "overlap":
        return max(step_s, planner_s)
    return step_s


def _finite(x: Any) -> float | None:
    if x is None:
        return None
    v = float(x)
    return v if math.isfinite(v) else None


def _median(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    return float(np.median(vals)) if vals else None


def planning_cost(steps: list[StepRecord]) -> PlanningCost:
    """What planning cost the run, warm-up steps included (a launch's tuning happens there):
    the configuration searches booked as offline work (``offline_tune_total_s``), how many steps
    after the first searched again (``retunes``), the longest step's planning, and how many
    steps overran a planning budget the planner declares (``planner_over_budget_steps``)."""
    tunes = [float(s.extra.get("offline_tune_s") or 0.0) for s in steps]
    budget = [(s.planner_ms / 1e3, s.extra.get("planner_budget_s")) for s in steps]
    return PlanningCost(
        offline_tune_total_s=sum(tunes),
        retunes=sum(1 for t in tunes[1:] if t > 0),
        planner_max_ms=max((s.planner_ms for s in steps), default=None),
        planner_over_budget_steps=sum(1 for t, b in budget if b is not None and t > float(b)),
    )


def step_record(
    step: int,
    spec: RunSpec,
    parts: RunParts,
    executor: Executor,
    batch: Any,
    plan: StepPlan,
    planner_s: float,
    out: StepOutcome,
    warmup: bool | None = None,
    planner_cpu_s: float | None = None,
) -> StepRecord:
    """The record of one executed step (see the module docstring); ``warmup`` (None: the step is
    one of the run's first ``warmup_steps``) excludes it from the summary. ``planner_s`` is the
    planning's wall-clock time, ``planner_cpu_s`` its process CPU time (None: unknown, taken as
    the wall time); both are recorded, ``run.planner_time`` says which is charged."""
    used = plan.sample_positions()
    peaks = [float(b) / 2**30 for b in out.peak_mem_bytes]
    cpu_s = planner_s if planner_cpu_s is None else planner_cpu_s
    planning_s = charged_planning(planner_s, cpu_s, spec.planner_time)
    # A planner's configuration search (`plan.info["tune_s"]`: static_tuned's grid, Megatron's
    # launch tuning, in CPU time) is work its users do once before training, not on every step's
    # clock.
    tune_s = min(cpu_s, max(0.0, float(plan.info.get("tune_s") or 0.0)))
    charged_s = max(0.0, planning_s - tune_s) if planning_s else 0.0
    extra: dict[str, Any] = {
        **out.extra,
        "executed_s": out.step_time_s,
        "offline_tune_s": tune_s,
        # planning measured both ways, whatever the clock is charged (run.planner_time)
        "planner_wall_ms": planner_s * 1e3,
        "planner_cpu_ms": cpu_s * 1e3,
        "planner_charged_ms": charged_s * 1e3,
        "rounds": len(plan.rounds),
        "micro_batches": sum(1 for _ in plan.micro_batches()),
        "mem_cap_gib": float(parts.cost.memory_cap_bytes) / 2**30,
        # a planner's own per-step planning budget, where it declares one (flexsp_milp's)
        "planner_budget_s": _finite(plan.info.get("step_time_limit_s")),
        # the bound of the machine: the whole usable memory as the cap (sim.BOUND_ASSUMPTIONS)
        "lower_bound_physical_s": float(physical_lower_bound(batch, parts.cost)),
        "over_cap": bool(peaks and max(peaks) * 2**30 > parts.cost.memory_cap_bytes),
    }
    if executor.measured:
        # The cost model's view of the same plan, beside the measurement: the simulator's error
        # and the memory prediction's error come straight from the record.
        predicted = simulate_step(plan, batch, parts.cost)
        extra["predicted_step_time_s"] = predicted.step_time_s
        extra["predicted_peak_mem_gib"] = predicted.peak_mem_gib
        extra["predicted_peak_mem_per_rank_gib"] = (
            (predicted.peak_mem_bytes / 2**30).round(4).tolist()
        )
    return StepRecord(
        step=step,
        step_time_s=charge_planner(out.step_time_s, charged_s, spec.planner_clock),
        warmup=step < spec.warmup_steps if warmup is None else warmup,
        planner_ms=cpu_s * 1e3,
        tokens=int(batch.tokens[used].sum()) if used else 0,
        samples=len(used),
        samples_dropped=batch.n - len(set(used)) + int(batch.dropped),
        samples_truncated=int(batch.truncated),
        # "skip": a sample no setting fits is the planners' problem (they fail or drop it), not
        # the bound's.
        lower_bound_s=float(lower_bound(batch, parts.cost, infeasible="skip")),
        imbalance=out.imbalance,
        comm_share=_finite(out.comm_share),
        mfu=_finite(out.mfu),
        peak_mem_gib=max(peaks) if peaks else None,
        peak_mem_per_rank_gib=[round(p, 6) for p in peaks],
        busy_s=[round(b, 9) for b in out.busy_s],
        idle_s=[round(i, 9) for i in out.idle_s],
        oom=out.oom,
        loss=_finite(out.loss),
        grad_norm=_finite(out.grad_norm),
        extra=extra,
    )


class _CpuTimed:
    """A plan function that keeps the process CPU time of its last call (``seconds``): the
    executor times the call's wall clock; this, what the planner itself computed. CPU time of the
    whole process, so a planner's solver threads count; other processes' load does not."""

    def __init__(self, plan_fn: Any) -> None:
        self.plan_fn = plan_fn
        self.seconds: float | None = None

    def __call__(self, batch: Any) -> StepPlan:
        t0 = time.process_time()
        try:
            return self.plan_fn(batch)  # type: ignore[no-any-return]
        finally:
            self.seconds = time.process_time() - t0


def run_steps(
    spec: RunSpec,
    parts: RunParts,
    executor: Executor,
    writer: RunWriter,
    started: float,
) -> None:
    """The loop itself, one body for both units: every step `deal_steps` deals is planned by the
    executor (rank 0 plans, every rank receives the plan), executed and recorded. Raises
    `_StopRun` for an early end with a status, `DcpBenchError` for an input or planner error.
    Every executed step is in ``writer`` before anything is raised.

    ``run.unit=epoch`` (the reference runtime's loop): each iteration runs as one step (its own
    barrier, gradient sync and optimizer step) and becomes one `StepRecord`; no iteration is
    excluded; the epoch's planning time is charged by ``run.planner_clock``, spread evenly over
    its iterations; the first record of an epoch carries the epoch's accounting
    (``epoch_info``)."""
    for deal in deal_steps(spec, parts, executor.world_size):
        # Rank 0's clock decides for every rank, so no rank leaves the loop alone.
        late = spec.timeout_s is not None and time.time() - started > spec.timeout_s
        if executor.agree(late):
            raise RunTimeout(f"run exceeded {spec.limit_text()} before {deal.where}")
        batch = deal.batch
        cpu = _CpuTimed(deal.plan_fn)
        plan, planner_s = executor.plan(batch, cpu)
        # a batch-dealing planner's deal is planning too (wall and CPU time)
        planner_s += deal.deal_s
        planner_cpu_s = None if cpu.seconds is None else cpu.seconds + deal.deal_cpu_s
        if deal.planner_s is not None:
            planner_s, planner_cpu_s = deal.planner_s, deal.planner_cpu_s
        out = executor.execute(plan, batch)
        rec = step_record(
            deal.step,
            spec,
            parts,
            executor,
            batch,
            plan,
            planner_s,
            out,
            warmup=deal.warmup,
            planner_cpu_s=planner_cpu_s,
        )
        if deal.epoch is not None:
            rec.extra.update(epoch=deal.epoch, iteration=deal.iteration)
            latent = latent_token_count(parts, batch, plan)
            if latent is not None:
                rec.extra["latent_tokens"] = latent
            if deal.epoch_info is not None:
                rec.extra["epoch_info"] = deal.epoch_info
        writer.add_step(rec)
        if out.oom:
            raise _StopRun("oom", f"{deal.where}: peak memory over the GPU's usable memory")
        if not out.finite:
            raise _StopRun("nonfinite", f"non-finite loss or gradient at {deal.where}")


def _epoch_accounting(spec: RunSpec, measured: list[StepRecord], ok: bool) -> EpochAccounting:
    """The epoch unit's accounting: epochs, iterations, epoch time and tokens (throughput = epoch
    tokens / epoch time: ``tokens_per_s``), the reference's latent-voxel token count beside the
    patch tokens, and each epoch's accounting of dropped samples."""
    total_time = sum(s.step_time_s or 0.0 for s in measured)
    latent = [s.extra.get("latent_tokens") for s in measured]
    infos = [s.extra["epoch_info"] for s in measured if "epoch_info" in s.extra]
    latent_rate = None
    if latent and all(v is not None for v in latent) and ok and total_time > 0:
        latent_rate = sum(float(v) for v in latent if v is not None) / total_time
    return EpochAccounting(
        epochs=spec.epochs,
        epochs_done=len(infos),
        iterations=len(measured),
        epoch_time_s=total_time / max(1, len(infos)) if ok else None,
        epoch_tokens=sum(s.tokens for s in measured) / max(1, len(infos)),
        epoch_info=tuple(infos),
        latent_tokens_per_s=latent_rate,
    )


def run_context(
    spec: RunSpec, status: str, workload: Any, planner_clock: str | None = None
) -> RunContext:
    """What the run was (`RunContext`): label, mode, the comparison it pairs in, how it was asked
    for, the cost-model variant (the scales and the cost-model options that vary a term: they
    select the same cells as the scales), the memory cap and which parameters are away from
    their default, how planning was charged, the noise, the workload's provenance, and whether a
    sweep's deadline (not the run's own ``run.timeout_s``) cut it."""
    documented = isinstance(workload, DocumentedWorkload) and isinstance(workload.provenance, dict)
    noise = spec.noise
    return RunContext(
        label=spec.label,
        mode=spec.mode,
        context_hash=spec.context_hash,
        sweep=spec.sweep,
        overrides=tuple(spec.overrides),
        target=spec.method.target,
        scales={
            **spec.cost.scale_map,
            **{k: v for k, v in spec.cost.options if k in MODEL_VARIANT_OPTIONS},
        },
        mem_cap_fraction=spec.mem_cap_fraction,
        away_from_default=spec.away_from_default,
        planner_clock=spec.planner_clock if planner_clock is None else planner_clock,
        planner_time=spec.planner_time,
        noise=NoiseRecord(noise.jitter_sigma, noise.straggler_prob, noise.straggler_slowdown)
        if noise.active
        else None,
        workload=WorkloadRecord(str(workload.description), dict(workload.provenance))
        if documented
        else None,
        limit="budget" if status == "timeout" and spec.limit_source else None,
    )


def _outcome(measured: list[StepRecord], ok: bool) -> RunOutcome:
    total_time = sum(s.step_time_s or 0.0 for s in measured)
    total_samples = sum(s.samples for s in measured)
    return RunOutcome(
        samples_per_s=(total_samples / total_time) if ok and total_time > 0 else None,
        comm_share=_median([s.comm_share for s in measured]),
        executed_s=_median([s.extra.get("executed_s") for s in measured]),
        over_cap_steps=sum(1 for s in measured if s.extra.get("over_cap")),
        lower_bound_physical_s=_median([s.extra.get("lower_bound_physical_s") for s in measured]),
    )


def _predictions(steps: list[StepRecord], measured: list[StepRecord]) -> Predictions:
    return Predictions(
        step_time_s=_median([s.extra.get("predicted_step_time_s") for s in measured]),
        peak_mem_gib=max(
            (
                s.extra["predicted_peak_mem_gib"]
                for s in steps
                if s.extra.get("predicted_peak_mem_gib") is not None
            ),
            default=None,
        ),
    )


def summarise(
    spec: RunSpec,
    steps: list[StepRecord],
    status: str,
    error: str | None,
    executor: ExecutorInfo,
    cost: CostModel | None,
    started: float,
    workload: Any = None,
) -> RunSummary:
    """The run summary: medians over measured steps; step time and throughput only for a run
    that finished ``ok`` with measured steps (a failed run has no step time: statistics count it
    as infinitely slow). ``workload``: the run's workload, whose description and provenance (data
    file and its SHA-256, source, licence) the summary keeps."""
    measured = [s for s in steps if not s.warmup and s.step_time_s is not None]
    ok = status == "ok" and bool(measured)
    if status == "ok" and not measured:
        status, error = "error", error or "no measured steps"
    total_time = sum(s.step_time_s or 0.0 for s in measured)
    total_tokens = sum(s.tokens for s in measured)
    cost_desc = dict(cost.describe()) if cost is not None else {}
    losses = [s.loss for s in steps]
    return RunSummary(
        run_id=spec.run_id,
        campaign=spec.campaign,
        status=status,  # type: ignore[arg-type]
        executor=spec.executor,
        method=spec.method_name,
        workload=spec.workload_name,
        cluster=spec.cluster.name,
        model=spec.model.name,
        seed=spec.seed,
        config_hash=spec.config_hash,
        n_steps=len(measured),
        n_warmup=sum(1 for s in steps if s.warmup),
        step_time_s=_median([s.step_time_s for s in measured]) if ok else None,
        lower_bound_s=_median([s.lower_bound_s for s in measured]),
        imbalance=_median([s.imbalance for s in measured]),
        peak_mem_gib=max(
            (s.peak_mem_gib for s in steps if s.peak_mem_gib is not None), default=None
        ),
        mfu=_median([s.mfu for s in measured]) if ok else None,
        planner_ms=_median([s.planner_ms for s in measured]),
        tokens_per_s=(total_tokens / total_time) if ok and total_time > 0 else None,
        oom_steps=sum(1 for s in steps if s.oom),
        hardware=executor.hardware,
        cost_source=str(cost.source) if cost is not None else None,
        profile=cost_desc.get("profile") if isinstance(cost_desc.get("profile"), dict) else None,
        error=error,
        started_at=started,
        finished_at=time.time(),
        world_size=executor.world_size,
        context=run_context(spec, status, workload),
        cost_description=CostDescription.from_flat(cost_desc) if cost_desc else None,
        outcome=_outcome(measured, ok),
        training=TrainingCurves(
            losses=tuple(losses),
            grad_norms=tuple(s.grad_norm for s in steps),
            step_times_s=tuple(s.step_time_s for s in steps),
        )
        if any(v is not None for v in losses)
        else None,
        epochs=_epoch_accounting(spec, measured, ok) if spec.unit == "epoch" else None,
        planning=planning_cost(steps),
        predictions=_predictions(steps, measured) if executor.measured else None,
        executor_info=dict(executor.info),
    )


def execute_run(
    spec: RunSpec,
    parts: RunParts | None,
    executor: Executor | None,
    writer: RunWriter,
    started: float | None = None,
    setup_error: BaseException | None = None,
) -> RunSummary:
    """Run the loop and write the summary. Input and planner errors, timeouts, OOM and
    non-finite losses become the run's status. Any other exception becomes status ``error`` on
    a simulated run; on a measured run it propagates (the rank exits, torchrun stops the others,
    and the launcher records the failure). ``setup_error``: assembling the run already failed."""
    started = time.time() if started is None else started
    status, error = "ok", None
    try:
        if setup_error is not None:
            raise setup_error
        assert parts is not None and executor is not None
        run_steps(spec, parts, executor, writer, started)
    except _StopRun as exc:
        status, error = exc.status, str(exc)
    except RunTimeout as exc:
        status, error = "timeout", str(exc)
    except KeyboardInterrupt:
        raise
    except Exception as exc:
        if executor is not None and executor.measured and not isinstance(exc, DcpBenchError):
            raise
        status, error = "error", f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
        if not isinstance(exc, DcpBenchError):
            error += " @ " + traceback.format_exc().strip().splitlines()[-3].strip()[:200]
    desc: ExecutorInfo = executor or described(spec)
    summary = summarise(
        spec,
        writer.steps,
        status,
        error,
        desc,
        parts.cost if parts else None,
        started,
        parts.workload if parts else None,
    )
    return writer.finish(summary)


def described(spec: RunSpec) -> ExecutorDescription:
    """The executor a run names, for a summary written without it."""
    measured = spec.executor == "torch"
    return ExecutorDescription(
        world_size=spec.world_size,
        measured=measured,
        hardware=f"{'' if measured else 'simulated '}{spec.cluster.name}",
    )


def record_unfinished(
    spec: RunSpec, status: str, error: str, started: float, notes: dict[str, Any] | None = None
) -> RunSummary:
    """The summary of a run whose processes ended without writing one (killed at its time
    limit, crashed, killed by the OS), from the steps they did write. The folder is taken over
    first, so a writer of the run that is somehow still alive can no longer write to it."""
    run_dir = Path(spec.root) / spec.campaign / spec.run_id
    if not (run_dir / "config.yaml").exists():
        RunWriter(spec.root, spec.campaign, spec.run_id, dict(spec.config))
    token = take_over(run_dir)
    summary = summarise(spec, read_steps(run_dir), status, error, described(spec), None, started)
    if notes:
        summary = dataclasses.replace(summary, notes={**summary.notes, **notes})
    return write_summary(run_dir, summary, token)
