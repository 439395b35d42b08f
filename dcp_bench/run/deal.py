"""The one deal: each optimizer step's work, for both units of a run.

`deal_steps` yields one `StepDeal` per optimizer step, in order, and is the only place that
turns a run's workload and planner into steps; the loop (`dcp_bench.run.loop`), the memory
precheck (`dcp_bench.run.memory_precheck`) and anything else that walks a run's steps take them
from here.

- ``run.unit=step``: ``warmup_steps + steps`` global batches, each dealt fresh by the workload
  (``global_batch``: the same for every method at a given seed and step) and planned by the
  planner when the step is executed (`StepDeal.plan_fn` is `RunParts.plan_step`); the first
  ``warmup_steps`` are warm-up. A planner that decides which samples a step trains
  (`BatchDealer`) deals each fresh batch first, in step order.
- ``run.unit=epoch``: the reference runtime's loop. Each of ``run.epochs`` epochs takes the
  workload's fixed dataset (``epoch_dataset``), the planner's reference sampler deals it into
  iterations with their plans (``plan_epoch``), and every iteration is one step: its own batch,
  the plan made by the sampler (validated here), the epoch's planning time spread evenly over
  its iterations; no iteration is warm-up.

Capabilities are the explicit protocols of `dcp_bench.run.capabilities`: the epoch unit needs a
planner with a reference epoch sampler (`EpochSampler`) and a workload with a fixed dataset
(`FixedDataset`); a workload that knows the reference's latent-voxel token count of its samples
(`LatentTokens`) has it recorded beside each iteration.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from dcp_bench.batch import GlobalBatch
from dcp_bench.errors import ConfigError
from dcp_bench.plan import StepPlan, validate_plan
from dcp_bench.run.assemble import RunParts
from dcp_bench.run.capabilities import BatchDealer, EpochSampler, FixedDataset, LatentTokens
from dcp_bench.run.spec import RunSpec


@dataclass(frozen=True)
class StepDeal:
    """One optimizer step's work: its index over the run, the batch, how its plan is made
    (``plan_fn``, called by the executor: rank 0 plans, every rank receives the plan), and, for
    the epoch unit, the planning time already spent on it (``planner_s``; None: the executor
    times ``plan_fn``), its epoch and iteration, and the epoch's accounting on its first
    iteration; ``deal_s``: the time a `BatchDealer` took to deal the batch (planning time too:
    the loop adds it to the timed ``plan_fn``)."""

    step: int
    batch: GlobalBatch
    plan_fn: Callable[[GlobalBatch], StepPlan]
    warmup: bool = False
    planner_s: float | None = None
    planner_cpu_s: float | None = None  # the same planning's process CPU time
    epoch: int | None = None
    iteration: int | None = None
    epoch_info: dict[str, Any] | None = None
    deal_s: float = 0.0
    deal_cpu_s: float = 0.0  # the same in process CPU time

    @property
    def where(self) -> str:
        """The step, for messages: ``step 3`` or ``epoch 0, iteration 2``."""
        if self.epoch is None:
            return f"step {self.step}"
        return f"epoch {self.epoch}, iteration {self.iteration}"


def _planned(plan: StepPlan) -> Callable[[GlobalBatch], StepPlan]:
    """A planning callable that returns a plan made before (the epoch's sampler made them all)."""
    return lambda _batch: plan


def epoch_capabilities(parts: RunParts, spec: RunSpec) -> tuple[EpochSampler, FixedDataset]:
    """The planner's epoch sampler and the workload's fixed dataset (`ConfigError` when either
    lacks the capability)."""
    planner, workload = parts.planner, parts.workload
    if not isinstance(planner, EpochSampler) or not isinstance(workload, FixedDataset):
        raise ConfigError(
            f"run.unit=epoch needs a method with a reference epoch sampler and a workload "
            f"with a fixed dataset ({spec.method_name} on {spec.workload_name})"
        )
    return planner, workload


def deal_steps(spec: RunSpec, parts: RunParts, world_size: int) -> Iterator[StepDeal]:
    """Every optimizer step of the run ``spec`` describes, in order (see the module docstring).
    Lazy: a step's batch (and an epoch's sampling) is made when the step is reached."""
    if spec.unit == "epoch":
        yield from _epoch_deals(spec, parts, world_size)
        return
    for step in range(spec.total_steps):
        batch = parts.workload.global_batch(step, world_size, spec.model.max_seq_len)
        deal_s = deal_cpu_s = 0.0
        if isinstance(parts.planner, BatchDealer):
            t0, c0 = time.perf_counter(), time.process_time()
            batch = parts.planner.deal_batch(batch, parts.plan_cost)
            deal_s = time.perf_counter() - t0
            deal_cpu_s = time.process_time() - c0
        yield StepDeal(
            step=step,
            batch=batch,
            plan_fn=parts.plan_step,
            warmup=step < spec.warmup_steps,
            deal_s=deal_s,
            deal_cpu_s=deal_cpu_s,
        )


def _epoch_deals(spec: RunSpec, parts: RunParts, world_size: int) -> Iterator[StepDeal]:
    sampler, data = epoch_capabilities(parts, spec)
    step = 0
    for epoch in range(spec.epochs):
        dataset = data.epoch_dataset(world_size, spec.model.max_seq_len)
        t0, c0 = time.perf_counter(), time.process_time()
        deal = sampler.plan_epoch(dataset, parts.plan_cost, epoch)
        share = (time.perf_counter() - t0) / max(1, len(deal.iterations))
        cpu_share = (time.process_time() - c0) / max(1, len(deal.iterations))
        if not deal.iterations:
            drops = ", ".join(
                f"{k} {v}" for k, v in deal.info.get("dropped_samples", {}).items() if v
            )
            raise ConfigError(
                f"epoch {epoch}: the sampler dealt no iteration from the dataset's {dataset.n} "
                f"samples (dropped: {drops or 'none'}); expected buckets of at least one batch "
                "each (a larger workload.data_size)"
            )
        for i, it in enumerate(deal.iterations):
            sub = dataset.subset(it.positions)
            batch = dataclasses.replace(sub, step=step, info={"epoch": epoch, "iteration": i})
            validate_plan(
                it.plan, batch, num_layers=parts.cost.model.num_layers, model=parts.cost.model
            )
            info = {**deal.info, "planner_s": share * len(deal.iterations)} if i == 0 else None
            yield StepDeal(
                step=step,
                batch=batch,
                plan_fn=_planned(it.plan),
                planner_s=share,
                planner_cpu_s=cpu_share,
                epoch=epoch,
                iteration=i,
                epoch_info=info,
            )
            step += 1


def latent_token_count(parts: RunParts, batch: GlobalBatch, plan: StepPlan) -> int | None:
    """The reference's latent-voxel tokens of the samples ``plan`` trains (None when the workload
    does not know them)."""
    if not isinstance(parts.workload, LatentTokens):
        return None
    lat = parts.workload.latent_tokens(batch.sample_ids)
    if lat is None:
        return None
    return int(np.asarray(lat)[plan.sample_positions()].sum())
