"""One step's plan, for inspection (what ``dcp-bench plan`` shows): the global batch of one step
of a run (`load_step`), the planner's plan of it, timed and annotated with the batch and the cost
model (`plan_step`), the figures of its summary (`digest`: shape, simulated step time, lower
bound, peak memory), and its check against every plan rule (`check_step_plan`, the offences in
words)."""

from __future__ import annotations

import time
import traceback
from collections import Counter
from dataclasses import dataclass

from dcp_bench.batch import GlobalBatch
from dcp_bench.config import load_config, to_container
from dcp_bench.plan import PLAN_RULES, StepPlan, check_is_plan, plan_offences, validate_plan
from dcp_bench.run.assemble import RunParts, assemble
from dcp_bench.run.spec import RunSpec, parse_run_spec
from dcp_bench.sim import lower_bound, simulate_step


@dataclass(frozen=True)
class StepInput:
    """A run's parts and the global batch of its step ``step``."""

    spec: RunSpec
    parts: RunParts
    batch: GlobalBatch
    step: int


def load_step(overrides: list[str], step: int) -> StepInput:
    """The run the config ``overrides`` compose, assembled, and its global batch of ``step``."""
    spec = parse_run_spec(to_container(load_config(overrides)))
    parts = assemble(spec)
    batch = parts.workload.global_batch(step, spec.world_size, spec.model.max_seq_len)
    return StepInput(spec=spec, parts=parts, batch=batch, step=step)


def _planner_plan(inp: StepInput) -> StepPlan:
    parts = inp.parts
    return check_is_plan(
        parts.planner.plan(inp.batch, parts.plan_cost),
        f"planner {type(parts.planner).__name__}.plan",
    )


@dataclass(frozen=True)
class PlannedStep:
    """The planner's plan of a step and the planner's time in milliseconds."""

    input: StepInput
    plan: StepPlan
    planner_ms: float


def plan_step(inp: StepInput, validate: bool = True) -> PlannedStep:
    """The planner's plan of the step (with ``validate`` checked by the validator, which raises on
    the first offence), its ``info`` carrying the planner's time, the batch and the cost model."""
    t0 = time.perf_counter()
    plan = _planner_plan(inp)
    planner_ms = (time.perf_counter() - t0) * 1e3
    if validate:
        validate_plan(plan, inp.batch, inp.parts.cost)
    batch = inp.batch
    plan.info = {
        **plan.info,
        "planner_ms": planner_ms,
        "batch": {
            "step": batch.step,
            "sample_ids": batch.sample_ids.tolist(),
            "tokens": batch.tokens.tolist(),
            "frames": batch.frames.tolist(),
        },
        "cost_model": inp.parts.cost.describe(),
    }
    return PlannedStep(input=inp, plan=plan, planner_ms=planner_ms)


@dataclass(frozen=True)
class PlanDigest:
    """A plan's shape and its simulated figures (seconds, GiB)."""

    covered_samples: int
    rounds: int
    groups: int
    micro_batches: int
    micro_batches_per_sp: dict[int, int]
    step_time_s: float
    lower_bound_s: float
    peak_mem_gib: float


def digest(planned: PlannedStep) -> PlanDigest:
    """The plan's shape, its simulated step, and the step's lower bound at the memory cap."""
    plan, batch, cost = planned.plan, planned.input.batch, planned.input.parts.cost
    sim = simulate_step(plan, batch, cost)
    sp = Counter(g.size for _, g, _ in plan.micro_batches())
    return PlanDigest(
        covered_samples=len(set(plan.sample_positions())),
        rounds=len(plan.rounds),
        groups=sum(len(r.groups) for r in plan.rounds),
        micro_batches=sum(1 for _ in plan.micro_batches()),
        micro_batches_per_sp=dict(sorted(sp.items())),
        step_time_s=sim.step_time_s,
        lower_bound_s=lower_bound(batch, cost, infeasible="skip"),
        peak_mem_gib=sim.peak_mem_gib,
    )


@dataclass(frozen=True)
class PlanCheck:
    """A plan's check against every plan rule: ``raised`` (the planner's exception and where it was
    raised) when the planner failed, else ``offences`` (empty: a valid plan)."""

    raised: str | None
    offences: list[str]
    rules: int
    memory_cap_gib: float | None  # the cost model's cap the memory rule checked (None: not checked)


def check_step_plan(inp: StepInput) -> PlanCheck:
    """Plan the step and list the plan's offences against every rule (memory under the cap
    included); a planner that raises is reported, not propagated."""
    try:
        plan = _planner_plan(inp)
    except Exception as exc:  # the check reports a planner that fails instead of crashing with it
        where = traceback.extract_tb(exc.__traceback__)[-1]
        return PlanCheck(
            raised=f"{type(exc).__name__}: {exc} ({where.filename}:{where.lineno})",
            offences=[],
            rules=len(PLAN_RULES),
            memory_cap_gib=None,
        )
    offences = plan_offences(plan, inp.batch, inp.parts.cost)
    return PlanCheck(
        raised=None,
        offences=offences,
        rules=len(PLAN_RULES),
        memory_cap_gib=inp.parts.cost.memory_cap_bytes / 2**30,
    )
