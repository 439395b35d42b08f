"""Assembly: from a `RunSpec`, the parts of a run, each built exactly once and the same way for
every command and executor: the workload (seeded by the run's seed), the cost model that prices
plans, the cost model planners see, the planner (seeded), and the simulator's noise model."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dcp_bench.batch import GlobalBatch
from dcp_bench.cost import make_cost_model
from dcp_bench.cost.analytical import AnalyticalCostModel
from dcp_bench.cost.base import CostModel
from dcp_bench.plan import StepPlan, check_is_plan, validate_plan
from dcp_bench.planners.base import Planner, make_planner
from dcp_bench.run.capabilities import StepWorkload
from dcp_bench.run.spec import RunSpec
from dcp_bench.sim import NoiseModel
from dcp_bench.workloads import make_workload


@dataclass
class RunParts:
    """What a run is made of. ``cost`` prices plans (the simulator, the predictions beside measured
    runs, the lower bound); ``plan_cost`` is what the planner sees (the same object unless
    ``cost.planner_source`` names another source)."""

    workload: StepWorkload  # global_batch(step, world_size, max_seq_len); more: run/capabilities.py
    cost: CostModel
    plan_cost: CostModel
    planner: Planner
    noise: NoiseModel | None = None

    def plan_step(self, batch: GlobalBatch) -> StepPlan:
        """The planner's plan of ``batch``, checked by the validator (structure, coverage and
        checkpoint settings: a plan that breaks them never reaches an executor)."""
        plan = check_is_plan(
            self.planner.plan(batch, self.plan_cost), f"planner {type(self.planner).__name__}.plan"
        )
        validate_plan(plan, batch, num_layers=self.cost.model.num_layers, model=self.cost.model)
        return plan


Assemble = Callable[[RunSpec], RunParts]


def build_cost_model(spec: RunSpec, source: str | None = None) -> CostModel:
    """The cost model of the run's model on its cluster: ``cost.source`` (or ``source``), the
    profile, the sensitivity scales (analytical source only) and constructor options."""
    options = spec.cost.constructor_options()

    def build(**extra: Any) -> CostModel:
        return make_cost_model(
            spec.model,
            spec.cluster,
            source=source or spec.cost.source,
            mem_cap_fraction=spec.mem_cap_fraction,
            profile=spec.cost.profile,
            scales=spec.cost.scale_map or None,
            **options,
            **extra,
        )

    cost = build()
    # Paper mode prices the reference's own training loop (`dcp_bench.cost.reference_loop`) where
    # the source is analytical (a profile measures this suite's runtime), unless the run names a
    # loop itself (`+cost.loop=...`).
    if spec.mode == "paper" and "loop" not in options and isinstance(cost, AnalyticalCostModel):
        cost = build(loop="reference")
    return cost


def assemble(spec: RunSpec) -> RunParts:
    """Build every part of the run ``spec`` describes (see the module docstring)."""
    cost = build_cost_model(spec)
    planner_source = spec.cost.planner_source
    plan_cost = (
        build_cost_model(spec, planner_source)
        if planner_source and planner_source != spec.cost.source
        else cost
    )
    noise = None
    if spec.noise.active:
        noise = NoiseModel(
            seed=spec.seed,
            jitter_sigma=spec.noise.jitter_sigma,
            straggler_prob=spec.noise.straggler_prob,
            straggler_slowdown=spec.noise.straggler_slowdown,
        )
    return RunParts(
        workload=make_workload(spec.workload, seed=spec.seed),
        cost=cost,
        plan_cost=plan_cost,
        planner=make_planner(spec.method, seed=spec.seed),
        noise=noise,
    )
